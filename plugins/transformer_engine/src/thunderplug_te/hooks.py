"""Entry point of the Transformer Engine plugin.

TE is only ever imported after CUDA and the package are known to be present: with TE installed
on a CPU machine, importing it (and thunder 0.2.6's own TE executor) fails.
"""

from __future__ import annotations

from thunderplug import hookimpl
from thunderplug.plugin_api.availability import cuda_unavailable_reason, missing_package_reason


@hookimpl
def unavailable_reason() -> str | None:
    return cuda_unavailable_reason() or missing_package_reason(
        "transformer_engine", "pip install 'thunderplug-te[te]' on a CUDA machine"
    )
