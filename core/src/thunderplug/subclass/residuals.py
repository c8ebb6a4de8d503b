"""Letting a backward reuse what its forward computed, instead of computing it again.

A subclass op's backward is traced from the op's inputs and the cotangents (``autodiff.vjp_of``),
so what it derives from the inputs alone runs again in the backward: torchao's float8 Linear
casts its saved input and weight to float8 again there, the same casts its forward just did,
and ``exp``'s backward recomputes ``exp(x)``. thunder's CSE never merges an expression of the
backward with one of the forward (its right-hand sides include the BACKWARD tag), so the part of
the backward that reads no cotangent joins the forward op here. After unrolling, CSE keeps one
copy of what both compute, and the backward reads the forward's value (AOTAutograd's partitioner
does the same on its joint graph). What CSE does not merge is needed by no forward output, so
thunder's split puts it back into the backward.

The move is made only where the values the backward would then read take no more bytes than the
inputs it read before (float8 data instead of the float32 input it was cast from); inputs the
caller keeps alive anyway (parameters, the program's inputs, views of them) count nothing, so a
weight's float8 copy is kept only where it comes with a larger saving on activations; its
one-element amax and scale are always kept (a few bytes for a reduction over the weight). Nothing
random, mutating or communicating is moved; nothing at all where a cotangent is a subclass (its
backward may be traced again once the real type is known, which needs the original inputs) or
where another executor has an implementation of either op.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from thunder.core.proxies import Proxy, TensorProxy
from thunder.core.symbol import BoundSymbol, Symbol

from thunderplug.caching import dynamic_sizes
from thunderplug.subclass.values import SubclassTensorProxy, subclass_flatten, subclass_op_id
from thunderplug.tracing.aten import AtenTable

_symbols: dict[str, Symbol] = {}
_lock = threading.Lock()


def save_backward_inputs(
    scope: list[BoundSymbol],
    forward_at: int,
    cotangents: Sequence[Any],
    table: AtenTable,
    others: Sequence[Any],
    alive: set[str],
) -> None:
    """Rewrite ``scope[forward_at]`` (a subclass op) and ``scope[-1]`` (its backward) in place so the
    backward's cotangent-free part runs in the forward, when that is worth it (see the module).
    ``alive`` names values the caller keeps alive anyway (the program's inputs and views of them,
    such as a parameter's transpose): reading them costs the backward nothing."""
    forward, backward = scope[forward_at], scope[-1]
    if any(isinstance(c, SubclassTensorProxy) for c in cotangents) or _claimed(forward, backward, others):
        return
    cotangent_names = {c.name for c in cotangents if isinstance(c, Proxy)}
    live = _needed(backward.subsymbols, {o.name for o in backward.flat_proxy_outs})
    free, kept = _by_cotangent(live, cotangent_names)
    kept_outputs = {o.name for sub in kept for o in sub.flat_proxy_outs}
    if any(o.name not in kept_outputs for o in backward.flat_proxy_outs):
        return  # a gradient computed without a cotangent (or passed through): left as is
    budget = _saved_bytes([p for p in _inputs_of(live) if p.name not in cotangent_names], [], table, alive)
    moved = _within_budget(free, kept, budget, table, alive)
    if all(_is_view(sub, table) for sub in moved) or any(_has_effects(sub, table) for sub in moved):
        return
    moved_ids = {id(sub) for sub in moved}
    rest = [sub for sub in live if id(sub) not in moved_ids]
    rest_inputs = _inputs_of(rest)
    produced = {o.name for sub in moved for o in sub.flat_proxy_outs}
    saved = [p for p in rest_inputs if p.name in produced]
    display = str(forward.sym.id).removeprefix(subclass_op_id(""))
    scope[forward_at] = forward.from_bsym(
        sym=_symbol(f"{display}.saving"),
        output=(forward.output, tuple(saved)),
        subsymbols=[*forward.subsymbols, *moved],
    )
    scope[-1] = backward.from_bsym(
        sym=_symbol(f"{display}.backward_from_saved"), args=tuple(rest_inputs), kwargs={}, subsymbols=rest
    )


def _claimed(forward: BoundSymbol, backward: BoundSymbol, others: Sequence[Any]) -> bool:
    return any(bsym.sym.id in getattr(ex, "implmap", {}) for ex in others for bsym in (forward, backward))


def _by_cotangent(bsyms: list[BoundSymbol], cotangent_names: set[str]) -> tuple[list[BoundSymbol], list[BoundSymbol]]:
    """(those that read no cotangent, those that do, directly or through another)."""
    tainted = set(cotangent_names)
    free, kept = [], []
    for sub in bsyms:
        if any(p.name in tainted for p in sub.flat_proxy_args):
            kept.append(sub)
            tainted.update(o.name for o in sub.flat_proxy_outs)
        else:
            free.append(sub)
    return free, kept


def _within_budget(
    free: list[BoundSymbol], kept: list[BoundSymbol], budget: int, table: AtenTable, alive: set[str]
) -> list[BoundSymbol]:
    """The cotangent-free subsymbols to move: all that the kept part reads, if what it then reads
    fits the bytes it read before; else, per set of inputs, the values computed from them that
    take no more than those inputs (an activation's float8 copy, not a parameter's: the
    parameter is alive anyway, its float8 copy would not be), and every one-element value (a
    weight's amax and scale: the reduction runs once, the backward redoes only the elementwise
    cast from the parameter)."""
    reads = _inputs_of(kept)
    candidates = _needed(free, {p.name for p in reads})
    produced = {o.name for sub in candidates for o in sub.flat_proxy_outs}
    saved = [p for p in reads if p.name in produced]
    if _saved_bytes(saved, candidates, table, alive) <= budget:
        return candidates
    by_sources: dict[frozenset[str], list[Proxy]] = {}
    for value in saved:
        sources = _inputs_of(_needed(candidates, {value.name}))
        by_sources.setdefault(frozenset(p.name for p in sources), []).append(value)
    inputs = _inputs_of(candidates)
    chosen = []
    for sources, values in by_sources.items():
        read = [p for p in inputs if p.name in sources]
        if _saved_bytes(values, candidates, table, alive) <= _saved_bytes(read, [], table, alive):
            chosen.extend(values)
    chosen.extend(o for sub in candidates for o in sub.flat_proxy_outs if _is_scalar(o))
    return _needed(candidates, {p.name for p in chosen})


def _is_scalar(proxy: Proxy) -> bool:
    return isinstance(proxy, TensorProxy) and not isinstance(proxy, SubclassTensorProxy) and proxy.numel <= 1


def _needed(bsyms: list[BoundSymbol], names: set[str]) -> list[BoundSymbol]:
    """The bound symbols that compute the values ``names`` (transitively)."""
    needed, result = set(names), []
    for bsym in reversed(bsyms):
        if any(o.name in needed for o in bsym.flat_proxy_outs):
            result.insert(0, bsym)
            needed.update(p.name for p in bsym.flat_proxy_args)
    return result


def _inputs_of(bsyms: list[BoundSymbol]) -> list[Proxy]:
    """The proxies ``bsyms`` read that none of them produces, in first-read order."""
    produced: set[str] = set()
    seen: dict[str, Proxy] = {}
    for bsym in bsyms:
        for p in bsym.flat_proxy_args:
            if p.name not in produced:
                seen.setdefault(p.name, p)
        produced.update(o.name for o in bsym.flat_proxy_outs)
    return list(seen.values())


def _is_view(bsym: BoundSymbol, table: AtenTable) -> bool:
    """Whether ``bsym`` only takes a view or an inner tensor of its first argument."""
    overload = table.overloads_by_id.get(bsym.sym.id)
    return bsym.sym == subclass_flatten or (overload is not None and overload.is_view)


def _has_effects(bsym: BoundSymbol, table: AtenTable) -> bool:
    return table.has_effects(bsym) or any(_has_effects(sub, table) for sub in bsym.subsymbols)


def _saved_bytes(inputs: Sequence[Proxy], moved: list[BoundSymbol], table: AtenTable, alive: set[str]) -> int:
    """Bytes the backward keeps alive to read ``inputs``: a view (or an inner tensor) of another
    value keeps that value's storage, counted once; values in ``alive`` cost nothing."""
    base: dict[str, Proxy] = {}
    for sub in moved:
        if _is_view(sub, table):
            source = next((p for p in sub.flat_proxy_args if isinstance(p, TensorProxy)), None)
            if source is not None:
                for out in sub.flat_proxy_outs:
                    base[out.name] = base.get(source.name, source)
    roots = {}
    for p in inputs:
        if isinstance(p, TensorProxy):
            root = base.get(p.name, p)
            roots[root.name] = root
    return sum(_nbytes(root) for name, root in roots.items() if name not in alive)


def _nbytes(proxy: TensorProxy) -> int:
    if isinstance(proxy, SubclassTensorProxy):
        return sum(_nbytes(inner) for inner in proxy.inner.values())
    # a tracked size by its value in this call, without a guard: the choice it feeds keeps the same values
    # whichever way it goes (a recomputed cast has the saved one's bits), one template serves every size
    return dynamic_sizes.hint(proxy.numel) * proxy.dtype.bytes


def _symbol(display: str) -> Symbol:
    """The symbol of a rewritten op: bound here from other ops' subsymbols, never traced by a call."""
    with _lock:
        symbol = _symbols.get(display)
        if symbol is None:

            def meta(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError(f"{display} is assembled from a traced op and its backward; it is never traced")

            symbol = _symbols[display] = Symbol(
                name="".join(c if c.isalnum() else "_" for c in display),
                meta=meta,
                id=subclass_op_id(display),
                _module=__import__(__name__, fromlist=["_"]),
            )
        return symbol
