"""thunderplug: plugin-based executors for lightning-thunder, with tensor-subclass support.

import thunder, thunderplug
jitted = thunder.jit(model, executors=thunderplug.discover())
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from thunderplug import moved
from thunderplug.host.discovery import DuplicateRegistrationError, InvalidRegistrationError, PluginHost, default_host
from thunderplug.plugin_api.hookspecs import hookimpl
from thunderplug.plugin_api.notices import RecompileWarning, ThunderplugWarning
from thunderplug.plugin_api.report import PluginStatus, Status
from thunderplug.plugin_api.specs import (
    AtenKernelClaim,
    AtenOp,
    Claim,
    ExecutorSpec,
    FunctionClaim,
    FusionFilter,
    Priority,
    Stage,
    SubclassOpClaim,
)
from thunderplug.plugin_api.version import __version__

if TYPE_CHECKING:
    from thunder.extend import Executor

__all__ = [
    "AtenKernelClaim",
    "AtenOp",
    "Claim",
    "DuplicateRegistrationError",
    "ExecutorSpec",
    "FunctionClaim",
    "FusionFilter",
    "InvalidRegistrationError",
    "PluginHost",
    "PluginStatus",
    "Priority",
    "RecompileWarning",
    "Stage",
    "Status",
    "SubclassOpClaim",
    "ThunderplugWarning",
    "__version__",
    "discover",
    "hookimpl",
    "report",
]
from thunderplug import recipe as _recipe

moved.install()  # old module paths (thunderplug.settings, thunderplug.regions, ...) still import

_recipe.register()  # thunder.compile(model, recipe="thunderplug") and plugins="thunderplug"


def discover(
    *,
    only: list[str] | None = None,
    exclude: list[str] | None = None,
    include_defaults: bool = True,
    quiet: bool = False,
    host: PluginHost | None = None,
) -> list[Executor]:
    """Executors from every installed, available plugin, ready for ``thunder.jit(executors=...)``.

    Ordered by declared priority then name, never by install order (thunderplug's own executors
    come first); thunder's own default executors follow when ``include_defaults``.
    ``only``/``exclude`` take plugin or executor names. Each broken plugin (invalid, failed, conflict) is warned
    about once per process (``ThunderplugWarning``; ``quiet=True`` or ``THUNDERPLUG_QUIET=1``
    silences that); one that cannot run here is only listed, as unavailable, by ``report()``.
    """
    from thunderplug.host.executors import assemble_executors  # imports thunder
    from thunderplug.wiring import patches

    patches.install()
    return assemble_executors(
        host or default_host(), only=only, exclude=exclude or (), include_defaults=include_defaults, quiet=quiet
    )


def report() -> list[PluginStatus]:
    """The status of every plugin, thunderplug's own included: active, disabled, unavailable,
    invalid, failed or conflict."""
    return default_host().report()
