"""Inputs sharing memory, as eager sees them: two views of one tensor are two tensors.

Why: in a function with an in-place op, thunder 0.2.6 replaces every input sharing a storage with the first such
input (``replace_args_with_alias_map``), reshaped to its shape: it assumes that inputs sharing a storage are one
tensor. Two different views passed as two arguments (``first, second = base.unbind(-1)``: the same shape, other
offsets; ``x[0:3]`` and ``x[1:4]``; ``x.t()`` and ``x``) then read as one (``second - first * 2`` gave ``[-2, -4]``
where eager gives ``[2, 2]``). Its groups are also positions among the call's flattened arguments applied to the
computation's inputs, which are another list (an unused argument shifts them: ``f(a, unused, b, c)`` called as
``f(x, y, y, x)`` read ``c`` as ``b``).

How (discover() compilations): the call's key (``cache_info``) records, for each group of arguments sharing a
storage, which of them are the same view (storage offset, shape, strides, dtype; contiguous tensors of one offset
and size count as one view, as thunder's reshape assumes), so a compilation serves only calls where the same
arguments are the same views (:func:`keyed_by_view`). At the alias updates (:func:`merged_by_view`), each
computation input is found from its provenance (the argument, the module's parameter or buffer it was read
from), and only inputs that are the same view of arguments the key covers are merged, as thunder merges them.
Every other input sharing memory with another (a different view; a parameter passed as an argument) stays its
own input, linked to the first of its group by :data:`aliased_input` (``b = aliased_input(a, b)``: at run time
``b`` itself), which thunder's alias updates treat as a view of ``a``: a later read of either after an in-place
update of the other is ordered after it, as the memory they share is. Where gradients go through such an update,
thunderplug's functional rewrite of updates through views (``eager.inplace_grads``) cannot tell which elements
the other view sees and refuses it by name, with the user's line.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import torch
from thunder.core import prims
from thunder.core.interpreter import ProvenanceRecord, PseudoInst
from thunder.core.prims import get_grad, put_grad
from thunder.core.proxies import TensorProxy, variableify
from thunder.core.pytree import tree_flatten
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, from_trace, tracectx
from thunder.core.transforms import register_grad
from thunder.executors.pythonex import ex as pythonex

from thunderplug.thunder_compat import syms_returning_views, syms_that_may_return_views

#: the ``cache_info`` entry of a call whose arguments share a storage: which of them are the same view
KEY = "thunderplug_alias_views"

#: ``b = aliased_input(a, b)``: the input ``b`` itself, known to share memory with the input ``a``
aliased_input = pythonex.register_operator(
    "aliased_input", meta=lambda base, arg: TensorProxy(like=arg), fn=lambda base, arg: arg
)


def _aliased_input_rule(base: TensorProxy, arg: TensorProxy) -> TensorProxy:
    linked = aliased_input(base, arg)
    put_grad(arg, get_grad(linked))
    return linked


register_grad(aliased_input.id, _aliased_input_rule)

#: the call being compiled: its arguments and the function interpreted (a module's parameters are read from it)
_call: contextvars.ContextVar[tuple[tuple, dict, Any] | None] = contextvars.ContextVar("aliased_call", default=None)


def _plain(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor) and type(value) in (torch.Tensor, torch.nn.Parameter)
        and value.layout is torch.strided and value.numel() > 0
    )


def _view(t: torch.Tensor) -> tuple:
    """What makes two tensors of one storage the same tensor for thunder's merge (its reshape is exact for
    contiguous tensors of one offset and size)."""
    if t.is_contiguous():
        return (t.dtype, t.storage_offset(), t.numel())
    return (t.dtype, t.storage_offset(), tuple(t.shape), t.stride())


def _groups(tensors: Iterator[tuple[int, torch.Tensor]]) -> list[list[tuple[int, torch.Tensor]]]:
    """The groups (two or more) of ``(position, tensor)`` sharing a storage, in order."""
    by_storage: dict[tuple, list[tuple[int, torch.Tensor]]] = {}
    for position, t in tensors:
        by_storage.setdefault((t.device, t.untyped_storage().data_ptr()), []).append((position, t))
    return [group for group in by_storage.values() if len(group) > 1]


def view_key(args: tuple, kwargs: dict) -> str:
    """For each group of the flattened arguments sharing a storage, each position with the index of its view
    within the group (``"3.0,4.1"``: two different views); empty when no arguments share a storage."""
    flat, _ = tree_flatten((args, kwargs))
    keys = []
    for group in _groups((i, t) for i, t in enumerate(flat) if _plain(t)):
        views: dict[tuple, int] = {}
        keys.append(",".join(f"{i}.{views.setdefault(_view(t), len(views))}" for i, t in group))
    return "-".join(keys)


def keyed_by_view(
    original: Callable[..., Any], cache_info: Callable[[], dict], uses_thunderplug: Callable[[Any], bool],
    closure_value: Callable[[Any, str], Any],
) -> Callable[..., Any]:
    """thunder's ``_with_cache_info_ctx`` (it wraps each jitted function's ``get_computation_and_inputs``), the
    innermost of its wrappers: for a discover() compilation, the call's key records its arguments' views
    (:func:`view_key`), and the call is known to :func:`merged_by_view` while it compiles."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        compile_data_ref = closure_value(fn, "weakref_cd")
        if compile_data_ref is None:
            return original(fn)

        def keyed(*args: Any, **kwargs: Any) -> Any:
            compile_data = compile_data_ref()
            if compile_data is None or not uses_thunderplug(compile_data):
                return fn(*args, **kwargs)
            try:
                key = view_key(args, kwargs)
            except Exception:  # noqa: BLE001 - arguments thunder cannot flatten: its populate_cache_info raises
                key = ""
            if key:
                cache_info()[KEY] = key
            token = _call.set((args, kwargs, compile_data.fn))
            try:
                return fn(*args, **kwargs)
            finally:
                _call.reset(token)

        return original(keyed)

    return decorate


