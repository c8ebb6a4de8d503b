"""Replaying an unrolled graph again without re-running ATen decompositions: the bound symbols one
replay recorded, copied onto new input proxies with fresh names for everything they compute.

A graph is replayed for every call of its op: in interpretation, again when autodiff re-emits the
forward, and for every layer with the same shapes. Each replay calls every ATen symbol, whose meta
runs the op's decomposition into prims: most of the cost of a replay. The bound symbols of one
replay depend only on the graph and its inputs' metadata, so the first replay's are kept as a
:class:`Recording` and later replays with the same key copy them: same symbols, same constants,
same nesting, every proxy they produce renamed in the trace being built. What calling an ATen
symbol records in the compilation (fallback use, the user's line of an op without derivative) is
recorded again for every copy (``aten.note_call``).

A copy leaves out the decomposition (prims) of an ATen op that the compilation will run as itself
(:func:`runs_whole`): nothing would run or fuse it, and at the depth of a float8 GPT those
decompositions were half of what a compilation allocates (issue 14's first-step memory).

Recordings are not made for graphs with random ops (two draws must stay two ops, with their own
state) or for bound symbols holding anything but plain tensor proxies, numbers and containers.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from thunder.core import devices, dtypes
from thunder.core.compile_data import get_compile_data
from thunder.core.proxies import Proxy, TensorProxy
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx
from thunder.extend import OperatorExecutor

from thunderplug.caching import dynamic_sizes
from thunderplug.thunder_compat import bound_symbol_context, claiming_executor
from thunderplug.tracing.aten import is_registered_symbol, note_call, records_calls
from thunderplug.tracing.compilation import only_views
from thunderplug.tracing.fake import hashable_or_none, value_key
from thunderplug.tracing.trace_state import ambient_key


@dataclass(frozen=True)
class Recording:
    """The bound symbols one replay of a graph added to the trace, its inputs and its outputs."""

    inputs: tuple[str, ...]  # names of the input proxies, in placeholder order
    bsyms: tuple[BoundSymbol, ...]  # copies: passes mutate the trace's own (tags, pruned subsymbols)
    produced: tuple[tuple[TensorProxy, frozenset], ...]  # every proxy they create (any depth), its tags then
    outputs: tuple[Any, ...]  # the graph's outputs: proxies (by name) or constants
    notes: bool  # some symbol records something in the compilation when called
    #: per bound symbol: may a copy leave out its decomposition where an operator runs it (:func:`_droppable`)
    droppable: tuple[bool, ...]
    #: which of ``bsyms`` are copied shallow -> names of the proxies such copies show (computed once each)
    visible: dict[tuple[bool, ...], frozenset[str]] = field(default_factory=dict, compare=False)


_CONSTANTS = (bool, int, float, complex, str, slice, dtypes.dtype, devices.Device, torch.dtype, torch.device,
              torch.memory_format, torch.layout)

_recordings: weakref.WeakKeyDictionary[torch.fx.GraphModule, dict[Any, Recording]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def replay_key(leaves: list[TensorProxy]) -> Any:
    """What a replay's bound symbols depend on besides the graph: the inputs' metadata and the torch
    state (``trace_state.ambient_key``: grad mode, as thunder tags outputs of symbols called under
    ``no_grad``; the default dtype of factory ops; ...), or ``None``. Replays run with autocast off."""
    return hashable_or_none(lambda: (ambient_key(), tuple(_leaf_key(leaf) for leaf in leaves)))


def _leaf_key(leaf: TensorProxy) -> Any:
    """A graph traced on symbolic sizes is one compilation's (``unroll``), so its recordings are keyed by
    its leaves' size expressions."""
    return dynamic_sizes.symbolic_value_key(leaf) if dynamic_sizes.tracked(leaf) else value_key(leaf)


def recorded(graph: torch.fx.GraphModule, key: Any) -> Recording | None:
    if key is None:
        return None
    with _lock:
        return _recordings.get(graph, {}).get(key)


