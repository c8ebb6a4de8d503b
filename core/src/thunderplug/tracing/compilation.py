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

from thunder.core.prims import PrimIDs
from thunder.core.proxies import TensorProxy

from thunderplug.plugin_api.specs import Stage
from thunderplug.tracing.fake import note_permuted_layout


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
    #: names of the interpreted program's inputs (parameters among them) and of views of them:
    #: the caller keeps these alive, so a backward reading one keeps no extra memory
    alive: set[str] = field(default_factory=set)
    #: the compilations shared with modules of the same structure (``thunderplug.caching.reuse``): those it
    #: offered, then those of other modules it ran
    shared: list[Any] = field(default_factory=list)
    #: where tracing met an op with a data-dependent output shape (`` x[mask] (at file:line)``) and the
    #: ``thunder.jit`` compilations of the graphs around it (``thunderplug.wiring.graph_breaks``)
    graph_break: str = ""
    graph_parts: list[Any] = field(default_factory=list)
    _alive_in: Any = None  # a weak reference to the trace ``alive`` describes
    _alive_scanned: int = 0

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

    def note_alive(self, trace: Any) -> None:
        """Extend ``alive`` from the interpretation trace's bound symbols not seen yet (a new trace
        starts afresh): a value made from a real input tensor has a provenance ``history``; a view
        of an alive value is alive. Permutations' layouts are noted on the way (``fake``)."""
        if self._alive_in is None or self._alive_in() is not trace:
            self.alive, self._alive_in, self._alive_scanned = set(), weakref.ref(trace), 0
        bound_symbols = trace.bound_symbols
        for bsym in bound_symbols[self._alive_scanned :]:
            tensors = [p for p in bsym.flat_proxy_args if isinstance(p, TensorProxy)]
            self.alive.update(p.name for p in tensors if getattr(p, "history", None) is not None)
            if only_views(bsym) and tensors and all(p.name in self.alive for p in tensors):
                self.alive.update(o.name for o in bsym.flat_proxy_outs)
            note_permuted_layout(bsym)
        self._alive_scanned = len(bound_symbols)

    def latest_decision(self, executor: str, target: str) -> Decision | None:
        return next((d for d in reversed(self.decisions) if d.executor == executor and d.target == target), None)


_VIEW_PRIMS = frozenset(
    {PrimIDs.BROADCAST_IN_DIM, PrimIDs.RESHAPE, PrimIDs.SLICE, PrimIDs.SQUEEZE, PrimIDs.TRANSPOSE, PrimIDs.VIEW}
)


def only_views(bsym: Any) -> bool:
    """Whether ``bsym`` (``x.t()``, ``x.view(...)``) decomposes into view prims only."""
    if bsym.sym.id in _VIEW_PRIMS:
        return True
    return bool(bsym.subsymbols) and all(only_views(sub) for sub in bsym.subsymbols)


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
