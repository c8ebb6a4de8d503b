"""Autodiff above the subclass: a subclass op is differentiated like the outer torch op.

The gradient rule of ``TwoTensor.torch.mul`` re-emits the forward op and adds one backward
symbol, ``TwoTensor.torch.mul.backward``, whose decomposition is what torch's own autograd does
for ``torch.mul`` on TwoTensor values: ``torch.autograd.grad`` run on FakeTensor subclass
instances under ``make_fx``, so every backward ATen op also goes through the subclass's
``__torch_dispatch__`` (exactly as AOTAutograd does). Ops that only exist inside dispatch, such as
``torch._scaled_mm``, therefore never need a derivative, and gradients have the types eager
produces (a plain ``w`` multiplied with a TwoTensor gets a TwoTensor gradient).

This module builds the rules; ``symbols`` attaches them to the symbols it creates.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as torch_pytree
from thunder.core import dtypes, prims
from thunder.core.proxies import TensorProxy
from thunder.core.pytree import tree_flatten
from thunder.core.symbol import Symbol
from thunder.core.trace import get_tracectx

from thunderplug.subclass.residuals import save_backward_inputs
from thunderplug.subclass.unroll import SubclassDispatchError, call_key
from thunderplug.subclass.values import SubclassLayout, SubclassTensorProxy
from thunderplug.tracing.aten import active_table
from thunderplug.tracing.compilation import current_record
from thunderplug.tracing.fake import fake_mode
from thunderplug.tracing.trace_state import without_autocast


def grad_rule(display: str, forward: Symbol, backward: Symbol) -> Callable[..., Any]:
    """The gradient rule of ``forward``: itself, then ``backward``; an error names the op and the
    user's line where it was traced (from this compilation's record)."""

    def rule(*args: Any, **kwargs: Any) -> Any:
        try:
            return forward_and_backward(forward, backward, args, kwargs)
        except SubclassDispatchError as error:
            inputs = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, TensorProxy)]
            record = current_record()
            where = record.location_of(*call_key(display, inputs)) if record is not None else ""
            raise SubclassDispatchError(
                f"no gradient for {display}{where}: neither a claim nor the outer op's derivative works here ({error})"
            ) from error

    return rule


def forward_and_backward(forward: Symbol, backward: Symbol, args: tuple, kwargs: dict) -> Any:
    """A joint gradient rule: emit ``forward(*args)``, then ``backward(args, kwargs, cotangents)``
    for its differentiable outputs, and put the gradient it returns for each tensor argument."""
    trace = get_tracectx()
    scope = trace.peek_scope() if trace is not None else None
    result = forward(*args, **kwargs)
    forward_at = len(scope) - 1 if scope else None
    outputs = [o for o in tree_flatten(result)[0] if _differentiable(o)]
    inputs = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, TensorProxy)]
    constant = _constant_names(trace)
    wanted = tuple(not (x.name in constant or _frozen_input(x)) for x in inputs)
    if not any(wanted):
        return result
    cotangents = [prims.get_grad(o) for o in outputs]
    grads = backward(args, kwargs, cotangents, wanted)
    if forward_at is not None and scope[forward_at].sym is forward and scope[-1].sym is backward:
        _save_backward_inputs(scope, forward_at, cotangents)
    for value, grad, want in zip(inputs, grads, wanted):
        if want and grad is not None and _differentiable(value):
            prims.put_grad(value, grad)
    return result


def _save_backward_inputs(scope: list, forward_at: int, cotangents: list) -> None:
    from thunder.core.compile_data import get_compile_data

    table = active_table()
    compile_data = get_compile_data()
    record = current_record()
    if table is None or compile_data is None or record is None:
        return
    others = [ex for ex in compile_data.executors_list if getattr(ex, "aten", None) is not table]
    save_backward_inputs(scope, forward_at, cotangents, table, others, record.alive)


@functools.cache  # one function per torch op, so its backward symbol is built once
def vjp_of(torch_fn: Callable[..., Any]) -> Callable[..., Any]:
    """``vjp(args, kwargs, cotangents, wanted=None) -> one gradient (or None) per tensor argument``,
    computed by torch's autograd; run on fakes under make_fx it gives the backward's ATen graph.

    ``wanted`` (one flag per tensor argument) leaves out the arguments that need no gradient, as
    eager autograd does: a frozen quantized weight must not be differentiated (torchao's int4
    kernels have no derivative; NF4's ``linear_nf4`` takes another path for a weight requiring grad).

    The forward runs under the autocast it is traced in (the op's), the backward with autocast off,
    as eager's backward outside the ``torch.autocast`` block and thunder's computation traces run."""

    def vjp(args: tuple, kwargs: dict, cotangents: list, wanted: tuple[bool, ...] | None = None) -> list:
        flat, _ = torch_pytree.tree_flatten((args, kwargs))
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        inputs = [
            t
            for i, t in enumerate(tensors)
            if (t.dtype.is_floating_point or t.dtype.is_complex) and (wanted is None or wanted[i])
        ]
        if not inputs:
            return [None] * len(tensors)
        with torch.enable_grad():
            for t in inputs:
                t.requires_grad_(True)
            result = torch_fn(*args, **kwargs)
            outputs = [o for o in torch_pytree.tree_leaves(result) if isinstance(o, torch.Tensor) and o.requires_grad]
            with without_autocast():
                grads = torch.autograd.grad(outputs, inputs, cotangents[: len(outputs)], allow_unused=True)
        by_input = {id(t): g for t, g in zip(inputs, grads)}
        return [by_input.get(id(t)) for t in tensors]

    vjp.__name__ = f"vjp_{getattr(torch_fn, '__name__', 'op')}"
    return vjp


_constants: weakref.WeakKeyDictionary[Any, tuple[int, set[str], set[str]]] = weakref.WeakKeyDictionary()
_constants_lock = threading.Lock()


def _constant_names(trace: Any) -> set[str]:
    """Names of the trace's tensors that provably need no gradient: inputs that do not require
    grad and what is computed from them alone (thunder's autodiff differentiates by dtype, and
    intermediate proxies carry no reliable ``requires_grad``). Anything not shown constant is
    differentiated, so a gradient is never dropped. Extended incrementally per trace."""
    if trace is None:
        return set()
    with _constants_lock:
        if trace in _constants:
            done, constant, requiring = _constants[trace]
        else:
            args = [a for a in tree_flatten((trace.args, trace.kwargs))[0] if isinstance(a, TensorProxy)]
            done = 0
            constant = {a.name for a in args if not a.requires_grad}
            requiring = {a.name for a in args if a.requires_grad}
        bsyms = trace.bound_symbols
        for bsym in bsyms[done:]:
            if all(p.name in constant for p in bsym.flat_proxy_args if isinstance(p, TensorProxy)):
                constant.update(
                    o.name
                    for o in bsym.flat_proxy_outs
                    if isinstance(o, TensorProxy) and not o.requires_grad and o.name not in requiring
                )
        _constants[trace] = (len(bsyms), constant, requiring)
        return constant


def _frozen_input(proxy: TensorProxy) -> bool:
    """An input of the jitted function that does not require grad: its proxy was made from the
    real tensor (it has a provenance ``history``), so its ``requires_grad`` is the tensor's. The
    gradient transform renames rebuilt inputs, so they are not found by name in its new trace."""
    return not proxy.requires_grad and getattr(proxy, "history", None) is not None


def _differentiable(value: Any) -> bool:
    return isinstance(value, TensorProxy) and dtypes.is_inexact_dtype(value.dtype)


def tangent_layout(output: SubclassTensorProxy) -> SubclassLayout:
    """The layout assumed for the gradient of ``output``: its own, after ``__coerce_tangent_metadata__``
    (AOTAutograd's guess). A gradient arriving otherwise is converted by ``subclass_flatten`` with
    ``__coerce_same_metadata_as_tangent__``, or refused with a clear error."""
    with fake_mode():
        fake = output.fake()
        coerce = getattr(fake, "__coerce_tangent_metadata__", None)
        if coerce is not None:
            fake = coerce()
        return SubclassLayout.of(fake)


def forward_only(op: Symbol) -> Callable[..., Any]:
    """The rule of a boundary op: gradients reach subclass values through the subclass ops' rules,
    never through their inner tensors (inner tensors never require grad; a subclass built
    directly from tensors is a new autograd leaf in eager PyTorch too)."""

    def rule(*args: Any, **kwargs: Any) -> Any:
        return op(*args, **kwargs)

    return rule
