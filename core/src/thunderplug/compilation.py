"""What thunderplug learns while compiling one function, owned by that compilation.

thunder keeps one ``CompileData`` per ``thunder.jit`` result; each compilation's record hangs off
it (weakly), so nothing about one function lives in a process global keyed by names that repeat
(proxy names such as ``t_0`` do repeat across functions). ``explain`` reads the record of the
function it is given; error messages read the record of the compilation in progress.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from thunderplug.specs import Stage


@dataclass(frozen=True)
class Decision:
    """One answer of a claim's checker: accepted (``reason is None``) or declined, and why."""

    executor: str
    stage: Stage
    target: str
    reason: str | None


@dataclass
class CompilationRecord:
    """Per-compilation facts: who decided what, and where in the user's code each op came from."""

    decisions: list[Decision] = field(default_factory=list)
    #: (op display name, input proxy names) -> " (at file:line)" of the user's call
    source_locations: dict[tuple[str, tuple[str, ...]], str] = field(default_factory=dict)
    #: op names that ran through the generic fallback (no plugin registered them)
    fallbacks: set[str] = field(default_factory=set)

    def decide(self, decision: Decision) -> None:
        self.decisions.append(decision)

    def location_of(self, display: str, inputs: tuple[str, ...]) -> str:
        """Where the user called the op ``display`` on ``inputs``. Autodiff renames proxies, so
        when the names no longer match, every line of this compilation that called the op."""
        exact = self.source_locations.get((display, inputs))
        if exact:
            return exact
        lines = sorted({loc.strip()[4:-1] for (name, _), loc in self.source_locations.items() if name == display})
        return f" (at {' or '.join(lines)})" if lines else ""

    def latest_decision(self, executor: str, target: str) -> Decision | None:
        return next((d for d in reversed(self.decisions) if d.executor == executor and d.target == target), None)


_records: weakref.WeakKeyDictionary[Any, CompilationRecord] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def record_for(compile_data: Any) -> CompilationRecord:
    """The record of the compilation that ``compile_data`` (thunder's ``CompileData``) belongs to."""
    with _lock:
        record = _records.get(compile_data)
        if record is None:
            record = _records[compile_data] = CompilationRecord()
        return record


def current_record() -> CompilationRecord | None:
    """The record of the compilation in progress on this thread, if any."""
    from thunder.core.compile_data import get_compile_data

    compile_data = get_compile_data()
    return None if compile_data is None else record_for(compile_data)


def record_of(jitted: Any) -> CompilationRecord:
    """The record of a ``thunder.jit`` function or module (empty before its first call)."""
    import thunder

    return record_for(thunder.compile_data(jitted))