class _Unresolved(Exception):
    pass


def _resolve(record: ProvenanceRecord, roots: dict) -> tuple[Any, bool]:
    """The value a computation input's provenance reads, and whether it is an argument's tensor reached by
    subscripts only (one of the call's flattened arguments, which the key covers)."""
    inst = record.inst
    if inst is PseudoInst.CONSTANT:
        return record.value, False
    if inst in roots:
        return roots[inst], inst is not PseudoInst.INPUT_FN
    if inst in (PseudoInst.BINARY_SUBSCR, PseudoInst.LOAD_ATTR) and len(record.inputs) == 2:
        (obj, keyed), (key, _) = (_resolve(r, roots) for r in record.inputs)
        if inst is PseudoInst.BINARY_SUBSCR:
            return obj[key], keyed and isinstance(obj, (tuple, list, dict))
        return getattr(obj, key), False
    raise _Unresolved(inst)


def _inputs(trace: TraceCtx, call: tuple[tuple, dict, Any]) -> Iterator[tuple[int, TensorProxy, torch.Tensor, bool]]:
    """Each computation input found from its provenance: its position among the trace's flattened inputs (as
    thunder's alias indices count), the proxy, the tensor and whether the key covers it."""
    args, kwargs, fn = call
    roots = {PseudoInst.INPUT_ARGS: args, PseudoInst.INPUT_KWARGS: kwargs, PseudoInst.INPUT_FN: fn}
    flat_arguments = {id(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
    for position, proxy in enumerate(tree_flatten((trace.args, trace.kwargs))[0]):
        history = getattr(proxy, "history", None)
        if not isinstance(proxy, TensorProxy) or history is None:
            continue
        try:
            value, keyed = _resolve(history, roots)
        except Exception:  # noqa: BLE001 - a provenance through a global, a call: left as thunder leaves it
            continue
        if _plain(value):
            yield position, proxy, value, keyed and id(value) in flat_arguments


def _updates_in_place(trace: TraceCtx) -> bool:
    """Whether thunder's alias updates do anything (they look at in-place ops of the trace's top level only)."""
    return any(
        (bsym.sym.tags and prims.OpTags.IN_PLACE in bsym.sym.tags)
        or (bsym.subsymbols and bsym.subsymbols[-1].sym.id == prims.PrimIDs.COPY_)
        for bsym in trace.bound_symbols
    )


def merged_by_view(original: Callable[..., TraceCtx], active: Callable[[], bool]) -> Callable[..., TraceCtx]:
    """thunder's ``insert_alias_updates`` of a computation trace, given as alias groups the same views only;
    every other input sharing memory linked by :data:`aliased_input` to the first of its group."""

    def insert_alias_updates(trace: TraceCtx, alias_tensor_indices: list[list[int]]) -> TraceCtx:
        call = _call.get()
        if call is None or not active() or not _updates_in_place(trace):
            return original(trace, alias_tensor_indices)
        inputs = list(_inputs(trace, call))
        entries = {position: (proxy, keyed) for position, proxy, _, keyed in inputs}
        merged, links = [], []
        for group in _groups((position, value) for position, _, value, _ in inputs):
            views: dict[tuple, list[int]] = {}
            heads = []
            for position, value in group:
                proxy, keyed = entries[position]
                if keyed and _view(value) in views:
                    views[_view(value)].append(position)
                    continue
                if keyed:
                    views[_view(value)] = [position]
                heads.append(proxy)
            merged += [positions for positions in views.values() if len(positions) > 1]
            links += [(heads[0], head) for head in heads[1:]]
        if links:
            _refuse_updates_with_grad(trace, links)
            trace = _linked(trace, links)
        return original(trace, merged)

    return insert_alias_updates


def _update_of(bsym: BoundSymbol) -> BoundSymbol | None:
    """The ``copy_`` ending the in-place op ``bsym`` (thunder's alias updates see these ops only), or None."""
    if bsym.sym.id == prims.PrimIDs.COPY_:
        return bsym
    if bsym.subsymbols and bsym.subsymbols[-1].sym.id == prims.PrimIDs.COPY_:
        return bsym.subsymbols[-1]
    if bsym.sym.tags and prims.OpTags.IN_PLACE in bsym.sym.tags:
        return bsym
    return None


def _refuse_updates_with_grad(trace: TraceCtx, links: list[tuple[TensorProxy, TensorProxy]]) -> None:
    """Refuses, by name and line, an in-place update of one of the linked inputs (or of a view of it) with
    gradients involved (the input or the update's operands require grad), read afterwards through another: its
    gradient reaches the other through the memory they share, which eager's autograd records through their common
    base and a thunder trace cannot say. An update no gradient goes through (of a tensor not requiring grad, by
    values not requiring grad: ``weight.detach()`` passed as an argument) is invisible to eager's autograd too."""
    member: dict = {}  # variableified alias -> (group, the input it is an alias of)
    for base, arg in links:
        group = member.setdefault(variableify(base), (variableify(base), base))[0]
        member[variableify(arg)] = (group, arg)
    reached = {variableify(p) for p in tree_flatten((trace.args, trace.kwargs))[0]
               if isinstance(p, TensorProxy) and p.requires_grad}
    updated: dict = {}  # group -> (the input updated, the update)
    views = {*syms_returning_views(), *syms_that_may_return_views()}
    for bsym in trace.bound_symbols:
        args = [p for p in bsym.flat_proxy_args if isinstance(p, TensorProxy)]
        for p in args:
            group, aliased = member.get(variableify(p), (None, None))
            if group is not None and group in updated and updated[group][0] is not aliased:
                _refuse(*updated[group], aliased)
        outs = [o for o in bsym.flat_proxy_outs if isinstance(o, TensorProxy)]
        update = _update_of(bsym)
        if args and variableify(args[0]) in member and (update is not None or bsym.sym in views):
            for o in outs:
                member[variableify(o)] = member[variableify(args[0])]
            group, aliased = member[variableify(args[0])]
            grad = any(variableify(p) in reached for p in args) or aliased.requires_grad
            if update is not None and update.kwargs.get("grad_enabled", True) and grad:
                updated[group] = (aliased, bsym)
        if bsym.sym.name != "detach" and any(variableify(p) in reached for p in args):
            reached.update(variableify(o) for o in outs)


def _refuse(updated: TensorProxy, update: BoundSymbol, read: TensorProxy) -> None:
    where = ""
    if update.source_filename is not None and update.source_positions is not None:
        where = f" (at {update.source_filename}:{update.source_positions.lineno})"
    raise NotImplementedError(
        f"{update.sym.name}{where} updates the input `{updated.name}` in place with gradients involved, and the "
        f"input `{read.name}`, which shares its memory (another view of the same tensor), is read after it: "
        "thunderplug cannot say which elements of one the update changes for the other's gradient. Pass the tensor "
        "they are views of and take the views inside the function, or pass a clone of one of them."
    )


def _linked(trace: TraceCtx, links: list[tuple[TensorProxy, TensorProxy]]) -> TraceCtx:
    """``trace`` reading each linked input through :data:`aliased_input` from its first op on (its return,
    which gives thunder the inputs themselves, unchanged)."""
    swap: dict = {}
    bsyms: list[BoundSymbol] = []
    with tracectx(trace):
        for base, arg in links:
            linked = TensorProxy(like=arg, requires_grad=arg.requires_grad)
            bsyms.append(aliased_input.bind(base, arg, output=linked))
            swap[variableify(arg)] = linked
    start = 0
    while start < len(trace.bound_symbols) and trace.bound_symbols[start].sym.name.startswith("unpack"):
        start += 1
    result = from_trace(trace)
    result.bound_symbols = [
        *trace.bound_symbols[:start],
        *bsyms,
        *(
            bsym if bsym.sym.id == prims.PrimIDs.RETURN else bsym.from_bsym_swap_proxies(swap, skip_output=True)
            for bsym in trace.bound_symbols[start:]
        ),
    ]
    return result


def view_creation(original: Callable[[BoundSymbol], bool]) -> Callable[[BoundSymbol], bool]:
    """thunder's ``_is_view_creation_op`` of its alias updates: :data:`aliased_input` is a view of its first
    input, as far as their order goes."""

    def is_view_creation_op(bsym: BoundSymbol) -> bool:
        return bsym.sym.id == aliased_input.id or original(bsym)

    return is_view_creation_op
