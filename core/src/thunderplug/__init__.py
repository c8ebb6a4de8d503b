"""thunderplug: plugin-based executors for lightning-thunder, with tensor-subclass support.

    import thunder, thunderplug
    jitted = thunder.jit(model, executors=thunderplug.discover())
"""

from __future__ import annotations

from typing import Any

from thunderplug.discovery import DuplicateRegistrationError, PluginHost, default_host
from thunderplug.hookspecs import hookimpl
from thunderplug.report import PluginStatus, Status
from thunderplug.specs import AtenOp, Claim, ExecutorSpec, Priority, Stage

__all__ = [
    "AtenOp",
    "Claim",
    "DuplicateRegistrationError",
    "ExecutorSpec",
    "PluginHost",
    "PluginStatus",
    "Priority",
    "Stage",
    "Status",
    "discover",
    "hookimpl",
    "report",
]
__version__ = "0.1.0"


def discover(
    *,
    only: list[str] | None = None,
    exclude: list[str] | None = None,
    include_defaults: bool = True,
    host: PluginHost | None = None,
) -> list[Any]:
    """Executors from every installed, available plugin, ready for ``thunder.jit(executors=...)``.

    Ordered by declared priority then name, never by install order; thunder's own default
    executors follow when ``include_defaults``. ``only``/``exclude`` take plugin or executor names.
    """
    from thunderplug.executors import assemble_executors  # imports thunder

    return assemble_executors(host or default_host(), only=only, exclude=exclude or (), include_defaults=include_defaults)


def report() -> list[PluginStatus]:
    """The status of every installed plugin: active, disabled, unavailable, invalid or failed."""
    return default_host().report()
