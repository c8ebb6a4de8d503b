"""Entry point of the float8 plugin."""

from __future__ import annotations

from thunderplug import hookimpl
from thunderplug.availability import missing_package_reason


@hookimpl
def unavailable_reason() -> str | None:
    return missing_package_reason("torchao", "pip install torchao==0.14.1")
