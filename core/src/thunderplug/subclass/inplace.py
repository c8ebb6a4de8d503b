"""In-place ops on subclass values (``x.add_(1)``, ``x[0].mul_(3)``, ``y.t().add_(w)``), decomposed as
thunder decomposes them for plain tensors: the out-of-place op (a subclass op), then ``prims.copy_``
into the updated value, bound together under the in-place symbol, so that thunder's alias updates
(``insert_alias_updates``) see an in-place op and give later reads of the value and of its views
fresh proxies. ``copy_`` and ``update_aliases`` take subclass values as they are (subclass
outputs); at run time ``copy_`` runs the subclass's own ``copy_`` on the real objects, writing into
the real inner tensors, so the caller sees its input's mutation.

The in-place op is recorded as the out-of-place subclass op and ``Tensor.copy_`` of its result.
The write is real, so a value read before it and kept for the backward would be read after it
(stock thunder's gradient of ``x.mul_(w)`` is wrong that way): when the compilation differentiates,
what was read of the mutated value (and of the values it is a view of) before the op, and the op's
own read, go through a snapshot taken where the value was made, as eager autograd keeps the
original of a value an in-place op overwrites.
"""

from __future__ import annotations

from typing import Any

import thunder.torch as ltorch
from thunder.core import prims
from thunder.core.proxies import TensorProxy, variableify
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import get_tracectx

from thunderplug.subclass.unroll import SubclassDispatchError
from thunderplug.subclass.values import SubclassTensorProxy, is_subclass_op
from thunderplug.thunder_compat import inplace_to_out_of_place, syms_returning_views, syms_that_may_return_views
from thunderplug.tracing.aten import user_location
from thunderplug.tracing.trace_state import grad_enabled


def is_in_place(symbol: Symbol, args: tuple, kwargs: dict) -> bool:
    """An in-place thunder.torch symbol (``add_``), or one called with ``inplace=True`` (``F.relu``)."""
    if prims.OpTags.IN_PLACE in (symbol.tags or ()):
        return True
    _, position = inplace_to_out_of_place().get(symbol, (None, -1))
    return position >= 0 and bool(args[position] if len(args) > position else kwargs.get("inplace", False))


def decompose_in_place(symbol: Symbol, args: tuple, kwargs: dict) -> Any:
    """``symbol(*args, **kwargs)`` (see :func:`is_in_place`) on subclass values."""
    out_of_place, position = inplace_to_out_of_place().get(symbol, (None, -1))
    if position >= 0:  # the same symbol, called with inplace=False
        args = tuple(False if i == position else a for i, a in enumerate(args))
        kwargs = {**kwargs, "inplace": False} if "inplace" in kwargs else kwargs
    target = args[0] if args else None
    if out_of_place is None or not isinstance(target, TensorProxy):
        raise SubclassDispatchError(
            f"{symbol.name} was applied to a subclass value{user_location()}; thunder has no out-of-place variant "
            "for it"
        )
    trace = get_tracectx()
    scope = trace.peek_scope()
    differentiated = _differentiated(scope, args)
    if differentiated and len(chain := _view_chain(scope, target)) > 1:
        producers = _producers(scope)
        if _needs_grad(producers, [v for _, v in chain] + [a for a in args if isinstance(a, TensorProxy)], {}):
            raise NotImplementedError(
                f"{symbol.name} on a view of a subclass value{user_location()} whose gradient is needed: thunder "
                "passes no gradient from a view's in-place update to the value it views (stock thunder fails on it "
                "too). Update the value itself (an out-of-place op, torch.where or index_put), or detach it."
            )
    read = _snapshot(scope, target, trace) if differentiated else target
    result = out_of_place(read, *args[1:], **kwargs)
    if not isinstance(result, TensorProxy) or not (scope and is_subclass_op(scope[-1].sym)):
        raise SubclassDispatchError(
            f"{symbol.name} on a subclass value{user_location()}: its out-of-place variant {out_of_place.name} "
            "is not a torch op thunderplug can unroll on the subclass"
        )
    if result.dtype != target.dtype:
        result = ltorch.to(result, target.dtype)
    trace.push_scope([])
    try:
        copied = prims.copy_(result, target, grad_enabled=grad_enabled())
    finally:
        recorded = trace.pop_scope()
    # bound as ``Tensor.copy_(target, result)``: an in-place op to thunder's alias updates, which
    # reads the result (so that nothing it needs is removed as dead code)
    scope.append(ltorch.copy_.bind(target, result, output=copied, subsymbols=recorded))
    return copied


