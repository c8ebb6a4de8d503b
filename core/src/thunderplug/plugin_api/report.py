"""What happened to each plugin: the record behind ``report()`` and ``thunderplug plugins``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class Status(str, Enum):
    ACTIVE = "active"  #: loaded, available, hooks ran
    DISABLED = "disabled"  #: blocked by THUNDERPLUG_PLUGINS / THUNDERPLUG_DISABLE; never imported
    UNAVAILABLE = "unavailable"  #: cannot run here (missing package or shared library, no CUDA)
    INVALID = "invalid"  #: not a valid plugin (a misspelled hook, a registration of the wrong type)
    FAILED = "failed"  #: a hook or executor factory raised
    CONFLICT = "conflict"  #: registers a name an earlier plugin already provides; skipped

    def __str__(self) -> str:
        return self.value


@dataclass
class PluginStatus:
    name: str
    status: Status
    reason: str | None = None
    distribution: str | None = None
    version: str | None = None
    #: where the hooks live: ``package.module`` (entry point value) or ``module:Class``
    module: str | None = None
    #: hook names this plugin implements
    hooks: list[str] = field(default_factory=list)
    executors: list[str] = field(default_factory=list)
    #: executors the plugin offers that cannot run here, with the reason
    unavailable_executors: dict[str, str] = field(default_factory=dict)
    aten_ops: int = 0
    #: registered by thunderplug itself (DEFAULT_PLUGINS), not through an entry point
    builtin: bool = False

    @property
    def provider(self) -> str:
        """``name (distribution version)``, how messages name a plugin."""
        dist = " ".join(part for part in (self.distribution, self.version) if part) or "no distribution"
        return f"{self.name!r} ({dist})"

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        record["status"] = self.status.value
        return record


def format_table(statuses: list[PluginStatus]) -> str:
    """A plain-text table, one plugin per row, then each plugin's hooks and, if not active, why."""
    headers = ("name", "distribution", "version", "status", "executors", "module")
    rows = [
        (s.name, s.distribution or "-", s.version or "-", s.status.value, ",".join(s.executors) or "-", s.module or "-")
        for s in statuses
    ]
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [headers, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    name_width = max(len(s.name) for s in statuses) if statuses else 0
    lines += ["", "hooks:"]
    lines += [f"  {s.name:<{name_width}}  {', '.join(s.hooks) or '-'}" for s in statuses]
    notes = [(s.name, note) for s in statuses for note in _notes(s)]
    if notes:
        lines += ["", "why:"]
        lines += [f"  {name:<{name_width}}  {note}" for name, note in notes]
    return "\n".join(lines)


@dataclass(frozen=True)
class ExecutorEntry:
    """One executor of ``discover()``'s list, as ``thunderplug plugins`` shows it."""

    name: str
    #: ``"plugin aten_ops"``, ``"thunderplug (built in)"`` or, for thunder's own defaults, ``"thunder"``
    provided_by: str
    priority: int | None
    description: str
    #: ``"<claim target>: shadowed by ...; set priority=..."`` for each claim of this executor that never runs
    shadowed: tuple[str, ...] = ()


def format_executor_order(entries: list[ExecutorEntry]) -> str:
    """discover()'s list, numbered, with who provides each executor and what it does."""
    headers = ("#", "executor", "provided by", "priority", "description")
    rows = [
        (str(i), e.name, e.provided_by, "-" if e.priority is None else str(e.priority), e.description or "-")
        for i, e in enumerate(entries, 1)
    ]
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows)]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [headers, *rows]]
    shadowed = [(e.name, note) for e in entries for note in e.shadowed]
    if shadowed:
        lines += ["", "shadowed claims (they never run):"]
        lines += [f"  {name}: {note}" for name, note in shadowed]
    return "\n".join(lines)


def _notes(status: PluginStatus) -> list[str]:
    notes = [f"{status.status.value}: {status.reason}"] if status.reason else []
    if status.status is Status.ACTIVE:
        notes += [f"executor {name} unavailable: {why}" for name, why in status.unavailable_executors.items()]
    return notes
