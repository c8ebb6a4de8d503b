"""Gradients of tensors updated in place inside a jitted function, as in eager.

Why: a parameter updated in place in ``forward`` (``with torch.no_grad(): self.gain.mul_(0.9)``,
a clamp of weights, a buffer's running statistic) keeps its autograd identity in eager: the
update only changes its value, and every later use of the tensor still sends its gradient to it
(a leaf's ``.grad``). thunder 0.2.6 represents the update functionally: the op computing the new
value is computed under ``no_grad``, so autodiff treats it as a constant, and the new value is a
fresh proxy with no path back to the input; the trace also returns that new proxy in place of the
input (``flat_args``, swapped by thunder's alias-update pass), so the gradient thunder returns for
the input is the one of the updated value only, or none (``gain.grad`` stays None, and the
losses drift from eager's from the second step). An input updated in place *with* grad
(``a.mul_(2)`` on a non-leaf input) loses its gradient the same way: the chain through the
update ends at the new proxy, not at the input.

How: :func:`keeping_gradient_identity` wraps thunder's autodiff (``grad_transform_on_trace``,
patched in ``wiring.patches`` for ``discover()`` compilations). Before autodiff, in the
trace it is given:

* each in-place op computed under ``no_grad`` on a floating tensor has its new value passed
  through :data:`same_gradient` (``new = same_gradient(updated, old)``): forward the updated
  value, backward the cotangent to the tensor before the update, as eager's identity does;
* the returned ``flat_args`` (whose gradients autodiff computes) are the inputs themselves again,
  wherever the trace still reads the input (so not for an input thunder replaced by an alias of
  another input). thunder's split of the joint trace needs the updated values there (it keeps an
  update in the forward when its result is returned), so after autodiff the joint trace returns
  them again in ``flat_args``, with the gradients of the inputs.

Both are no-ops for a trace without in-place updates of inputs.

A third step reads values as eager's autograd saves them. thunder's traces name values, but ``copy_(new,
t)`` (how an in-place op ends) overwrites the memory of ``t`` at run time: an op of the joint trace that
reads ``t`` (or a view of the same memory) after that ``copy_`` reads the new value where the trace
means the old one. Backward formulas do exactly that: ``v /= v.sum(-1, keepdim=True)`` (Mixtral's
router normalizing its top-k weights) saves ``v`` for the division's gradient, which then divided the
updated ``v`` (a silently wrong router gradient, also with stock thunder). Eager saves a copy of the
original for an in-place op whose derivative reads it (autograd's ``original_self``); here such a
``copy_`` writes into a ``clone`` of its destination instead, where no view or input can tell, and where
the destination is an input (``x.mul_(w)``, whose gradient for ``w`` reads ``x``: once KI-9) the later
reads read a copy taken before the ``copy_``, which still updates the input
(:func:`clobbered_reads_cloned`; a no-op for a trace where no op reads an overwritten value).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from thunder.core import dtypes, prims
from thunder.core.prims import get_grad, put_grad
from thunder.core.proxies import ProxyTag, TensorProxy, variableify
from thunder.core.pytree import tree_flatten
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, from_trace, tracectx
from thunder.core.transforms import register_grad
from thunder.executors.pythonex import ex as pythonex

from thunderplug.thunder_compat import syms_returning_views, syms_that_may_return_views

#: the key under which the trace given to autodiff returns thunder's ``flat_args`` (updated values)
_UPDATED = "thunderplug_updated_flat_args"

#: ``new = same_gradient(updated, old)``: ``updated`` itself; its gradient goes to ``old``
same_gradient = pythonex.register_operator(
    "same_gradient", meta=lambda updated, old: TensorProxy(like=updated), fn=lambda updated, old: updated
)


def _same_gradient_rule(updated: TensorProxy, old: TensorProxy) -> TensorProxy:
    new = same_gradient(updated, old)
    put_grad(old, get_grad(new))
    return new


register_grad(same_gradient.id, _same_gradient_rule)

#: ``new, original = keeping_original(new, destination)``: ``new`` itself and a copy of ``destination``, taken
#: before the ``copy_(new, destination)`` after it (which reads ``new``, so thunder's split computes both in the
#: forward); an opaque op, so that no fusion's rematerialization copies ``destination`` later, once overwritten
keeping_original = pythonex.register_operator(
    "keeping_original",
    meta=lambda new, destination: (TensorProxy(like=new), TensorProxy(like=destination, requires_grad=False)),
    fn=lambda new, destination: (new, destination.clone()),
)


def keeping_gradient_identity(
    original: Callable[..., TraceCtx], active: Callable[[], bool]
) -> Callable[..., TraceCtx]:
    """thunder's ``grad_transform_on_trace``, given the trace with in-place updates rewritten as
    described above (when ``active()``)."""

    def grad_transform_on_trace(trace: TraceCtx, /, *args: Any, **kwargs: Any) -> TraceCtx:
        if not active():
            return original(trace, *args, **kwargs)
        return clobbered_reads_cloned(_updated_values_returned(original(rewrite(trace), *args, **kwargs)))

    return grad_transform_on_trace


def rewrite(trace: TraceCtx) -> TraceCtx:
    """``trace`` with no-grad in-place updates passed through :data:`same_gradient` and the
    returned ``flat_args`` restored to the inputs; ``trace`` itself when neither changes anything."""
    returned = trace.bound_symbols[-1] if trace.bound_symbols else None
    if returned is None or returned.sym.id != prims.PrimIDs.RETURN or not _returns_flat_args(returned):
        return trace
    updates = [bsym for bsym in trace.bound_symbols[:-1] if _no_grad_update(bsym)]
    flat_args = _inputs_again(trace, returned.args[0]["flat_args"])
    if not updates and all(a is b for a, b in zip(flat_args, returned.args[0]["flat_args"])):
        return trace
    rewritten = from_trace(trace)
    swap: dict = {}
    with tracectx(rewritten):
        for bsym in trace.bound_symbols[:-1]:
            bsym = bsym.from_bsym_swap_proxies(swap, skip_output=True) if swap else bsym
            rewritten.bound_symbols.append(bsym)
            if _no_grad_update(bsym):
                updated, old = bsym.output, bsym.flat_proxy_args[0]
                new = TensorProxy(like=updated, requires_grad=old.requires_grad)
                # bound, not called: a call under no_grad would tag ``new`` as constant for autodiff
                rewritten.bound_symbols.append(same_gradient.bind(updated, old, output=new))
                swap[variableify(updated)] = new
        results = {**returned.args[0], "flat_args": flat_args, _UPDATED: tuple(returned.args[0]["flat_args"])}
        final = returned.from_bsym(args=(results, *returned.args[1:]))
        rewritten.bound_symbols.append(final.from_bsym_swap_proxies(swap) if swap else final)
    return rewritten


def _updated_values_returned(joint: TraceCtx) -> TraceCtx:
    """The joint trace returning the updated values in ``flat_args`` again (see the module's doc)."""
    returned = joint.bound_symbols[-1] if joint.bound_symbols else None
    if returned is None or not returned.args or not isinstance(returned.args[0], dict):
        return joint
    results = dict(returned.args[0])
    if _UPDATED not in results:
        return joint
    results["flat_args"] = list(results.pop(_UPDATED))
    restored = from_trace(joint)
    restored.bound_symbols = [*joint.bound_symbols[:-1], returned.from_bsym(args=(results, *returned.args[1:]))]
    return restored


def clobbered_reads_cloned(joint: TraceCtx) -> TraceCtx:
    """``joint`` where a ``copy_`` would overwrite a value some later op reads (by its name: the value
    before the update) reads a ``clone`` of that value taken just before the ``copy_``, as eager's
    autograd saves ``original_self``.

    Nothing else may tell: a destination sharing memory with a view (or being one) is left as it is.
    Where the destination is an input of the function (or, through thunder's alias updates or an earlier
    ``copy_``, the same tensor as one), the ``copy_`` still writes into it, the caller sees the update,
    and the later ops read the clone instead (KI-9: ``x.mul_(w)`` on an input, whose ``mul`` gradient
    for ``w`` reads ``x``). Elsewhere the ``copy_`` writes into the clone (then its output, which later ops
    read for the updated value, is the clone): thunder's split of the joint trace stays as it is, the
    clone being computed in the forward, where the ``copy_`` reads it. The final return is not a later
    read (it returns tensors, whose memory eager's in-place ops change too). A ``copy_``'s output is
    its destination's tensor (a later in-place update of an input through it still writes into the
    input)."""
    bsyms = joint.bound_symbols
    copies = {index for index, bsym in enumerate(bsyms[:-1]) if _is_copy(bsym)}
    if not copies:
        return joint
    inputs = {variableify(p) for p in tree_flatten((joint.args, joint.kwargs))[0] if isinstance(p, TensorProxy)}
    views = {*syms_returning_views(), *syms_that_may_return_views()}
    memory: dict = {}  # variableified proxy -> the set of names of its tensor (one set per tensor)
    viewed: set = set()  # names of tensors a view was taken of, or that are views

    def group(p: TensorProxy) -> set:
        return memory.setdefault(variableify(p), {variableify(p)})

    def join(a: TensorProxy, b: TensorProxy) -> None:
        ga, gb = group(a), group(b)
        if ga is not gb:
            ga |= gb
            for member in gb:
                memory[member] = ga

    targets: set[int] = set()  # positions of the copy_ ops to redirect into a clone
    kept: dict[int, frozenset] = {}  # positions of copy_ ops into inputs -> names whose later reads read a clone
    last_read = {variableify(p): index for index, bsym in enumerate(bsyms[:-1]) for p in bsym.flat_proxy_args}
    for index, bsym in enumerate(bsyms[:-1]):
        reads = [p for p in bsym.flat_proxy_args if isinstance(p, TensorProxy)]
        outputs = [p for p in bsym.flat_proxy_outs if isinstance(p, TensorProxy)]
        if bsym.sym.id == prims.PrimIDs.UPDATE_ALIASES:  # outputs: new names of the inputs, in order
            for p, out in zip(reads, outputs):
                join(p, out)
        elif reads and (bsym.sym in views or bsym.sym.id in _VIEW_PRIMS):
            viewed.update(variableify(p) for p in (reads[0], *outputs))
        if index not in copies:
            continue
        names = frozenset(group(bsym.args[1]))  # the names of the value before this update
        if isinstance(bsym.output, TensorProxy):
            join(bsym.args[1], bsym.output)
        if names & viewed or not any(last_read.get(name, -1) > index for name in names):
            continue
        if names & inputs or group(bsym.args[1]) & inputs:
            kept[index] = names
        else:
            targets.add(index)
    if not targets and not kept:
        return joint
    rewritten = from_trace(joint)
    swap: dict = {}  # a name of a value before an update -> the clone of that value
    with tracectx(rewritten):
        for index, bsym in enumerate(bsyms):
            if index < len(bsyms) - 1 and swap:
                if _is_copy(bsym):  # the destination is the tensor's memory, never a clone
                    source = bsym.args[0]
                    bsym = bsym.from_bsym(args=(swap.get(variableify(source), source), *bsym.args[1:]))
                else:
                    bsym = bsym.from_bsym_swap_proxies(swap, skip_output=True)
            if index in targets:
                destination = bsym.args[1]
                clone = TensorProxy(like=destination, requires_grad=False)
                rewritten.bound_symbols.append(prims.clone.bind(destination, output=clone))
                bsym = bsym.from_bsym(args=(bsym.args[0], clone, *bsym.args[2:]))
            elif index in kept:
                source, destination = bsym.args[:2]
                new, original = TensorProxy(like=source), TensorProxy(like=destination, requires_grad=False)
                rewritten.bound_symbols.append(keeping_original.bind(source, destination, output=(new, original)))
                bsym = bsym.from_bsym(args=(new, *bsym.args[1:]))
                swap.update({name: original for name in kept[index] if name not in swap})
            rewritten.bound_symbols.append(bsym)
    return rewritten


def _is_copy(bsym: BoundSymbol) -> bool:
    return (
        bsym.sym.id == prims.PrimIDs.COPY_
        and len(bsym.args) >= 2
        and all(isinstance(a, TensorProxy) for a in bsym.args[:2])
    )


#: prims whose output shares its input's memory when run by thunder's torch executor
_VIEW_PRIMS = {
    prims.PrimIDs.BROADCAST_IN_DIM, prims.PrimIDs.RESHAPE, prims.PrimIDs.VIEW, prims.PrimIDs.TRANSPOSE,
    prims.PrimIDs.SLICE, prims.PrimIDs.SQUEEZE,
}


def _returns_flat_args(returned: BoundSymbol) -> bool:
    return bool(returned.args) and isinstance(returned.args[0], dict) and "flat_args" in returned.args[0]


def _no_grad_update(bsym: BoundSymbol) -> bool:
    """An in-place op (its decomposition ends in ``copy_``) computed under ``no_grad`` whose
    updated tensor is floating (could carry a gradient)."""
    if not bsym.subsymbols or bsym.subsymbols[-1].sym.id != prims.PrimIDs.COPY_:
        return False
    updated, args = bsym.output, bsym.flat_proxy_args
    return (
        isinstance(updated, TensorProxy)
        and ProxyTag.DETACHED_AUTOGRAD_GRAPH in updated.tags
        and bool(args)
        and isinstance(args[0], TensorProxy)
        and dtypes.is_inexact_dtype(args[0].dtype)
    )


def _inputs_again(trace: TraceCtx, flat_args: list) -> list:
    """``flat_args`` with each alias thunder's alias-update pass put in an input's place replaced by
    the input, where the trace still reads the input."""
    inputs, _ = tree_flatten((trace.args, trace.kwargs))
    if len(inputs) != len(flat_args):
        return flat_args
    read = {variableify(p) for bsym in trace.bound_symbols[:-1] for p in bsym.flat_proxy_args}
    return [
        given if isinstance(given, TensorProxy) and current is not given and variableify(given) in read else current
        for current, given in zip(flat_args, inputs)
    ]