def record(
    graph: torch.fx.GraphModule, key: Any, leaves: list[TensorProxy], bsyms: list[BoundSymbol], outputs: list[Any]
) -> None:
    """Keep what one replay of ``graph`` recorded, if it can be copied safely."""
    if key is None or _has_random_ops(graph):
        return
    inputs = {leaf.name for leaf in leaves}
    produced: dict[str, TensorProxy] = {}
    if not all(_collect(bsym, inputs, produced) for bsym in bsyms):
        return
    known = inputs | produced.keys()
    if not all(_plain(o) and (not isinstance(o, Proxy) or o.name in known) for o in outputs):
        return
    notes = any(_any_bsym(bsym, lambda b: records_calls(b.sym)) for bsym in bsyms)
    same = {name: proxy for name, proxy in produced.items()} | {leaf.name: leaf for leaf in leaves}
    copies = tuple(_copy(bsym, same, None) for bsym in bsyms)
    tagged = tuple((proxy, frozenset(proxy.tags)) for proxy in produced.values())
    droppable = tuple(_droppable(bsym) for bsym in copies)
    recording = Recording(tuple(leaf.name for leaf in leaves), copies, tagged, tuple(outputs), notes, droppable)
    with _lock:
        _recordings.setdefault(graph, {}).setdefault(key, recording)


def copy_into(recording: Recording, trace: TraceCtx, leaves: list[TensorProxy]) -> tuple[list[BoundSymbol], list]:
    """The recording's bound symbols on ``leaves``, with fresh proxies in ``trace``, and its outputs.
    ATen ops the compilation runs as themselves are copied without their decompositions."""
    shallow = tuple(droppable and runs_whole(bsym) for bsym, droppable in zip(recording.bsyms, recording.droppable))
    visible = recording.visible.get(shallow)
    if visible is None:
        visible = recording.visible.setdefault(shallow, _visible_names(recording, shallow))
    names: dict[str, Any] = dict(zip(recording.inputs, leaves))
    for proxy, tags in recording.produced:
        if proxy.name in visible:
            names[proxy.name] = proxy.replace(name=None, tags=set(tags))  # a fresh name in the current trace
    stamp = bound_symbol_context(trace)
    bsyms = [_copy(bsym, names, stamp, deep=not flat) for bsym, flat in zip(recording.bsyms, shallow)]
    if recording.notes:
        for bsym in bsyms:
            _any_bsym(bsym, _note)
    return bsyms, [_swap(o, names) for o in recording.outputs]


def runs_whole(bsym: BoundSymbol) -> bool:
    """Whether the compilation in progress will run ``bsym`` as itself, so that its decomposition is
    never read: the executor thunder's claiming pass gives it to is an operator executor (a fuser
    first in line fuses the prims instead), and no user transform of the compilation may look inside."""
    compile_data = get_compile_data()
    if compile_data is None or compile_data.transforms:
        return False
    return isinstance(claiming_executor(bsym, compile_data.executors_list), OperatorExecutor)


def _droppable(bsym: BoundSymbol) -> bool:
    """Whether a copy of ``bsym`` may leave out its decomposition where :func:`runs_whole`, whatever
    the executors: a registered ATen op, not a view (the compilation record reads view prims to know
    what is a view of an input), and with no call recorded inside its decomposition
    (``aten.note_call``; a call of the op itself is noted on its copy)."""
    if not is_registered_symbol(bsym.sym) or only_views(bsym):
        return False
    return not any(_any_bsym(sub, lambda b: records_calls(b.sym)) for sub in bsym.subsymbols)