def bind_aliasing_prim(symbol: Symbol, args: tuple, kwargs: dict) -> Any:
    """``prims.copy_`` into a subclass value and ``prims.update_aliases`` of subclass values, bound
    with subclass outputs (thunder's metas return plain proxies); ``NotImplemented`` for other calls."""
    if symbol is prims.copy_ and isinstance(args[1], SubclassTensorProxy):
        output: Any = SubclassTensorProxy(like=args[1])
    elif symbol is prims.copy_ and isinstance(args[0], SubclassTensorProxy):
        raise SubclassDispatchError(
            f"an in-place update of a plain tensor with a {args[0].subclass_type.__name__} value{user_location()}: "
            "thunderplug cannot write a subclass value into a plain tensor; assign the result to a new name instead"
        )
    elif symbol is prims.update_aliases and any(isinstance(a, SubclassTensorProxy) for a in args[0]):
        output = tuple(type(a)(like=a, requires_grad=a.requires_grad) for a in args[0])
    else:
        return NotImplemented
    get_tracectx().scopes[-1].append(symbol.bind(*args, **kwargs, output=output))
    return output


def _differentiated(scope: list[BoundSymbol], args: tuple) -> bool:
    """Whether thunder's autodiff may differentiate what was computed so far: grad mode is on and
    some value read so far (inputs' proxies say whether they require grad) or an argument requires grad."""
    if not grad_enabled():
        return False
    read = [p for bsym in scope for p in bsym.flat_proxy_args]
    return any(isinstance(p, TensorProxy) and p.requires_grad for p in (*read, *args))


def _producers(scope: list[BoundSymbol]) -> dict[str, BoundSymbol]:
    return {o.name: bsym for bsym in scope for o in bsym.flat_proxy_outs}


def _needs_grad(producers: dict[str, BoundSymbol], values: list[TensorProxy], known: dict[str, bool]) -> bool:
    """Whether any of ``values`` is computed from an input that requires grad (inputs' proxies
    say so reliably; values made in the scope are followed to what they are computed from)."""
    for value in values:
        if value.name not in known:
            known[value.name] = False  # cycles cannot happen; this only stops re-visits
            producer = producers.get(value.name)
            if producer is None:
                known[value.name] = bool(value.requires_grad)
            else:
                reads = [p for p in producer.flat_proxy_args if isinstance(p, TensorProxy)]
                known[value.name] = _needs_grad(producers, reads, known)
        if known[value.name]:
            return True
    return False


def _snapshot(scope: list[BoundSymbol], target: TensorProxy, trace: Any) -> TensorProxy:
    """A copy of ``target`` taken where it was made; every earlier read of ``target``, and of the
    values it is a view of, reads the copy of its own value instead. Returns ``target``'s copy."""
    chain = _view_chain(scope, target)
    producers = {id(bsym) for bsym, _ in chain}
    copies: dict[str, TensorProxy] = {}
    for bsym, value in reversed(chain):  # from the base to the target
        at = next((i for i, b in enumerate(scope) if b is bsym), -1) + 1
        trace.push_scope([])
        try:
            copies[value.name] = ltorch.clone(value)
        finally:
            made = trace.pop_scope()
        scope[at:at] = made
        producers.update(id(b) for b in made)
    swap = {variableify(p): copies[p.name] for _, p in chain}
    for index, bsym in enumerate(scope):
        if id(bsym) not in producers and any(variableify(p) in swap for p in bsym.flat_proxy_args):
            scope[index] = bsym.from_bsym_swap_proxies(swap, skip_output=True)
    return copies[target.name]


def _view_chain(scope: list[BoundSymbol], value: TensorProxy) -> list[tuple[BoundSymbol | None, TensorProxy]]:
    """``value`` with its producer, then the value it is a view of with that one's producer, ... (a
    producer is ``None`` for a value made outside ``scope``, such as an input)."""
    producer_of = _producers(scope)
    views = syms_returning_views() | syms_that_may_return_views()
    chain: list[tuple[BoundSymbol | None, TensorProxy]] = []
    while True:
        producer = producer_of.get(value.name)
        chain.append((producer, value))
        if producer is None or producer.sym not in views or not producer.flat_proxy_args:
            return chain
        base = producer.flat_proxy_args[0]
        if not isinstance(base, TensorProxy) or any(base.name == p.name for _, p in chain):
            return chain
        value = base
