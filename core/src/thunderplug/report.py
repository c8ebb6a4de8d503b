"""What happened to each plugin: the record behind ``report()`` and ``thunderplug plugins``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum


class Status(str, Enum):
    ACTIVE = "active"  #: loaded, available, hooks ran
    DISABLED = "disabled"  #: blocked by THUNDERPLUG_PLUGINS / THUNDERPLUG_DISABLE; never imported
    UNAVAILABLE = "unavailable"  #: cannot run here (missing package or shared library, no CUDA)
    INVALID = "invalid"  #: not a valid plugin (e.g. a misspelled hook name)
    FAILED = "failed"  #: a hook or executor factory raised


@dataclass
class PluginStatus:
    name: str
    status: Status
    reason: str | None = None
    distribution: str | None = None
    version: str | None = None
    executors: list[str] = field(default_factory=list)
    aten_ops: int = 0

    def to_json(self) -> dict:
        record = asdict(self)
        record["status"] = self.status.value
        return record


def format_table(statuses: list[PluginStatus]) -> str:
    """A plain-text table, one plugin per row, for terminals and logs."""
    headers = ("name", "distribution", "version", "status", "executors", "reason")
    rows = [
        (
            s.name,
            s.distribution or "-",
            s.version or "-",
            s.status.value,
            ",".join(s.executors) or "-",
            s.reason or "",
        )
        for s in statuses
    ]
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [headers, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
