"""``tensor.data`` inside a jitted function, as in eager.

Why: thunder 0.2.6's proxies have no ``data`` attribute (``AttributeError: Unknown attribute data``), so a
module reading ``self.w.data`` or updating ``self.gain.data.mul_(0.9)`` in its ``forward`` failed to compile.

How: reading ``t.data`` is ``t.detach()`` (:func:`data_property`): in eager ``.data`` is a tensor of the same
storage without autograd history, so every value read through it is ``t``'s and no gradient flows back through it,
as for ``detach()``. Updating a tensor in place through ``.data`` changes it where autograd cannot see: eager's
``.data`` shares no version counter with the tensor, so an op that saved the tensor before the update reads the
updated values in its backward, and the update itself records nothing. thunder represents the update functionally
(a new value, then alias updates), which reproduces neither of these: :func:`updates_through_data_refused` refuses
such an update (``NotImplementedError`` naming ``.data``, the op and the user's line) before thunder's alias
updates, instead of computing something else silently. ``with torch.no_grad(): t.mul_(0.9)`` is what to write
instead; it is exact under ``discover()`` (``eager.inplace_grads``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import thunder.torch as ltorch
from thunder.core import prims
from thunder.core.proxies import ProxyTag, TensorProxy, variableify
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, from_trace

from thunderplug.thunder_compat import syms_returning_views, syms_that_may_return_views

#: the tag of the proxies ``t.data`` returned (``t.detach()``), which the check below looks for
DATA = ProxyTag.register_tag("THUNDERPLUG_TENSOR_DATA")


def data_property(active: Callable[[], bool]) -> Callable[[TensorProxy], TensorProxy]:
    """``t.data``, a tensor property of thunder's torch language (which ``TensorProxy.__getattr__`` reads):
    ``detach()`` of the tensor, tagged :data:`DATA`; outside discover() compilations ``AttributeError``, for which
    ``__getattr__`` answers as without the property (``Unknown attribute data``)."""

    def data(tensor: TensorProxy) -> TensorProxy:
        if not active():
            raise AttributeError("data")
        result = ltorch.detach(tensor)
        result.tags.add(DATA)
        return result

    return data


def updates_through_data(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder's ``insert_alias_updates`` (run on every computation trace right after tracing), given the trace
    with each in-place update through ``.data`` written as the same update of the tensor itself under ``no_grad``
    (:func:`_through_data_rewritten`)."""

    def insert_alias_updates(computation_trace: TraceCtx, *args: Any, **kwargs: Any) -> TraceCtx:
        if active():
            computation_trace = _through_data_rewritten(computation_trace)
        return original(computation_trace, *args, **kwargs)

    return insert_alias_updates


def _through_data_rewritten(trace: TraceCtx) -> TraceCtx:
    """``trace`` with ``op_(t.data, ...)`` written as ``op_(t, ...)`` computed under ``no_grad`` (its values tagged
    as autograd's constants, as thunder tags what it traces under ``no_grad``: ``eager.inplace_grads`` then keeps
    ``t``'s gradient identity, as eager does). Exact where nothing read ``t`` before the update; where something did
    (eager's backward would read the updated values it saved) or where the update goes through a view of ``.data``
    (``t.data[0].mul_(2)``), ``NotImplementedError`` names ``.data``, the op and the user's line."""
    root: dict = {}  # variableified ``.data`` result (or a view of one) -> the tensor it is the ``.data`` of
    read: set = set()  # variableified tensors some op read before (directly or through an alias)
    views = {*syms_returning_views(), *syms_that_may_return_views()}
    rewritten: dict[int, BoundSymbol] = {}
    for index, bsym in enumerate(trace.bound_symbols):
        outputs = [o for o in bsym.flat_proxy_outs if isinstance(o, TensorProxy)]
        args = [a for a in bsym.flat_proxy_args if isinstance(a, TensorProxy)]
        if bsym.sym is ltorch.detach and outputs and DATA in outputs[0].tags and args:
            base = root.get(variableify(args[0]), (args[0], False))[0]
            root[variableify(outputs[0])] = (base, False)  # (the tensor, whether it is a view of a ``.data``)
            continue
        if bsym.sym in views and args and variableify(args[0]) in root:
            base = root[variableify(args[0])][0]
            root.update({variableify(o): (base, True) for o in outputs})
            continue
        destination = _updated(bsym)
        if destination is not None and variableify(destination) in root:
            base, through_view = root[variableify(destination)]
            if through_view or variableify(base) in read:
                why = (
                    "through a view of it" if through_view else
                    "after an op read the tensor (eager's backward reads the updated values an op saved; thunder's "
                    "the values before the update)"
                )
                raise NotImplementedError(
                    f"{bsym.sym.name} updates a tensor's `.data` in place {why}{_location(bsym)}: eager changes the "
                    "tensor without autograd seeing the update, which thunderplug cannot reproduce exactly here. "
                    "Update `.data` before the function reads the tensor, write it as `with torch.no_grad(): "
                    "tensor.<op>_(...)`, or make the update outside the jitted function."
                )
            rewritten[index] = _under_no_grad(bsym.from_bsym_swap_proxies({variableify(destination): base},
                                                                           skip_output=True))
            continue  # its reads are under no_grad: nothing a backward saves
        for a in args:
            read.add(variableify(root[variableify(a)][0] if variableify(a) in root else a))
    if not rewritten:
        return trace
    new = from_trace(trace)
    new.bound_symbols = [rewritten.get(i, bsym) for i, bsym in enumerate(trace.bound_symbols)]
    return new


def _under_no_grad(bsym: BoundSymbol) -> BoundSymbol:
    """``bsym`` as thunder traces it under ``no_grad``: its values (and its subsymbols') tagged as autograd's
    constants, its ``copy_`` run with grad mode off (in grad mode torch refuses an in-place update of a leaf)."""
    for out in bsym.flat_proxy_outs:
        if isinstance(out, TensorProxy):
            out.tags.add(ProxyTag.DETACHED_AUTOGRAD_GRAPH)
    kwargs = {**bsym.kwargs, "grad_enabled": False} if bsym.sym.id == prims.PrimIDs.COPY_ else bsym.kwargs
    return bsym.from_bsym(kwargs=kwargs, subsymbols=[_under_no_grad(sub) for sub in bsym.subsymbols])


def _updated(bsym: BoundSymbol) -> TensorProxy | None:
    """The tensor an in-place op (its decomposition ends in ``copy_``, or a ``copy_`` itself) writes into."""
    copy = bsym if bsym.sym.id == prims.PrimIDs.COPY_ else (bsym.subsymbols[-1] if bsym.subsymbols else None)
    while copy is not None and copy.sym.id != prims.PrimIDs.COPY_ and copy.subsymbols:
        copy = copy.subsymbols[-1]
    if copy is None or copy.sym.id != prims.PrimIDs.COPY_ or len(copy.args) < 2:
        return None
    destination = copy.args[1]
    return destination if isinstance(destination, TensorProxy) else None


def _location(bsym: BoundSymbol) -> str:
    filename, positions = getattr(bsym, "source_filename", None), getattr(bsym, "source_positions", None)
    line = getattr(positions, "lineno", None)
    return f" (at {filename}:{line})" if filename and line else ""