def _visible_names(recording: Recording, shallow: tuple[bool, ...]) -> frozenset[str]:
    """Names of the proxies the copies show when the bound symbols marked in ``shallow`` are copied
    without subsymbols: the inner values of left-out decompositions get no fresh proxy."""
    found = [p.name for p in _proxies(recording.outputs)]
    for bsym, flat in zip(recording.bsyms, shallow):
        for shown in [bsym] if flat else _tree(bsym):
            found += [p.name for p in _proxies((shown.args, shown.kwargs, shown.output))]
    return frozenset(found)


def _tree(bsym: BoundSymbol) -> list[BoundSymbol]:
    return [bsym, *(b for sub in bsym.subsymbols for b in _tree(sub))]


def _note(bsym: BoundSymbol) -> bool:
    if records_calls(bsym.sym):
        note_call(bsym.sym, bsym.args, bsym.kwargs)
    return False  # visit every bound symbol


def _copy(
    bsym: BoundSymbol, names: dict[str, Any], stamp: tuple[str, Any, Any] | None, *, deep: bool = True
) -> BoundSymbol:
    """A new bound symbol tree with proxies swapped by ``names`` (and the user's source line of
    ``stamp``, else the original's); without subsymbols unless ``deep``."""
    where = {} if stamp is None else dict(zip(("header", "source_filename", "source_positions"), stamp))
    return bsym.from_bsym(
        args=_swap(bsym.args, names),
        kwargs=_swap(bsym.kwargs, names),
        output=_swap(bsym.output, names),
        subsymbols=[_copy(sub, names, stamp) for sub in bsym.subsymbols] if deep else [],
        **where,
    )


def _swap(value: Any, names: dict[str, Any]) -> Any:
    """``value`` with every proxy replaced by its counterpart (looked up once: no chains)."""
    if isinstance(value, Proxy):
        return names[value.name]
    if isinstance(value, tuple):
        return tuple(_swap(v, names) for v in value)
    if isinstance(value, list):
        return [_swap(v, names) for v in value]
    if isinstance(value, dict):
        return {k: _swap(v, names) for k, v in value.items()}
    return value


def _plain(value: Any) -> bool:
    """Tensor proxies, constants and built-in containers of them: what ``_swap`` copies exactly."""
    if isinstance(value, Proxy):
        return type(value) is TensorProxy
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(v) for v in value.values())
    return value is None or value is Ellipsis or isinstance(value, _CONSTANTS)


def _collect(bsym: BoundSymbol, known: set[str], produced: dict[str, TensorProxy]) -> bool:
    """Add the proxies ``bsym`` (and its subsymbols) produce; ``False`` if it holds anything
    ``_swap`` cannot copy, or reads a proxy that is neither an input nor produced before."""
    if not (_plain(bsym.args) and _plain(bsym.kwargs) and _plain(bsym.output)):
        return False
    readable = known | produced.keys()
    if any(p.name not in readable for p in _proxies((bsym.args, bsym.kwargs))):
        return False
    inner_known = readable | {p.name for p in _proxies((bsym.args, bsym.kwargs))}
    for sub in bsym.subsymbols:
        if not _collect(sub, inner_known, produced):
            return False
        inner_known = inner_known | produced.keys()
    for proxy in _proxies(bsym.output):
        if proxy.name not in known:
            produced.setdefault(proxy.name, proxy)
    return True


def _proxies(value: Any) -> list[TensorProxy]:
    if isinstance(value, Proxy):
        return [value]  # type: ignore[list-item]
    if isinstance(value, (tuple, list)):
        return [p for v in value for p in _proxies(v)]
    if isinstance(value, dict):
        return [p for v in value.values() for p in _proxies(v)]
    return []


def _any_bsym(bsym: BoundSymbol, predicate: Callable[[BoundSymbol], bool]) -> bool:
    return predicate(bsym) or any(_any_bsym(sub, predicate) for sub in bsym.subsymbols)


def _has_random_ops(graph: torch.fx.GraphModule) -> bool:
    return any(
        node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and torch.Tag.nondeterministic_seeded in node.target.tags
        for node in graph.graph.nodes
    )
