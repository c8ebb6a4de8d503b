"""Which outputs of a jitted function require grad: as in eager, only those computed from an input
that requires grad through differentiable values.

Why: thunder 0.2.6 returns every output of a function that needs autograd from one
``torch.autograd.Function`` without marking any as non-differentiable, so ``y.cos()`` of an input
``y`` without grad, or an inner tensor read from a subclass (``x.get_elem().cos()``), reports
``requires_grad=True`` where eager says False.

How: thunder's autodiff (``grad_transform_on_trace``, wrapped in ``wiring.patches`` for
``discover()`` compilations) calls :func:`marking_outputs`. It reads the trace *before* autodiff,
whose ``torch.no_grad()`` tags are the interpreter's: autodiff re-traces every differentiable op
under the grad mode the function *ends* in, so in the joint trace a function that ends under
``no_grad`` (``torch.set_grad_enabled(False)`` as its last line), or an autograd.Function forward
run under ``no_grad``, tags differentiable values as detached. It follows data dependence from the
inputs that require grad through the trace's top-level ops and stops at values that cannot carry a
gradient (integer and boolean tensors), at ``detach``, at values computed under ``torch.no_grad()``
and at ops the caller names (reads of a subclass's inner tensors); a view (:data:`VIEWS`) made under
``torch.no_grad()`` of a value requiring grad requires grad, as eager's does. Outputs no such path reaches
are, in the joint trace (outputs match by position), passed through a ``mark_non_differentiable``
op, which flags the tensor at run time; thunder's autograd Functions (patched in
``wiring.patches``) then pass the flagged outputs to ``ctx.mark_non_differentiable``, as a
hand-written Function would. Where no input gets a gradient but an output is reached (computed from such a
view), thunder would make no backward and return every output not requiring grad: the joint trace gets a backward
op computing nothing (``leads_nowhere``), so that it makes one. The analysis is conservative: where it cannot
tell, the output keeps thunder's answer, True.

The same analysis answers, while thunder's autodiff runs, which values of the trace require grad
(:func:`requires_grad`). thunder cannot: a ``TensorProxy``'s ``requires_grad`` is set on the inputs
only (every value computed in the trace says False, even ``linear(x, w)`` of a weight requiring grad),
and its autodiff differentiates every floating value. An executor whose rule depends on it (eager's
SDPA picks its math kernel, which differentiates the mask, when the mask requires grad) asks here;
reading the proxy's flag, it saw False for an attention mask computed from parameters (T5's relative
attention bias, Swin's relative position bias table) and dropped the mask's gradient, silently.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from thunder.core import dtypes, prims
from thunder.core.proxies import Proxy, ProxyTag, TensorProxy, variableify
from thunder.core.pytree import tree_flatten, tree_unflatten
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, from_trace, get_tracectx, tracectx
from thunder.executors.pythonex import ex as pythonex

from thunderplug.eager import tied_grads
from thunderplug.tracing import trace_walk
from thunderplug.tracing.aten import user_location

#: the attribute a runtime output carries from ``mark_non_differentiable`` to the autograd Function
_FLAG = "_thunderplug_non_differentiable"
#: the attribute a runtime output carries from ``mark_dirty`` to the autograd Function
_DIRTY = "_thunderplug_dirty"


def _flagged(tensor: torch.Tensor) -> torch.Tensor:
    setattr(tensor, _FLAG, True)
    return tensor


def _flagged_dirty(tensor: torch.Tensor) -> torch.Tensor:
    setattr(tensor, _DIRTY, True)
    return tensor


#: ``t = mark_non_differentiable(t0)``: ``t0`` itself, flagged. An op with an output, so that thunder's
#: split of the joint trace keeps it in the forward (it places ops by what their outputs feed).
mark_non_differentiable = pythonex.register_operator(
    "mark_non_differentiable", meta=lambda tensor: TensorProxy(like=tensor), fn=_flagged
)

#: ``leads_nowhere(cotangent)``: nothing. A backward op that no dce drops, so that thunder's split of the joint
#: trace makes a backward (returning no gradient) where an output requires grad without any input getting one
leads_nowhere = pythonex.register_operator(
    "leads_nowhere", meta=lambda cotangent: None, fn=lambda cotangent: None, tags=[prims.OpTags.DONT_DCE]
)

#: ``t = mark_dirty(t0)``: ``t0`` itself, flagged: an input of the function updated in place and returned
#: (``x.mul_(w); return x``). thunder's autograd Function gets the input tensor as an output, and torch gives
#: such an output a new view to carry the gradient edge, which thunder drops (it returns the tensor its
#: computation returned): the caller's tensor kept its history (none: ``requires_grad=False`` where eager's
#: requires grad). The Function passes a flagged output to ``ctx.mark_dirty``, as eager's in-place op rebases
#: the history of the tensor it updates.
mark_dirty = pythonex.register_operator("mark_dirty", meta=lambda tensor: TensorProxy(like=tensor), fn=_flagged_dirty)


def marking_outputs(
    original: Callable[..., TraceCtx], active: Callable[[], bool], cuts: Callable[[BoundSymbol], bool]
) -> Callable[..., TraceCtx]:
    """thunder's ``grad_transform_on_trace``, whose joint trace then marks the outputs that no input
    requiring grad reaches in the trace it was given (when ``active()``)."""

    def grad_transform_on_trace(trace: TraceCtx, /, *args: Any, **kwargs: Any) -> TraceCtx:
        if not active():
            return original(trace, *args, **kwargs)
        with _requiring_grad(trace, cuts):
            joint = original(trace, *args, **kwargs)
        return mark_outputs(trace, joint, cuts)

    return grad_transform_on_trace


#: per thread, a stack of (values requiring grad, values classified) of the traces thunder's autodiff is
#: differentiating (a stack: a compilation may start inside another's autodiff)
_analyses = threading.local()


def requires_grad(value: Any) -> bool | None:
    """Whether the trace value ``value`` requires grad as it would in eager, asked while thunder's
    autodiff differentiates a ``discover()`` trace (an executor's checker or grad rule): True for an
    input requiring grad and for what such an input reaches through differentiable values (as
    :func:`marking_outputs` follows them, into the subsymbols too); False for the rest of the trace's
    values and for non-floating ones. ``None`` where it cannot tell: outside such an autodiff, or a
    value that is not the trace's. A caller whose answer drops a gradient must treat ``None`` as True."""
    if not isinstance(value, Proxy) or not _carries_grad(value):
        return False
    if getattr(value, "requires_grad", False):
        return True
    stack = getattr(_analyses, "stack", None)
    if not stack:
        return None
    reached, classified = stack[-1]
    key = variableify(value)
    if key in reached:
        return True
    return False if key in classified else None


@contextlib.contextmanager
def _requiring_grad(trace: TraceCtx, cuts: Callable[[BoundSymbol], bool]) -> Iterator[None]:
    """:func:`requires_grad` answers for ``trace`` inside this block."""
    returned = _return_of(trace)
    results = returned.args[0] if returned is not None else None
    flat_args = results.get("flat_args", trace.args) if isinstance(results, dict) else trace.args
    inputs = [a for a in tree_flatten((flat_args, trace.kwargs))[0] if isinstance(a, Proxy)]
    reached = {variableify(a) for a in inputs if _carries_grad(a) and getattr(a, "requires_grad", False)}
    classified = {variableify(a) for a in inputs}
    _follow(trace.bound_symbols, reached, classified, cuts)
    stack = _analyses.__dict__.setdefault("stack", [])
    stack.append((reached, classified))
    try:
        yield
    finally:
        stack.pop()


#: torch functions whose floating outputs never require grad in eager, even of a tensor that does (its shape,
#: dtype or device only is read), as thunder's symbols name them
NON_DIFFERENTIABLE = frozenset({
    "detach", "zeros_like", "ones_like", "full_like", "empty_like", "rand_like", "randn_like", "new_zeros",
    "new_ones", "new_full", "new_empty", "new_tensor", "histc",
})  # fmt: skip
#: torch functions differentiable in their first argument only (the second gives a dtype, device or shape)
FIRST_ARGUMENT_ONLY = frozenset({"type_as", "to", "expand_as", "view_as", "reshape_as"})
#: torch functions whose result is always a view of their first argument, as thunder's symbols name them: made
#: under ``torch.no_grad()`` from a tensor requiring grad, eager's view requires grad too (a leaf of its own)
VIEWS = frozenset({
    "view", "t", "transpose", "permute", "getitem", "squeeze", "unsqueeze", "expand", "expand_as", "narrow", "select",
    "diagonal", "split", "chunk", "unbind", "tensor_split", "movedim", "unflatten", "view_as", "swapaxes", "unfold",
    "real", "imag",
})  # fmt: skip
#: views where they can be, copies where not: eager's ``requires_grad`` under ``no_grad`` depends on the input's
#: strides, which thunder's proxies do not have
MAYBE_VIEWS = frozenset({"reshape", "flatten", "contiguous", "reshape_as"})


def _follow(bsyms: list[BoundSymbol], reached: set, classified: set, cuts: Callable[[BoundSymbol], bool]) -> None:
    """Extend ``reached`` with the outputs of ``bsyms`` (and of their subsymbols) that a reached value
    feeds through differentiable values; every output joins ``classified``."""
    for bsym in bsyms:
        _follow_one(bsym, reached, classified, cuts)


def _follow_one(bsym: BoundSymbol, reached: set, classified: set, cuts: Callable[[BoundSymbol], bool]) -> None:
    """:func:`_follow` for one bound symbol. A ``copy_`` of a reached value into a tensor (an in-place op's
    subsymbol, ``h.add_(w)``) under grad mode reaches the tensor too: eager's in-place op gives it the history."""
    outs = [variableify(out) for out in bsym.flat_proxy_outs]
    stops = bsym.sym.name in NON_DIFFERENTIABLE or cuts(bsym)
    args = bsym.flat_proxy_args
    if bsym.sym.name in FIRST_ARGUMENT_ONLY and bsym.args and isinstance(bsym.args[0], Proxy):
        args = [bsym.args[0]]
    if not stops and any(variableify(a) in reached for a in args):
        view = _is_view(bsym) and variableify(bsym.args[0]) in reached
        reached.update(
            variableify(out) for out in bsym.flat_proxy_outs if _carries_grad(out) and (view or not _detached(out))
        )
        if bsym.sym.id == prims.PrimIDs.COPY_ and len(bsym.args) >= 2 and isinstance(bsym.args[1], TensorProxy):
            if variableify(bsym.args[0]) in reached and not _detached(bsym.output) and _carries_grad(bsym.args[1]):
                reached.add(variableify(bsym.args[1]))
    classified.update(outs)
    if not stops and bsym.subsymbols:
        _follow(bsym.subsymbols, reached, classified, cuts)


def _is_view(bsym: BoundSymbol) -> bool:
    """A call of a :data:`VIEWS` function: a view of its first argument (``view`` to a dtype and ``getitem`` with a
    tensor or list index are not)."""
    if bsym.sym.name not in VIEWS or not bsym.args or not isinstance(bsym.args[0], TensorProxy):
        return False
    rest = tree_flatten((bsym.args[1:], bsym.kwargs))[0]
    if bsym.sym.name == "view" and any(isinstance(a, (dtypes.dtype, torch.dtype)) for a in rest):
        return False
    if bsym.sym.name == "getitem" and (any(isinstance(a, TensorProxy) for a in rest)
                                       or any(isinstance(a, list) for a in bsym.args[1:])):
        return False
    return True


def requires_grad_while_tracing(value: TensorProxy, cuts: Callable[[BoundSymbol], bool]) -> bool:
    """Whether ``value`` requires grad in eager at this point of the program thunder is interpreting (the answer
    to the program's ``value.requires_grad``): an input or parameter that does, or a floating value computed so
    far, under grad mode, from one that does through differentiable ops, as :func:`_follow` follows them
    (``cuts`` as for :func:`marking_outputs`). thunder's own ``requires_grad`` of a computed value is False
    (set on inputs only), and stays so: its transforms read it."""
    if not _carries_grad(value):
        return False
    if value.requires_grad:
        return True
    trace = _interpreted_trace()
    if trace is None:
        return False

    def visit(state: tuple[set, set, set], bsym: BoundSymbol) -> None:
        reached, classified, unsure = state
        # inputs and parameters are the only proxies thunder sets requires_grad on
        reached.update(variableify(a) for a in bsym.flat_proxy_args if getattr(a, "requires_grad", False))
        _follow_one(bsym, reached, classified, cuts)
        args = [variableify(a) for a in bsym.flat_proxy_args]
        outs = [variableify(o) for o in bsym.flat_proxy_outs if _carries_grad(o)]
        maybe_view = bsym.sym.name in MAYBE_VIEWS and any(_detached(o) for o in bsym.flat_proxy_outs)
        if (maybe_view and any(a in reached for a in args)) or (
            any(a in unsure for a in args) and bsym.sym.name not in NON_DIFFERENTIABLE and not cuts(bsym)
        ):
            unsure.update(o for o in outs if o not in reached)

    reached, _, unsure = trace_walk.facts(trace, "requires grad", lambda: (set(), set(), set()), visit)
    key = variableify(value)
    if key not in reached and key in unsure:
        raise NotImplementedError(
            f"thunderplug: requires_grad of a tensor reshaped (reshape, flatten or contiguous) under torch.no_grad() "
            f"from one that requires grad{user_location()}: eager's answer depends on whether it was a view (True) or "
            "a copy (False), on strides thunder 0.2.6 does not trace; use view() (a view) or clone() (a copy)")
    return key in reached


def _interpreted_trace() -> TraceCtx | None:
    """The computation trace of the program thunder is interpreting (also where an ``autograd.Function``'s
    forward is traced into a trace of its own, whose values eager computes without grad), else the trace being
    recorded."""
    from thunder.core.jit_ext import get_jit_ctx

    try:
        return get_jit_ctx().computation_trace
    except LookupError:
        return get_tracectx()


def mark_outputs(trace: TraceCtx, joint: TraceCtx, cuts: Callable[[BoundSymbol], bool]) -> TraceCtx:
    """The joint forward-backward trace ``joint`` made from ``trace``, with every forward output
    (``fw_flat_out``) whose counterpart in ``trace`` no input requiring grad reaches replaced by its
    ``mark_non_differentiable``; ``joint`` itself when every output may need a gradient."""
    returned, joint_returned = _return_of(trace), _return_of(joint)
    if returned is None or joint_returned is None or not _is_joint_return(joint_returned.args):
        return joint
    if not isinstance(returned.args[0], dict) or "flat_args" not in returned.args[0]:
        return joint
    results = joint_returned.args[0]
    outputs, _ = tree_flatten(returned.args[0].get("output"))
    joint_outputs, spec = tree_flatten(results["fw_flat_out"])
    if len(outputs) != len(joint_outputs):
        return joint
    reached = _reached(trace, returned.args[0], results["output"], cuts)
    inputs = {variableify(a) for a in returned.args[0]["flat_args"] if isinstance(a, TensorProxy)}
    unreached_positions = [
        i for i, out in enumerate(outputs) if isinstance(out, TensorProxy) and variableify(out) not in reached | inputs
    ]
    # outputs computed only from a view made under no_grad: eager's require grad, their backward leading nowhere
    # (not where such a view is itself an output: a backward would make it a non-leaf where eager's is a leaf;
    # not where the joint trace reads a cotangent already: thunder makes that backward, an op without a
    # derivative raising in it as eager's does)
    reaching = [i for i, out in enumerate(outputs) if isinstance(out, TensorProxy) and variableify(out) in reached]
    nowhere = [] if any(g is not None for g in tree_flatten(results["output"])[0]) or any(
        _detached(outputs[i]) for i in reaching) or any(
        b.sym.id == prims.PrimIDs.GET_GRAD for b in joint.bound_symbols) else [joint_outputs[i] for i in reaching]
    marks = {
        variableify(joint_outputs[i]): mark_non_differentiable
        for i in unreached_positions
        if isinstance(joint_outputs[i], TensorProxy)
    }
    updated = _updated_inputs(joint)
    for i, out in enumerate(joint_outputs):
        if i not in unreached_positions and isinstance(out, TensorProxy) and variableify(out) in updated:
            marks.setdefault(variableify(out), mark_dirty)
    if not marks and not nowhere:
        return joint
    marked = from_trace(joint)
    swap: dict = {}
    with tracectx(marked):
        for bsym in joint.bound_symbols[:-1]:
            if bsym.sym.name == "get_grad":  # the cotangent of a marked output
                bsym = bsym.from_bsym_swap_proxies(swap)
            marked.bound_symbols.append(bsym)
            for out in bsym.flat_proxy_outs:
                if variableify(out) in marks and variableify(out) not in swap:
                    marked.push_scope([])
                    swap[variableify(out)] = marks[variableify(out)](out)
                    marked.bound_symbols.extend(marked.pop_scope())
        flat_outputs = [swap.get(variableify(o), o) if isinstance(o, TensorProxy) else o for o in joint_outputs]
        if nowhere and isinstance(nowhere[0], TensorProxy):
            leads_nowhere(prims.get_grad(swap.get(variableify(nowhere[0]), nowhere[0])))
        new_results = {**results, "fw_flat_out": tree_unflatten(flat_outputs, spec)}
        marked.bound_symbols.append(joint_returned.from_bsym(args=(new_results, *joint_returned.args[1:])))
    return marked


def _reached(trace: TraceCtx, results: dict, grads: Any, cuts: Callable[[BoundSymbol], bool]) -> set:
    """The values of ``trace`` an input requiring grad reaches (and the inputs thunder's autodiff computes a
    gradient for, ``grads``)."""
    flat_args = results["flat_args"]
    reached = {
        variableify(arg)
        for arg, grad in zip(flat_args, grads)
        if _carries_grad(arg) and (arg.requires_grad or grad is not None)
    }
    _follow(trace.bound_symbols[:-1], reached, set(), cuts)
    return reached


def _updated_inputs(joint: TraceCtx) -> set:
    """The values of ``joint`` that are an input of the function updated in place: the output of a ``copy_``
    into an input (or into a name of the same tensor: thunder's ``update_aliases``, an earlier ``copy_``), and
    the names ``update_aliases`` gives it later."""
    tensors = {variableify(p) for p in tree_flatten((joint.args, joint.kwargs))[0] if isinstance(p, TensorProxy)}
    updated: set = set()
    for bsym in joint.bound_symbols[:-1]:
        if bsym.sym.id == prims.PrimIDs.UPDATE_ALIASES:  # outputs: new names of its arguments, in order
            for arg, out in zip(tree_flatten(bsym.args)[0], bsym.flat_proxy_outs):
                if isinstance(arg, Proxy) and variableify(arg) in tensors:
                    tensors.add(variableify(out))
                    if variableify(arg) in updated:
                        updated.add(variableify(out))
        elif (
            bsym.sym.id == prims.PrimIDs.COPY_
            and len(bsym.args) >= 2
            and isinstance(bsym.args[1], TensorProxy)
            and variableify(bsym.args[1]) in tensors
            and isinstance(bsym.output, TensorProxy)
        ):
            tensors.add(variableify(bsym.output))
            updated.add(variableify(bsym.output))
    return updated


def _return_of(trace: TraceCtx) -> BoundSymbol | None:
    last = trace.bound_symbols[-1] if trace.bound_symbols else None
    return last if last is not None and last.sym.name == "python_return" and last.args else None


def _carries_grad(value: Any) -> bool:
    """A floating tensor-like proxy (thunder's distributed ops return ``FutureTensorProxy``)."""
    dtype = getattr(value, "dtype", None) if isinstance(value, Proxy) else None
    return isinstance(dtype, dtypes.dtype) and dtypes.is_inexact_dtype(dtype)


def _detached(value: Proxy) -> bool:
    """Computed under ``torch.no_grad()`` (thunder tags such results while interpreting)."""
    return ProxyTag.DETACHED_AUTOGRAD_GRAPH in value.tags


def _is_joint_return(args: tuple) -> bool:
    """thunder's joint forward-backward trace returns ``{"output", "flat_args", "fw_flat_out"}``
    (``output``: the gradients of ``flat_args``)."""
    return bool(args) and isinstance(args[0], dict) and {"output", "flat_args", "fw_flat_out"} <= args[0].keys()


def autograd_forward(original: Callable[..., Any]) -> Any:
    """thunder's autograd Function ``forward``, also marking the outputs the trace flagged, and summing the
    gradients of one tensor passed as several inputs in eager's order (:mod:`thunderplug.eager.tied_grads`)."""

    def forward(ctx: Any, *args: Any) -> Any:
        outputs = original(ctx, *args)
        # ThunderFunction's arguments: (return_none_instead_of_grads, compiled_backward, side_channel, saved_tensors,
        # saved_other, is_differentiable_outputs, flat_output, *flat_args); ThunderOutputFunction has no backward
        if callable(getattr(ctx, "compiled_backward", None)) and (tied := tied_grads.tied_positions(args[7:])):
            ctx.compiled_backward = tied_grads.sum_tied_in_backward(ctx.compiled_backward, tied)
        tensors = [o for o in (outputs if isinstance(outputs, (tuple, list)) else ()) if isinstance(o, torch.Tensor)]
        flagged = [o for o in tensors if o.__dict__.pop(_FLAG, False)]
        if flagged:
            ctx.mark_non_differentiable(*(getattr(ctx, "non_differentiable", None) or ()), *flagged)
        dirty = {id(o): o for o in tensors if o.__dict__.pop(_DIRTY, False)}
        # only an input of this Function can be marked dirty (torch raises otherwise)
        dirty = [o for o in dirty.values() if any(o is a for a in args)]
        if dirty:
            ctx.mark_dirty(*(getattr(ctx, "dirty_tensors", None) or ()), *dirty)
        return outputs

    return staticmethod(forward)
