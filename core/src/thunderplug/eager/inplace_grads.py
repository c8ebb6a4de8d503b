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

First of all, an update through a view of a tensor (``x.t().add_(w)``, ``x[0].mul_(w)``) with grad: thunder writes
into the view and renames ``x`` afterwards, with nothing in the trace saying that the new ``x`` is computed from
the update (``w`` got no gradient and thunder's backward failed on ``assert not args``).
:func:`views_updated_functionally` computes such a tensor's values functionally, as eager's ``CopySlices``
differentiates them, and writes an input's final value back into it once; views whose update cannot be made
exact are refused by name, with the user's line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import thunder.torch as ltorch
from thunder.core import dtypes, prims
from thunder.core.prims import get_grad, put_grad
from thunder.core.proxies import NumberProxy, ProxyTag, TensorProxy, unvariableify, variableify
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
        trace = rewrite(views_updated_functionally(trace))
        return clobbered_reads_cloned(_updated_values_returned(original(trace, *args, **kwargs)))

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


# --- in-place updates through views ----------------------------------------------------------------------------
#
# thunder runs ``x.t().add_(w)`` as ``copy_(add(v, w), v)`` into the view ``v = t(x)``, and its alias-update pass
# renames ``x`` afterwards (``update_aliases``, whose gradient passes each new name's gradient to the old name):
# the values are right (the ``copy_`` writes into ``x``'s memory), but nothing in the trace says that the new
# ``x`` is computed from ``add(v, w)``. Autodiff then gives ``w`` no gradient (a later ``x * 2`` does not reach
# it; thunder's backward, reading no cotangent, fails on ``assert not args``) and sends ``x``'s gradient through
# the update unchanged. :func:`views_updated_functionally` writes such updates as eager's autograd sees them.

#: ``copy = value_before_updates(t)``: a copy of ``t`` whose gradient goes to ``t``; opaque, so that no fusion's
#: rematerialization reads ``t`` again after the update written back into it
value_before_updates = pythonex.register_operator(
    "value_before_updates", meta=lambda t: TensorProxy(like=t), fn=lambda t: t.clone()
)


def _value_before_updates_rule(t: TensorProxy) -> TensorProxy:
    copy = value_before_updates(t)
    put_grad(t, get_grad(copy))
    return copy


register_grad(value_before_updates.id, _value_before_updates_rule)

#: views whose elements are fixed elements of their base, whatever its strides: an update through one is undone
#: exactly by an ``index_copy`` into the base (``getitem`` only with ints, slices, None and Ellipsis)
_EXACT_VIEWS = frozenset({
    "t", "transpose", "permute", "movedim", "swapaxes", "swapdims", "select", "getitem", "narrow", "squeeze",
    "unsqueeze", "view", "view_as", "unflatten", "diagonal", "shallow_copy",
})

_SEVERAL_VIEWS = (
    "eager refuses to update in place a view returned with others (split, chunk, unbind) when gradients are involved"
)
_SHARED = "its elements share memory, which eager refuses to update in place"
#: why an update through the other views thunder knows cannot be made exact: eager raises too (RuntimeError), or
#: thunderplug cannot tell what eager does (NotImplementedError)
_REFUSED_VIEWS: dict[str, tuple[type[Exception], str]] = {
    **dict.fromkeys(
        ("split", "split_with_sizes", "tensor_split", "hsplit", "vsplit", "chunk", "unbind"),
        (RuntimeError, _SEVERAL_VIEWS),
    ),
    **dict.fromkeys(("expand", "expand_as"), (RuntimeError, _SHARED)),
    "unfold": (NotImplementedError, "its elements can share memory, and whether they do depends on its arguments"),
}
#: views whose elements depend on the tensor's strides at run time: neither updated through nor made again
_STRIDED: dict[str, tuple[type[Exception], str]] = {
    "as_strided": (NotImplementedError, "its elements depend on the strides of the tensor at run time"),
    "may": (
        NotImplementedError,
        "whether it returns a view of its input or a copy depends on the strides of the tensor at run time",
    ),
    "other": (
        NotImplementedError, "it reinterprets the tensor's memory (another dtype, or sparse or complex parts)"
    ),
}


class _Step:
    """One view op of a chain from a tensor to an alias of it: ``bsym`` (made the alias, its ``position``-th
    tensor output), ``refused`` (the error to raise for an update through it, and why; None where it is exact)
    and ``strided`` (its elements depend on the tensor's strides: it cannot be made again from a new value)."""

    __slots__ = ("bsym", "position", "refused", "strided")

    def __init__(
        self, bsym: BoundSymbol, position: int, refused: tuple[type[Exception], str] | None, strided: bool
    ) -> None:
        self.bsym, self.position, self.refused, self.strided = bsym, position, refused, strided

    def on(self, base: TensorProxy) -> TensorProxy:
        """The same view of ``base`` (recorded in the trace being built)."""
        outputs = tree_flatten(self.bsym.sym(base, *self.bsym.args[1:], **self.bsym.kwargs))[0]
        return [o for o in outputs if isinstance(o, TensorProxy)][self.position]


def _view_step(bsym: BoundSymbol, position: int) -> _Step | None:
    """The step a bound symbol making a view of its first argument adds to its ``position``-th tensor output's
    chain; None where that output is no view (a copy: ``x[index_tensor]``)."""
    if not bsym.args or not isinstance(bsym.args[0], TensorProxy):
        return None
    if bsym.sym in syms_that_may_return_views():
        return _Step(bsym, position, _STRIDED["may"], True)
    if bsym.sym not in syms_returning_views():
        return None
    name = bsym.sym.name
    if name == "getitem":
        key = bsym.args[1] if len(bsym.args) > 1 else ()
        items = key if isinstance(key, tuple) else (key,)
        if any(isinstance(i, (TensorProxy, list, tuple)) for i in items):
            return None  # advanced indexing: a copy, as in eager
        basic = (int, slice, NumberProxy, type(None), type(...))
        if any(isinstance(i, bool) or not isinstance(i, basic) for i in items):
            return _Step(bsym, position, _STRIDED["other"], True)
        return _Step(bsym, position, None, False)
    if any(isinstance(a, dtypes.dtype) for a in tree_flatten(bsym.args[1:])[0]):
        return _Step(bsym, position, _STRIDED["other"], True)
    if name == "detach":  # eager's autograd does not see an update through it: thunder's alias update, as before
        return None
    if name in _EXACT_VIEWS:
        return _Step(bsym, position, None, False)
    if name in _REFUSED_VIEWS:
        return _Step(bsym, position, _REFUSED_VIEWS[name], False)
    return _Step(bsym, position, _STRIDED.get(name, _STRIDED["other"]), True)


def _update_of(bsym: BoundSymbol) -> BoundSymbol | None:
    """The ``copy_`` that ends an in-place op (``bsym`` itself for a ``copy_``), or None."""
    if bsym.sym.id == prims.PrimIDs.COPY_:
        return bsym if _is_copy(bsym) else None
    if bsym.subsymbols and _is_copy(bsym.subsymbols[-1]):
        return bsym.subsymbols[-1]
    return None


def _location(bsym: BoundSymbol) -> str:
    if bsym.source_filename is None or bsym.source_positions is None:
        return ""
    return f" (at {bsym.source_filename}:{bsym.source_positions.lineno})"


def _refuse_remaking(step: _Step) -> None:
    error, why = step.refused
    raise error(
        f"the result of {step.bsym.sym.name}{_location(step.bsym)} is read after its tensor is updated in place "
        f"through another view, with gradients involved; thunderplug cannot tell whether it sees the update: {why}. "
        f"Clone the {step.bsym.sym.name} result, or use view or indexing with ints and slices instead."
    )


def _walk(bsyms: list[BoundSymbol]) -> Iterator[tuple[BoundSymbol, BoundSymbol | None]]:
    """The bound symbols in order, an in-place op's decomposition before it (the ops computing the new value);
    with each, the ``copy_`` it ends with if it is an in-place op."""
    for bsym in bsyms:
        update = _update_of(bsym)
        if update is not None and update is not bsym:
            yield from _walk(bsym.subsymbols[:-1])
        yield bsym, update


class _Aliases:
    """Which tensor each value of a trace is (its root: a value no view op made) and through which views."""

    def __init__(self) -> None:
        self.chains: dict = {}  # variableified proxy -> (root, tuple of _Step)

    def of(self, p: TensorProxy) -> tuple[Any, tuple]:
        return self.chains.get(variableify(p), (variableify(p), ()))

    def note(self, bsym: BoundSymbol, update: BoundSymbol | None) -> None:
        """Record the outputs of ``bsym`` that are aliases of its arguments."""
        outputs = [o for o in bsym.flat_proxy_outs if isinstance(o, TensorProxy)]
        if bsym.sym.id == prims.PrimIDs.UPDATE_ALIASES:  # outputs: new names of its arguments, in order
            for arg, out in zip(tree_flatten(bsym.args)[0], outputs):
                if isinstance(arg, TensorProxy):
                    self.chains[variableify(out)] = self.of(arg)
        elif update is not None:  # the result of an in-place op is its destination
            for out in outputs:
                self.chains[variableify(out)] = self.of(update.args[1])
        elif _view_step(bsym, 0) is not None:
            root, chain = self.of(bsym.args[0])
            for position, out in enumerate(outputs):
                self.chains[variableify(out)] = (root, (*chain, _view_step(bsym, position)))


def _roots_updated_through_views(trace: TraceCtx) -> set:
    """The tensors (roots) of ``trace`` updated in place through a view, with grad enabled, where the gradient
    depends on it (the new value or the tensor requires grad); refuses an update of such a tensor that cannot be
    made exact."""
    aliases = _Aliases()
    inputs = tree_flatten((trace.args, trace.kwargs))[0]
    reached = {variableify(p) for p in inputs if isinstance(p, TensorProxy) and p.requires_grad}
    reached_roots: set = set()
    updates = []  # (bsym, its copy_, root, chain, reached)

    def is_reached(p: Any) -> bool:
        return isinstance(p, TensorProxy) and (variableify(p) in reached or aliases.of(p)[0] in reached_roots)

    for bsym, update in _walk(trace.bound_symbols[:-1]):
        feeds = bsym.sym.name != "detach" and any(is_reached(p) for p in bsym.flat_proxy_args)
        if update is not None:
            root, chain = aliases.of(update.args[1])
            updates.append((bsym, update, root, chain, feeds))
            if feeds and update.kwargs.get("grad_enabled", True):
                reached_roots.add(root)
        elif feeds:
            reached.update(
                variableify(o) for o in bsym.flat_proxy_outs
                if isinstance(o, TensorProxy) and ProxyTag.DETACHED_AUTOGRAD_GRAPH not in o.tags
            )
        aliases.note(bsym, update)
    roots = {
        root
        for _, update, root, chain, feeds in updates
        if chain and feeds and update.kwargs.get("grad_enabled") and type(unvariableify(root)) is TensorProxy
    }  # a tensor subclass's updates are left to the subclass compiler
    for bsym, _, root, chain, _ in updates:
        if root not in roots:
            continue
        for step in chain:
            if step.refused is not None:
                error, why = step.refused
                raise error(
                    f"{bsym.sym.name} updates in place the result of {step.bsym.sym.name}{_location(bsym)}, a view "
                    "of a tensor, with gradients involved; thunderplug cannot compute that update's gradient "
                    f"exactly: {why}. Update the tensor itself, or a view made by indexing with ints and slices, "
                    "select, narrow, view, (un)squeeze, transpose, permute or diagonal, or clone the "
                    f"{step.bsym.sym.name} result first."
                )
    return roots


def views_updated_functionally(trace: TraceCtx) -> TraceCtx:
    """``trace`` where the tensors updated in place through a view with grad (:func:`_roots_updated_through_views`)
    are computed functionally, as eager's autograd records such an update (``CopySlices``); ``trace`` itself where
    there are none.

    Every read of such a tensor, or of a view of it, reads its current value: first a copy of it
    (:data:`value_before_updates`; for a tensor the function computes, the tensor itself), then the value each
    update computes. An update through a view ``v`` of ``x`` becomes the ops computing the new value of ``v``, then
    ``x = index_copy(x, positions, new)`` (``positions``: the same views of ``arange(x.numel())``, so that every
    kind of view in :data:`_EXACT_VIEWS` is undone alike, by moving values only); a view read afterwards is made
    again from the new value. The values are never written into: what the backward reads stays as the forward
    read it. An input of the function gets its final value written back (one ``copy_`` into it, before the
    return), and a returned input or view of one is that input (a view of it), as in eager."""
    bsyms = trace.bound_symbols
    if not bsyms or bsyms[-1].sym.id != prims.PrimIDs.RETURN:
        return trace
    roots = _roots_updated_through_views(trace)
    if not roots:
        return trace
    inputs = {variableify(p) for p in tree_flatten((trace.args, trace.kwargs))[0] if isinstance(p, TensorProxy)}
    aliases = _Aliases()
    values: dict = {}  # root -> its current value
    versions: dict = {}  # root -> the number of updates made
    grad_enabled: dict = {}  # root -> the grad_enabled flag of its updates' copy_
    made: dict = {}  # variableified alias -> (version, the value made for it)
    rewritten = from_trace(trace)

    def value(root: Any) -> TensorProxy:
        if root not in values:
            values[root] = value_before_updates(unvariableify(root)) if root in inputs else unvariableify(root)
        return values[root]

    def read(p: Any) -> Any:
        if not isinstance(p, TensorProxy):
            return p
        root, chain = aliases.of(p)
        if root not in roots:
            return p
        if not chain:
            return value(root)
        version = versions.get(root, 0)
        known = made.get(variableify(p))
        if known is None or known[0] != version:
            base = value(root)
            for step in chain:
                if step.strided:
                    _refuse_remaking(step)
                base = step.on(base)
            known = made[variableify(p)] = (version, base)
        return known[1]

    def add(bsym: BoundSymbol) -> None:
        swap = {}
        for p in bsym.flat_proxy_args:
            new = read(p)
            if new is not p:
                swap[variableify(p)] = new
        rewritten.bound_symbols.append(bsym.from_bsym_swap_proxies(swap, skip_output=True) if swap else bsym)

    def update_functionally(bsym: BoundSymbol, update: BoundSymbol) -> None:
        """The ops of the in-place op ``bsym`` computing the new value, then the new value of its tensor."""
        process(bsym.subsymbols[:-1] if update is not bsym else [])
        root, chain = aliases.of(update.args[1])
        rewritten.push_scope([])
        source, base = read(update.args[0]), value(root)
        if chain:
            numel = math.prod(base.shape)
            positions = ltorch.reshape(ltorch.arange(numel, device=base.device, dtype=dtypes.int64), base.shape)
            for step in chain:
                positions = step.on(positions)
            flat = ltorch.index_copy(
                ltorch.reshape(base, (-1,)), 0, ltorch.reshape(positions, (-1,)), ltorch.reshape(source, (-1,))
            )
            source = ltorch.reshape(flat, base.shape)
        rewritten.bound_symbols.extend(rewritten.pop_scope())
        if not update.kwargs.get("grad_enabled", True):  # hidden from autograd, as in eager
            hidden = TensorProxy(like=source, requires_grad=base.requires_grad)
            rewritten.bound_symbols.append(same_gradient.bind(source, base, output=hidden))
            source = hidden
        values[root], versions[root] = source, versions.get(root, 0) + 1
        grad_enabled[root] = grad_enabled.get(root, False) or update.kwargs.get("grad_enabled", True)

    def process(bound_symbols: list[BoundSymbol]) -> None:
        for bsym in bound_symbols:
            update = _update_of(bsym)
            if update is not None and aliases.of(update.args[1])[0] in roots:
                update_functionally(bsym, update)
            elif bsym.sym.id == prims.PrimIDs.UPDATE_ALIASES:  # the names of the tensors above are not needed
                pairs = [
                    (arg, out) for arg, out in zip(tree_flatten(bsym.args)[0], bsym.flat_proxy_outs)
                    if not (isinstance(arg, TensorProxy) and aliases.of(arg)[0] in roots)
                ]
                if len(pairs) == len(bsym.flat_proxy_outs):
                    add(bsym)
                elif pairs:
                    kept = tuple(arg for arg, _ in pairs)
                    add(prims.update_aliases.bind(kept, output=tuple(out for _, out in pairs)))
                for arg, out in zip(tree_flatten(bsym.args)[0], bsym.flat_proxy_outs):
                    if isinstance(arg, TensorProxy) and variableify(arg) in made:
                        made[variableify(out)] = made[variableify(arg)]
            else:
                add(bsym)
                if _view_step(bsym, 0) is not None and aliases.of(bsym.args[0])[0] in roots:
                    version = versions.get(aliases.of(bsym.args[0])[0], 0)
                    tensors = [o for o in bsym.flat_proxy_outs if isinstance(o, TensorProxy)]
                    made.update((variableify(o), (version, o)) for o in tensors)
            aliases.note(bsym, update)

    with tracectx(rewritten):
        process(bsyms[:-1])
        # the inputs get their final values, the returned ones (and views of them) are the inputs
        memory: dict = {}
        rewritten.push_scope([])
        for root in sorted(roots & inputs, key=lambda r: unvariableify(r).name):
            if versions.get(root):
                memory[root] = prims.copy_(values[root], unvariableify(root), grad_enabled=grad_enabled[root])
        swap = {}
        for p in bsyms[-1].flat_proxy_args:
            root, chain = aliases.of(p) if isinstance(p, TensorProxy) else (None, ())
            if root in memory and not any(step.strided for step in chain):
                base = memory[root]
                for step in chain:
                    base = step.on(base)
                swap[variableify(p)] = base
            elif root in roots:
                swap[variableify(p)] = read(p)
        rewritten.bound_symbols.extend(rewritten.pop_scope())
        rewritten.bound_symbols.append(bsyms[-1].from_bsym_swap_proxies(swap) if swap else bsyms[-1])
    return rewritten
