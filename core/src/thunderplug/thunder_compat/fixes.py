"""Replacements for thunder 0.2.6 bugs that are not about subclasses: each only turns a crash or
a wrong gradient into what eager PyTorch does."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from thunder.core.codeutils import SigInfo
from thunder.core.compile_data import get_compile_data
from thunder.core.interpreter import INTERPRETER_SIGNALS, interpreter_needs_wrap, unwrap, wrap_const
from thunder.core.proxies import ProxyInterface, ProxyTag, TensorProxy
from thunder.core.pytree import tree_flatten
from thunder.core.trace import TraceCtx


def siginfo_from_name_and_args(original: Callable[..., Any]) -> Callable[..., Any]:
    """Tracing a ``torch.autograd.Function.apply`` whose arguments include an object thunder
    cannot proxy (a config dataclass, as torchao's ``matmul_with_hp_or_float8_args`` takes) fails
    with ``AttributeError: ... has no attribute 'name'``: name such constants instead."""

    def replacement(name: str, args: Any) -> SigInfo:
        from thunder.core.proxies import proxy

        signature = SigInfo(name)
        for index, arg in enumerate(args):
            named = arg if isinstance(arg, ProxyInterface) else proxy(arg)
            signature.args.append((named.name if isinstance(named, ProxyInterface) else f"_constant_{index}", None))
        return signature

    return staticmethod(replacement)


def function_apply_outer_grad_mode(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder tags a value computed under ``torch.no_grad()`` as detached (constant for autodiff).
    An ``autograd.Function`` whose forward computes its result under ``no_grad`` hands that tag to
    its own output, so autodiff never calls its backward: the inputs get no gradient and the
    output does not require grad, where eager differentiates it through ``backward``. As thunder
    already does for ``autograd_function_apply``, whether the output is detached is the grad mode
    at the ``apply`` call (thunder tags the outputs itself when that mode is off); inputs returned
    as they are keep their own tags."""

    def replacement(wrapped_cls: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(wrapped_cls, *args, **kwargs)
        compile_data = get_compile_data()
        grad_enabled = compile_data is not None and compile_data.is_grad_enabled
        if not active() or isinstance(result, INTERPRETER_SIGNALS) or not grad_enabled:
            return result
        arguments = ([unwrap(a) for a in args], {k: unwrap(v) for k, v in kwargs.items()})
        inputs = {id(a) for a in tree_flatten(arguments)[0]}
        for output in tree_flatten(unwrap(result))[0]:
            if isinstance(output, TensorProxy) and id(output) not in inputs:
                output.tags.discard(ProxyTag.DETACHED_AUTOGRAD_GRAPH)
        return result

    return replacement


def cross_entropy_label_smoothing(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder's ``F.cross_entropy`` with ``label_smoothing`` and class-index targets divides the
    *unmasked* smoothing term by the number (or weight) of the targets not ignored, so a mean loss
    with ``ignore_index`` hit is silently wrong, and with class weights it squeezes every unit dim
    (an error for a batch of one). The replacement is ATen's composition: ``(1 - e) * nll_loss +
    e / C * smooth``, where ``smooth`` is the (weighted) sum of ``-log_softmax`` over the classes,
    zero where the target is ignored, reduced as ``reduction`` says (``mean``: divided by the number
    or the total weight of the targets kept)."""

    def replacement(a: Any, /, target: Any, weight: Any, ignore_index: int, reduction: str, label_smoothing: float):
        if not active():
            return original(a, target, weight, ignore_index, reduction, label_smoothing)
        import thunder.torch as ltorch

        class_dim = 1 if a.ndim >= 2 else 0
        classes = a.shape[class_dim]
        logp = ltorch.log_softmax(a, class_dim)
        nll = ltorch.nll_loss(logp, target, weight, ignore_index, reduction)
        if weight is not None:
            logp = logp * ltorch.reshape(weight, [classes] + [1] * (a.ndim - 2))
        kept = ltorch.ne(target, ignore_index)
        smooth = ltorch.where(kept, ltorch.neg(ltorch.sum(logp, class_dim)), 0)
        if reduction == "none":
            total = smooth
        elif reduction == "sum":
            total = ltorch.sum(smooth)
        elif weight is None:
            total = ltorch.true_divide(ltorch.sum(smooth), ltorch.sum(kept))
        else:
            kept_targets = ltorch.reshape(ltorch.where(kept, target, 0), (-1,))
            target_weights = ltorch.reshape(ltorch.index_select(weight, 0, kept_targets), tuple(target.shape))
            total = ltorch.true_divide(ltorch.sum(smooth), ltorch.sum(ltorch.where(kept, target_weights, 0)))
        return nll * (1.0 - label_smoothing) + total * (label_smoothing / classes)

    return replacement


def autograd_function_apply(original: Callable[..., Any]) -> Callable[..., Any]:
    """thunder ignores ``non_differentiable_idx`` of ``torch.ops.higher_order.autograd_function_apply``:
    the outputs it lists are detached after the call, so no gradient flows into them, as in eager."""

    def replacement(fwd: Any, bwd: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(fwd, bwd, *args, **kwargs)
        indices = tuple(unwrap(kwargs["non_differentiable_idx"]) or ()) if "non_differentiable_idx" in kwargs else ()
        if not indices or not hasattr(result, "value"):
            return result
        return interpreter_needs_wrap(_detach_outputs)(result, wrap_const(indices))

    return replacement


def _detach_outputs(output: Any, indices: tuple) -> Any:
    import thunder.torch as ltorch

    if isinstance(output, (tuple, list)):
        return type(output)(
            ltorch.detach(o) if i in indices and isinstance(o, TensorProxy) else o for i, o in enumerate(output)
        )
    return ltorch.detach(output) if 0 in indices and isinstance(output, TensorProxy) else output


def insert_alias_updates(original: Callable[..., Any]) -> Callable[..., Any]:
    """thunder builds the augmented forward of an ``autograd.Function`` in a fresh trace that knows
    none of the names its ops use, so the alias updates it inserts for in-place ops (torchao's
    ``denormal_x -= mask`` in ``_f32_to_floatx_unpacked``) can reuse one (``Variable t5 is being
    overwritten``): the trace's names are reserved first."""

    def replacement(trace: TraceCtx, alias_tensor_indices: list[list[int]]) -> TraceCtx:
        trace.names.update(_names_in(trace.bound_symbols))
        trace.names.update(arg.name for arg in trace.args if isinstance(arg, ProxyInterface))
        return original(trace, alias_tensor_indices)

    return replacement


def _names_in(bound_symbols: list) -> set[str]:
    names: set[str] = set()
    for bsym in bound_symbols:
        names.update(p.name for p in (*bsym.flat_proxy_args, *bsym.flat_proxy_outs))
        names.update(_names_in(bsym.subsymbols))
    return names


def index_put_backward(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder's backward of ``torch.index_put`` returns ``(grad_a, grad_values)``, which its
    autodiff matches positionally with ``(a, indices, values, accumulate)``: ``values`` silently
    gets no gradient. The gradients are returned in the arguments' places instead."""

    def replacement(*args: Any) -> Any:
        grads = original(*args)
        if not active():
            return grads
        grad_a, grad_values = grads
        return grad_a, None, grad_values

    return replacement


def autocast_state_per_call(original: Callable[..., Any]) -> Callable[..., Any]:
    """thunder's ``_with_cache_info_ctx`` (it wraps each jitted function's ``get_computation_and_inputs``
    when ``thunder.jit`` is called), restoring the function's autocast stack after each call.

    ``populate_cache_info`` pushes the caller's autocast onto the compile data's stack on every
    call made under ``torch.autocast`` and never pops it: after one such call, every later
    compilation of the function applies autocast (a plain call after an autocast one returns
    bfloat16 where eager returns float32), and the stack grows by one entry per call."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        wrapped = original(fn)
        code, closure = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
        if code is None or closure is None or "weakref_cd" not in code.co_freevars:
            return wrapped
        compile_data_ref = closure[code.co_freevars.index("weakref_cd")].cell_contents

        def call(*args: Any, **kwargs: Any) -> Any:
            compile_data = compile_data_ref()
            stack = getattr(getattr(compile_data, "autocast_stack", None), "stack", None)
            depth = len(stack) if stack is not None else 0
            try:
                return wrapped(*args, **kwargs)
            finally:
                while stack is not None and len(stack) > depth:
                    stack.pop()

        return call

    return decorate


def interpret_letting_interrupts_through(original: Callable[..., Any]) -> Callable[..., Any]:
    """thunder's interpreter turns anything escaping its own machinery into an ``InterpreterError``
    (``Encountered exception KeyboardInterrupt: ... while tracing``), ``BaseException`` included:
    Ctrl-C while a function compiles, or ``sys.exit()`` inside it, then escapes ``except
    KeyboardInterrupt`` / ``except SystemExit``. Exceptions that are not ``Exception`` leave as
    themselves; every other error is wrapped as before."""
    from thunder.core.interpreter import InterpreterError

    def replacement(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
        interpreted = original(fn, *args, **kwargs)

        @functools.wraps(interpreted)
        def call(*call_args: Any, **call_kwargs: Any) -> Any:
            try:
                return interpreted(*call_args, **call_kwargs)
            except InterpreterError as error:
                cause = error.__cause__
                if isinstance(cause, BaseException) and not isinstance(cause, Exception):
                    raise cause from None
                raise

        return call

    return replacement
