"""Replacements for thunder 0.2.6 bugs that are not about subclasses: each only turns a crash or
a wrong gradient into what eager PyTorch does."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import os
import sysconfig
import threading
import types
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from thunder.core import dtypes, prims
from thunder.core.codeutils import SigInfo
from thunder.core.compile_data import get_compile_data
from thunder.core.interpreter import INTERPRETER_SIGNALS, interpreter_needs_wrap, unwrap, wrap_const
from thunder.core.prims import get_grad, put_grad
from thunder.core.proxies import ProxyInterface, ProxyTag, TensorProxy
from thunder.core.pytree import tree_flatten, tree_map
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, from_trace, get_tracectx
from thunder.core.transforms import augmented_forward_impls, backward_impls
from thunder.executors import torchex
from thunder.extend import ImplInfo

from thunderplug.eager.output_grads import requires_grad_while_tracing
from thunderplug.thunder_compat import function_apply_parts, interpret_call, torch_to_thunder_function_map
from thunderplug.tracing.aten import DataDependentShapeError


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


_pending_needs_input_grad = threading.local()


def function_apply_needs_input_grad(
    original: Callable[..., Any], active: Callable[[], bool], cuts: Callable[[BoundSymbol], bool]
) -> Callable[..., Any]:
    """thunder's ``ctx`` of an ``autograd.Function`` has no ``needs_input_grad`` (eager's engine sets it:
    ``AttributeError`` in a backward that reads it): the ctx proxy thunder makes during this ``apply`` gets eager's
    tuple, one flag per ``forward`` argument, a tensor's whether it requires grad under grad mode
    (``output_grads.requires_grad_while_tracing`` with ``cuts``), others False."""

    def replacement(wrapped_cls: Any, *args: Any, **kwargs: Any) -> Any:
        if not active():
            return original(wrapped_cls, *args, **kwargs)
        compile_data = get_compile_data()
        grad_enabled = compile_data is not None and compile_data.is_grad_enabled
        flags = tuple(
            grad_enabled and isinstance(a, TensorProxy) and requires_grad_while_tracing(a, cuts)
            for a in (unwrap(x) for x in args)
        )
        stack = _pending_needs_input_grad.__dict__.setdefault("stack", [])
        stack.append(flags)
        try:
            return original(wrapped_cls, *args, **kwargs)
        finally:
            stack.pop()

    return replacement


def ctx_proxy_init(original: Callable[..., Any]) -> Callable[..., Any]:
    """A ctx proxy made by an ``apply`` of :func:`function_apply_needs_input_grad` gets its ``needs_input_grad``
    and eager's ``mark_non_differentiable`` (not through ``__setattr__``, which would make them constants passed
    to the backward); :func:`function_apply_outputs` honours the marks."""

    def replacement(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        stack = getattr(_pending_needs_input_grad, "stack", None)
        if stack:
            self.__dict__["needs_input_grad"] = stack[-1]
            marked: list[Any] = []
            self.__dict__[_NON_DIFFERENTIABLE] = marked
            self.__dict__["mark_non_differentiable"] = lambda *tensors: marked.extend(tensors)

    return replacement


_NON_DIFFERENTIABLE = "_thunderplug_non_differentiable"


def function_apply_outputs(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder's ``Function.apply`` lookaside differentiates only a forward with one output (its grad transform
    refuses others: ``has 2 proxies but expected 1``) and knows no ``ctx.mark_non_differentiable``. For a forward
    with several outputs or marks, the op's grad transform is replaced by eager's engine's: the outputs marked
    non-differentiable (and those not floating) do not require grad, and the backward gets one cotangent per
    output, zeros where an output is marked or not floating (eager's materialized grads)."""

    def replacement(wrapped_cls: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(wrapped_cls, *args, **kwargs)
        if not active() or isinstance(result, INTERPRETER_SIGNALS):
            return result
        outputs = tree_flatten(unwrap(result))[0]
        bsym = _bound_symbol_of(outputs)
        if bsym is None:
            return result
        from thunder.core.jit_ext import get_jit_ctx

        executor = get_jit_ctx().ad_hoc_executor
        impl = executor.implmap.get(bsym.sym.name)
        parts = function_apply_parts(impl.grad_transform) if impl is not None else None
        if parts is None:
            return result
        augmented, ctx_proxy, backward = parts
        primals = augmented.output[0] if isinstance(augmented.output, tuple) else None
        marks = {t.name for t in ctx_proxy.__dict__.get(_NON_DIFFERENTIABLE, ()) if isinstance(t, TensorProxy)}
        if primals is None or (len(primals) == 1 and not marks):
            return result
        constant = tuple(
            not isinstance(p, TensorProxy) or p.name in marks or not _floating(p) for p in primals
        )
        executor.register_implementation(
            bsym.sym, execution_transform=impl.execution_transform,
            grad_transform=_grad_transform(augmented, ctx_proxy, backward, constant),
        )  # fmt: skip
        marked = [i for i, p in enumerate(primals) if isinstance(p, TensorProxy) and p.name in marks and _floating(p)]
        if not marked:
            return result
        from thunder.core.interpreter import wrap

        detach = torch_to_thunder_function_map()[torch.Tensor.detach]
        value = unwrap(result)
        flat = [detach(t) if i in marked else t for i, t in enumerate(value if isinstance(value, tuple) else (value,))]
        return wrap(tuple(flat) if isinstance(value, tuple) else flat[0], provenance=result.provenance)

    return replacement


def _floating(t: TensorProxy) -> bool:
    from thunder.core import dtypes

    return dtypes.is_inexact_dtype(t.dtype)


def _bound_symbol_of(outputs: list[Any]) -> Any:
    """The bound symbol of the current trace whose outputs are ``outputs`` (the op the lookaside recorded)."""
    from thunder.core.trace import get_tracectx

    trace = get_tracectx()
    names = [t.name for t in outputs if isinstance(t, TensorProxy)]
    if trace is None or not names:
        return None
    for bsym in reversed(trace.bound_symbols):
        if [t.name for t in bsym.flat_proxy_outs if isinstance(t, TensorProxy)] == names:
            return bsym
    return None


def _grad_transform(augmented: Any, ctx_proxy: Any, backward: Callable[..., Any], constant: tuple[bool, ...]):
    """The grad transform of one ``apply`` with several outputs: cotangents of every output to ``backward``."""

    def grad_transform(*args: Any, **kwargs: Any) -> Any:
        import thunder.torch as ltorch
        from thunder.core.trace_interpreter import interpret_trace
        from thunder.core.transforms import get_grad, put_grads

        primal, residuals = interpret_trace(augmented, *args, **kwargs)
        grads = tuple(
            ltorch.zeros_like(p) if is_constant else get_grad(p) for p, is_constant in zip(primal, constant)
        )
        residuals = tuple(residuals) if isinstance(residuals, (tuple, list)) else (residuals,)
        put_grads(args, backward(*ctx_proxy.saved_consts, *residuals, *grads))
        return primal

    return grad_transform


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


def checkpoint_reentrant(
    original: Callable[..., Any], active: Callable[[], bool], cuts: Callable[[BoundSymbol], bool]
) -> Callable[..., Any]:
    """``torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=True)`` (eager's default when
    ``use_reentrant`` is not passed; HF's ``gradient_checkpointing_enable(gradient_checkpointing_kwargs=
    {"use_reentrant": True})``) fails in thunder (its lookaside raises a string: ``TypeError: exceptions must
    derive from BaseException``), and an omitted ``use_reentrant`` was traced as ``False``. Recomputing in
    the backward changes no value, so both forms are traced as thunder's checkpoint; where eager's reentrant
    form differs, no tensor argument requiring grad, its outputs require no grad and nothing inside gets a
    gradient: they are detached, as eager's ``CheckpointFunction`` leaves them (whether an argument requires
    grad: ``output_grads.requires_grad_while_tracing`` with ``cuts``)."""

    def replacement(function: Any, *args: Any, **kwargs: Any) -> Any:
        if not active():
            return original(function, *args, **kwargs)
        reentrant = unwrap(kwargs.pop("use_reentrant", None))
        reentrant = True if reentrant is None else bool(reentrant)
        inputs = [a for a in tree_flatten([unwrap(a) for a in args])[0] if isinstance(a, TensorProxy)]
        detach = reentrant and not any(requires_grad_while_tracing(t, cuts) for t in inputs)
        result = original(function, *args, use_reentrant=wrap_const(False), **kwargs)
        if not detach or isinstance(result, INTERPRETER_SIGNALS):
            return result
        return interpreter_needs_wrap(_detach_all)(result)

    return replacement


def _detach_all(output: Any) -> Any:
    import thunder.torch as ltorch
    from thunder.core.pytree import tree_map

    return tree_map(lambda o: ltorch.detach(o) if isinstance(o, TensorProxy) else o, output)


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


def nested_argument_grads(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder's autodiff (``transforms/autodiff.py:grad_transform_on_trace``) builds the joint forward and
    backward of a symbol without a grad transform from its ``augmented_forward_impls``/``backward_impls`` pair,
    and there puts each gradient to its argument only where the argument is itself a tensor: a tensor inside a
    tuple or list argument gets none, silently. ``nn.LSTMCell`` in a Python loop passes the previous step's
    ``(h, c)`` as one tuple to ``torch.lstm_cell`` (a symbol thunder registered automatically), so no gradient
    reached the earlier steps (the cell's weights 2e-1 off eager's after two steps). For such a call (a tuple or list
    argument holding a tensor) the joint is built here the same way, with each gradient put to the tensor in the
    place it came from."""

    def replacement(bsym: Any, *, executors_list: Sequence[Any] = ()) -> tuple[Any, Any]:
        found = original(bsym, executors_list=executors_list)
        if found[0] is not None or not active() or bsym.sym.id not in augmented_forward_impls:
            return found
        if not any(isinstance(a, (tuple, list)) and any(isinstance(x, TensorProxy) for x in tree_flatten(a)[0])
                   for a in bsym.args):
            return found
        return _nested_joint(bsym), None

    return replacement


def _put_nested_grad(arg: Any, grad: Any) -> None:
    if isinstance(arg, TensorProxy):
        if grad is not None:
            put_grad(arg, grad)
    elif isinstance(arg, (tuple, list)) and isinstance(grad, (tuple, list)):
        for a, g in zip(arg, grad, strict=True):
            _put_nested_grad(a, g)


def _nested_joint(bsym: Any) -> Callable[..., Any]:
    """thunder's ad hoc joint of ``bsym`` (the inputs it returns shallow-copied, as thunder's are, so that their
    gradients are edges of their own), its gradients put through nested tuple and list arguments."""
    augmented, backward = augmented_forward_impls[bsym.sym.id], backward_impls[bsym.sym.id]
    argument_names = {a.name for a in bsym.flat_proxy_args}

    def joint(*args: Any, **kwargs: Any) -> Any:
        result, saved = augmented(*args, **kwargs)
        result = tree_map(
            lambda p: prims.shallow_copy(p) if isinstance(p, TensorProxy) and p.name in argument_names else p, result
        )
        grads_out = [get_grad(r) for r in tree_flatten(result)[0] if isinstance(r, TensorProxy)]
        grads_in = backward(*saved, *grads_out)
        if isinstance(grads_in, TensorProxy):
            grads_in = (grads_in,)
        for arg, grad in zip(args, grads_in):
            _put_nested_grad(arg, grad)
        return result

    return joint


def _masked_cotangent(g: torch.Tensor, index: Any, shape: tuple[int, ...]) -> torch.Tensor:
    """``g[index]`` summed to ``shape`` (the value was broadcast to the selected elements), as eager's
    ``IndexPutBackward`` gives the value its gradient."""
    selected = g[index]
    while selected.dim() > len(shape):
        selected = selected.sum(0)
    dims = [i for i, size in enumerate(shape) if size == 1 and selected.shape[i] != 1]
    return selected.sum(dims, keepdim=True) if dims else selected


#: the gradient of the value of ``a[mask] = value``: a shape the trace knows (the value's), computed opaquely,
#: since the elements it selects (``g[mask]``) are a data-dependent shape for a thunder trace
masked_cotangent = torchex.ex.register_operator(
    "masked_cotangent", meta=lambda g, index, shape: TensorProxy(like=g, shape=shape), fn=_masked_cotangent
)


def boolean_mask_setitem_grad(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder's gradient of ``a[mask] = value`` (``copy_with_setitem``) gives the value ``g[mask]``, which a
    thunder trace refuses (a boolean mask's selection has a data-dependent shape): the forward traced, and its
    gradient raised ``DataDependentShapeError`` again in the graphs Dynamo captured after a graph break
    (torchvision's ``_loss_inter_union``: ``inter[mask] = (x2[mask] - x1[mask]) * ...``). Its shape is the value's
    (the forward checked it): the gradient is :data:`masked_cotangent`, run by torch."""

    def rule(a: TensorProxy, index: Any, value: Any) -> TensorProxy:
        masks = [i for i in tree_flatten(index)[0] if isinstance(i, TensorProxy) and i.dtype is dtypes.bool8]
        if not active() or not isinstance(value, TensorProxy) or not masks:
            return original(a, index, value)
        result = prims.copy_with_setitem(a, index, value)
        g = get_grad(result)
        put_grad(a, prims.copy_with_setitem(g, index, 0))
        put_grad(value, masked_cotangent(g, index, tuple(value.shape)))
        return result

    return rule


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


def zeros_of_no_dims(original: ImplInfo, active: Callable[[], bool]) -> ImplInfo:
    """thunder's autodiff gives a value no gradient reached the gradient ``ltorch.zeros(*shape)``, which its torch
    executor runs as ``torch.zeros(*shape)``: for a 0-dim value ``torch.zeros()``, which torch refuses (``TypeError:
    zeros() received an invalid combination of arguments``; the backward of ``torch.var_mean(x)[0]`` or of
    ``torch.aminmax(x).max``, whose other output is unused). The empty shape is passed as a tuple instead."""
    transform = original.execution_transform

    def replacement(*shape: Any, device: Any = None, dtype: Any = None) -> Any:
        if not shape and active():
            shape = ((),)
        return transform(*shape, device=device, dtype=dtype)

    return ImplInfo(symbol=original.symbol, checker=original.checker, execution_transform=replacement,
                    grad_transform=original.grad_transform)


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


def general_jit_lookaside(
    original: Callable[..., Any], runs_fn_itself: Callable[[Any], bool], active: Callable[[], bool]
) -> Callable[..., Any]:
    """thunder's jit asks, for every call the interpreter makes, whether an argument is a sequence holding
    a tensor, by iterating it outside the interpreter: a user-defined ``Sequence`` runs its own
    ``__iter__`` there, even as ``self`` of its ``__init__`` before any attribute is set (transformers'
    ``_PerLayerConfigView``: ``AttributeError: ... no attribute '_config'``). The answer only matters for
    functions thunder runs itself (opaque functions, symbols, clang functions), so for the others such
    arguments are not shown to it."""

    def replacement(fn: Any, *args: Any, **kwargs: Any) -> Any:
        # asked for every call the interpreter makes: the rare case is tested first
        if not any(_is_user_sequence(a) for a in args) or not active() or runs_fn_itself(fn):
            return original(fn, *args, **kwargs)
        return original(fn, *(a for a in args if not _is_user_sequence(a)), **kwargs)

    return replacement


def _is_user_sequence(arg: Any) -> bool:
    value = getattr(arg, "value", None)
    return isinstance(value, Sequence) and not isinstance(value, (list, tuple, str, bytes, range))


def cat_lookaside(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """Eager ``torch.cat`` skips 1-D empty tensors (``torch.tensor([])``, the legacy placeholder that
    transformers' ``DynamicLayer`` starts its key/value cache with) when concatenating along a dimension
    they do not have; thunder checks the dimension against them and fails (``Expected dimension in
    inclusive range of -1 and 0``). They are left out, and the result keeps the dtype all the inputs
    promote to, as in eager."""
    from thunder.core.jit_ext import ensure_recursive_proxies, record_source_loc_in_symbol_header

    ours = ensure_recursive_proxies(interpreter_needs_wrap(record_source_loc_in_symbol_header(_cat_like_eager)))

    def replacement(*args: Any, **kwargs: Any) -> Any:
        return ours(*args, **kwargs) if active() else original(*args, **kwargs)

    return replacement


def _cat_like_eager(tensors: Any, dim: int = 0) -> Any:
    import thunder.torch as ltorch
    from thunder.core import utils

    tensors = list(tensors)
    kept = [t for t in tensors if not (isinstance(t, TensorProxy) and t.ndim == 1 and t.shape[0] == 0)]
    if not kept or len(kept) == len(tensors):
        return ltorch.cat(tensors, dim)
    kind = utils.ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
    _, dtype = utils.elementwise_type_promotion(*tensors, type_promotion_kind=kind)
    result = ltorch.cat(kept, dim)
    return result if result.dtype == dtype else ltorch.to(result, dtype)


def process_recorded_modifications(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder replays, after the computation, every write the function made to a dict it did not create as a
    local, including the ``_buffers`` of a module the function constructs itself (transformers'
    ``BertForMaskedLM`` builds ``CrossEntropyLoss()`` in its forward), and fails (``AssertionError``) finding
    no parameter path for it. An object made inside the function is gone (or returned) when it ends: its
    writes are not replayed."""
    from thunder.core.interpreter import PseudoInst

    def made_inside(provenance: Any) -> bool:
        while provenance.inst in (PseudoInst.LOAD_ATTR, PseudoInst.BINARY_SUBSCR) and provenance.inputs:
            provenance = provenance.inputs[0]
        if provenance.inst is PseudoInst.NEW:
            return True
        if provenance.inst is PseudoInst.OPAQUE and provenance.inputs:
            called = provenance.inputs[0]
            return called.inst is PseudoInst.CONSTANT and getattr(called.value, "__name__", None) == "__new__"
        return False

    def replacement(ctx: Any, epilogue_trace: Any) -> Any:
        if not active():
            return original(ctx, epilogue_trace)
        writes = ctx._additional_outputs
        local = {obj: writes.pop(obj) for obj in list(writes) if made_inside(obj.provenance)}
        for obj in writes:
            _write_back_to_the_jitted_module(obj)
        recorded = dict(writes)
        for obj in writes:
            writes[obj] = _replay_plain_attributes(obj, writes[obj], epilogue_trace)
        try:
            return original(ctx, epilogue_trace)
        finally:
            writes.update(recorded)
            writes.update(local)

    return replacement


def _rebuild_object(cls: type, attributes: dict) -> Any:
    obj = cls.__new__(cls)
    obj.__dict__.update(attributes)
    return obj


def _make_named_tuple(cls: type, items: list) -> tuple:
    return cls._make(items)


_rebuilding = threading.local()


def build_objects_made_inside(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder rebuilds the function's result after the computation (in its epilogue) from tensors, numbers,
    strings, containers and dataclasses, and fails on any other object the function made and returns
    (``NotImplementedError: unhandled value of type DynamicCache``: transformers' causal LMs return their
    KV cache under the config's default ``use_cache=True``, in training too). Such an object of a plain
    Python class (not a module, function, class or tensor) is rebuilt as eager returns it: a new instance of
    its class (``__new__``, not ``__init__``) whose ``__dict__`` holds its attributes, each rebuilt the same
    way (the cache's layers and their key and value tensors, outputs of the computation). An object reached
    twice in the result is rebuilt twice (two objects where eager has one); one that holds itself is refused.
    A value thunder kept no wrapper for, or a stale one (it returned those as they were in tracing: Falcon's and
    BLOOM's cache in their ``return_dict=False`` tuples held proxies, silently; an attribute written through
    ``obj.__dict__`` came back with its earlier value) is rebuilt from its values when tracing left
    proxies, dtypes or devices in it, and kept as it is otherwise. A NamedTuple is made from its items by
    ``_make`` (thunder called its constructor with one list)."""
    from thunder.core import baseutils, codeutils, devices, dtypes
    from thunder.core.jit_ext import should_register_for_prologue
    from thunder.core.proxies import AnyProxy
    from thunder.core.symbol import Symbol
    from thunder.core.trace import get_tracectx

    rebuild = Symbol(name="thunderplug_rebuild_object", meta=None, id="thunderplug.rebuild_object", is_prim=True)
    make_named_tuple = Symbol(name="thunderplug_make_named_tuple", meta=None, id="thunderplug.make_named_tuple",
                              is_prim=True)
    not_objects = (ProxyInterface, codeutils.ContextObject, torch.finfo, dtypes.dtype, devices.Device, tuple, list,
                   dict, type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                   torch.nn.Module, torch.Tensor)

    def plain_object(value: Any) -> bool:
        return not (
            isinstance(value, not_objects) or type(value) in (str, object) or baseutils.is_base_printable(value)
            or dataclasses.is_dataclass(value) or baseutils.is_collection(value)
            or not isinstance(getattr(value, "__dict__", None), dict)
        )

    def named_tuple(value: Any) -> bool:
        return isinstance(value, tuple) and isinstance(getattr(type(value), "_fields", None), tuple)

    def rebuildable(wrapped: Any) -> bool:
        if hasattr(wrapped, "anyproxy") or should_register_for_prologue(wrapped.provenance):
            return False
        return plain_object(unwrap(wrapped))

    def traced(value: Any) -> bool:
        return isinstance(value, (dtypes.dtype, devices.Device)) or _holds_proxy(value)

    def rebuilt(value: Any, attribute: Callable[[str, Any], Any]) -> Any:
        rebuilding = _rebuilding.__dict__.setdefault("ids", set())
        if id(value) in rebuilding:
            raise NotImplementedError(
                f"thunderplug: the jitted function returns a {type(value).__qualname__} that holds itself; thunder "
                "0.2.6 rebuilds returned objects after the compiled call and cannot rebuild a cycle. Return its "
                "tensors instead"
            )
        rebuilding.add(id(value))
        try:
            attributes = {key: attribute(key, item) for key, item in value.__dict__.items()}
        finally:
            rebuilding.discard(id(value))
        output = AnyProxy(None)
        get_tracectx().bound_symbols.append(
            rebuild.bind(type(value), attributes, output=output, _call_ctx={rebuild.name: _rebuild_object})
        )
        return output

    def rebuilt_unwrapped(value: Any) -> Any:
        """A value thunder kept no wrapper for (an item appended to a list of an object, or put in a container
        through a path thunder does not track): as eager has it, if tracing left proxies, dtypes or devices in it;
        else itself (an object that came in keeps its identity)."""
        if isinstance(value, ProxyInterface) or not traced(value):
            return value
        if isinstance(value, dtypes.dtype):
            return dtypes.to_torch_dtype(value)
        if isinstance(value, devices.Device):
            return devices.to_torch_device(value)
        if type(value) in (list, tuple):
            return type(value)(rebuilt_unwrapped(item) for item in value)
        if named_tuple(value):
            return named_tuple_made(type(value), [rebuilt_unwrapped(item) for item in value])
        if type(value) is dict:
            return {key: rebuilt_unwrapped(item) for key, item in value.items()}
        if plain_object(value):
            return rebuilt(value, lambda key, item: rebuilt_unwrapped(item))
        return value

    def dict_rebuilt(wrapped: Any) -> Any:
        """A dict, item by item: thunder's rebuild returned an item it has no current wrapper for as it was in
        tracing, and made a key that came from the function's inputs (a layer's index) a proxy of that input,
        which cannot be hashed (``unhashable type: 'AnyProxy'``: the ``is_updated`` dict of T5's and Whisper's
        ``EncoderDecoderCache``); a number or string key is its value here, other keys are rebuilt as before."""
        value, wrappers, key_wrappers = unwrap(wrapped), wrapped.item_wrappers, wrapped.key_wrappers
        rebuilt_dict = {}
        for key, item in value.items():
            wrapper, key_wrapper = wrappers.get(key), key_wrappers.get(key)
            if type(key) not in (int, str, float, bool) and key_wrapper is not None:
                key = replacement(key_wrapper)
            current = wrapper is not None and unwrap(wrapper) is item
            rebuilt_dict[key] = replacement(wrapper) if current else rebuilt_unwrapped(item)
        return rebuilt_dict

    def sequence_rebuilt(wrapped: Any) -> Any:
        """thunder's rebuild of a list or tuple returns an item it has no wrapper for as it was in tracing,
        proxies and all (transformers' ``DynamicCache`` in Falcon's ``return_dict=False`` tuple)."""
        value, result = unwrap(wrapped), original(wrapped)
        if type(result) not in (list, tuple) or len(result) != len(value):
            return result
        wrappers = wrapped.item_wrappers or [None] * len(value)
        return type(result)(item if wrappers[i] is not None else rebuilt_unwrapped(item)
                            for i, item in enumerate(result))

    def named_tuple_rebuilt(wrapped: Any) -> Any:
        """thunder's rebuild calls ``type(value)(items)`` for every tuple, which a NamedTuple's constructor refuses
        (``NT.__new__() missing 1 required positional argument``): its items go through ``_make``."""
        value = unwrap(wrapped)
        wrappers = wrapped.item_wrappers or [None] * len(value)
        return named_tuple_made(type(value), [replacement(wrappers[i]) if wrappers[i] is not None
                                              else rebuilt_unwrapped(item) for i, item in enumerate(value)])

    def named_tuple_made(cls: type, items: list) -> Any:
        """The NamedTuple made in the trace by a call (traces print a tuple subclass as its class's name, which
        the trace's globals lack)."""
        output = AnyProxy(None)
        get_tracectx().bound_symbols.append(
            make_named_tuple.bind(cls, items, output=output, _call_ctx={make_named_tuple.name: _make_named_tuple})
        )
        return output

    def replacement(wrapped: Any) -> Any:
        if not active():
            return original(wrapped)
        value = unwrap(wrapped)
        if type(value) is dict and isinstance(wrapped.item_wrappers, dict) and not hasattr(wrapped, "anyproxy"):
            return dict_rebuilt(wrapped)
        if type(value) in (list, tuple) and not hasattr(wrapped, "anyproxy"):
            return sequence_rebuilt(wrapped)
        if named_tuple(value) and not hasattr(wrapped, "anyproxy"):
            return named_tuple_rebuilt(wrapped)
        if not rebuildable(wrapped):
            return original(wrapped)

        def attribute(key: str, item: Any) -> Any:
            wrapper = wrapped.attribute_wrappers.get(key)  # stale after a write through __dict__ or vars()
            return replacement(wrapper) if wrapper is not None and unwrap(wrapper) is item else rebuilt_unwrapped(item)

        return rebuilt(unwrap(wrapped), attribute)

    return replacement


def dict_literals_keep_their_items(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder's handlers of ``BUILD_MAP`` and ``BUILD_CONST_KEY_MAP`` (``{"cache": cache, "y": y}``) build the
    dict from unwrapped values and forget each item's wrapper, as ``dict(cache=cache)`` and the list and tuple
    literals do not; the result is rebuilt after the call from its items' wrappers, so an object the function
    made and returns in such a dict (a cache holding tensors) reached the caller as it was during tracing,
    holding proxies where eager has tensors. The dict keeps its items' wrappers here, as thunder's keyword-argument
    dicts do."""
    from thunder.core.interpreter import ProvenanceRecord, get_interpretercompilectx, wrap

    def build_map_handler(inst: Any, /, **state: Any) -> Any:
        stack = state["stack"]
        if not active() or not get_interpretercompilectx()._with_provenance_tracking:
            return original(inst, **state)
        if inst.opname == "BUILD_CONST_KEY_MAP":
            keys = [wrap_const(key) for key in stack.pop()]
            values = list(reversed([stack.pop_wrapped() for _ in range(inst.arg)]))
        else:
            pairs = list(reversed([(stack.pop_wrapped(), stack.pop_wrapped()) for _ in range(inst.arg)]))
            keys, values = [key for _, key in pairs], [value for value, _ in pairs]
        items, item_wrappers, key_wrappers = {}, {}, {}
        for key, value in zip(keys, values, strict=True):  # a repeated key: the last value wins, as in Python
            items[key.value] = value.value
            item_wrappers[key.value], key_wrappers[key.value] = value, key
        inputs = [record for key, value in zip(keys, values) for record in (key.provenance, value.provenance)]
        result = wrap(items, provenance=ProvenanceRecord(inst, inputs=inputs))
        result.item_wrappers, result.key_wrappers = item_wrappers, key_wrappers
        stack.append(result)
        return None

    return build_map_handler


def starred_arguments_as_tuples(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder's handler of ``CALL_FUNCTION_EX`` (``f(*args)``) reads the starred value by ``len`` and index,
    so a value that is iterable but not a sequence (``x.permute(*reversed(range(x.ndim)))``, an iterator, a
    generator, a set) failed (``TypeError: object of type 'range_iterator' has no len()``), and a dict gave its
    values where Python gives its keys. Python makes a tuple of any iterable other than a tuple: so does this
    (``tuple(value)``, interpreted, so the iteration is traced as Python runs it)."""

    def handler(inst: Any, /, **state: Any) -> Any:
        stack = state["stack"]
        position = -2 if inst.arg & 0x01 else -1  # the starred value is under the ``**`` mapping, if any
        starred = stack.getitem_wrapped(position)
        if active() and not isinstance(unwrap(starred), (tuple, list)):
            as_tuple = interpret_call(tuple, starred)
            if as_tuple is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
                return as_tuple
            stack[position] = as_tuple
        return original(inst, **state)

    return handler


def newobj_made_inside(_no_lookaside: Any) -> Callable[..., Any]:
    """A lookaside for ``copyreg.__newobj__(cls)``, which ``copy.copy``, ``copy.deepcopy`` and pickle call to make
    the copy of an object (``cls.__new__(cls)``). thunder knows an object as made by the function only when
    ``object.__new__`` itself is called (``jit_ext.is_created_during_tracing``), so the copy's ``__dict__`` was
    taken for an outside one and filling it failed (``'MappingKeysView' object has no attribute '_mapping'``:
    transformers' ``config.get_text_config(decoder=True)``, which T5 and Whisper call to build their default
    ``EncoderDecoderCache``). For a class whose ``__new__`` is ``object.__new__``, that is what is called; other
    classes run copyreg's code as before. A lookaside of discover() compilations only."""
    import copyreg

    from thunder.core.interpreter import wrap_const

    newobj = copyreg.__newobj__
    unlooked = types.FunctionType(newobj.__code__, newobj.__globals__, newobj.__name__, newobj.__defaults__,
                                  newobj.__closure__)

    def lookaside(cls: Any, *args: Any) -> Any:
        if not args and isinstance(unwrap(cls), type) and unwrap(cls).__new__ is object.__new__:
            return interpret_call(wrap_const(object.__new__), cls)
        return interpret_call(unlooked, cls, *args)

    return lookaside


def dynamo_generation_tag(_no_lookaside: Any) -> Callable[..., Any]:
    """A lookaside for Dynamo's ``GenerationTracker.tag``, which Dynamo's ``nn.Module.__init__`` wrapper (installed
    once Dynamo has run in the process: a graph break, ``torch.compile``) calls on every module made. Interpreted,
    its ``id(obj) not in self.refs`` makes thunder wrap each item of that process-wide weak dictionary, whose
    weakref callbacks remove items meanwhile: ``RuntimeError: dictionary changed size during iteration`` (a module
    built inside the function, ``torch.nn.ReLU()(t)``, failing now and then). It is Dynamo's bookkeeping, run as
    itself. A lookaside of discover() compilations only."""
    from torch._dynamo.mutation_guard import GenerationTracker

    return interpreter_needs_wrap(GenerationTracker.tag.__func__)


def slices_clamped(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """``t[-4095:]`` of a dimension of 16 is all of it in Python and torch (a slice's start or stop below
    ``-length`` is clamped to 0); thunder's basic indexing refuses it (``start=-4095 is not a valid index for
    length 16``: transformers' sliding-window cache keeps ``[-sliding_window + 1:]`` of its keys, Mistral's
    default window being 4096). Such a bound is given to thunder as 0."""
    from thunder.core.proxies import NumberProxy

    def clamped(bound: Any, length: int) -> Any:
        return 0 if type(bound) is int and bound < -length else bound

    def replacement(a: Any, /, key: Any) -> Any:
        if not active() or not isinstance(key, list) or Ellipsis in key:
            return original(a, key)
        new_key, dim = [], 0
        for item in key:
            if isinstance(item, slice) and dim < a.ndim and isinstance(a.shape[dim], int):
                item = slice(clamped(item.start, a.shape[dim]), clamped(item.stop, a.shape[dim]), item.step)
            if item is not None and not isinstance(item, NumberProxy | slice | int):
                return original(a, key)
            dim += item is not None
            new_key.append(item)
        return original(a, new_key)

    return replacement


def config_attribute_map_getattr(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder's interpreter reads an attribute as ``object.__getattribute__`` does and never calls a class's own
    ``__getattribute__``; transformers' configs map standard names onto their own through one
    (``GPT2Config().num_hidden_layers`` is ``n_layer``: ``attribute_map``), so ``config.num_hidden_layers``
    failed with ``AttributeError`` (GPT-2 under ``use_cache=True``, whose ``DynamicCache(config=...)`` reads it).
    A name in the ``attribute_map`` of an object whose class overrides ``__getattribute__`` is read under the
    name it maps to, as that ``__getattribute__`` does."""

    def replacement(obj: Any, name: Any, *default: Any) -> Any:
        if active():
            value, key = unwrap(obj), unwrap(name)
            mapping = getattr(type(value), "attribute_map", None)
            if (
                type(value).__getattribute__ is not object.__getattribute__
                and isinstance(mapping, dict) and isinstance(key, str) and key != "attribute_map" and key in mapping
            ):
                name = wrap_const(mapping[key])
        return original(obj, name, *default)

    return replacement


def _replay_plain_attributes(attributes: Any, modifications: list, epilogue_trace: Any) -> list:
    """thunder replays an attribute write only when the value is a proxy, a number, a tuple, ``None`` or a
    device, and fails (``AssertionError``) on a dtype or a string: transformers 4.57's ``StaticCache``
    writes ``self.dtype = key_states.dtype`` when the first compiled call allocates it, stock thunder too.
    Such a write, the last of its attribute, is replayed here (the value as torch's: thunder's dtype becomes
    ``torch.dtype``); the modifications left for thunder are returned. A value neither can replay (a
    function) is refused by the attribute's path."""
    from thunder.core import devices, dtypes, prims
    from thunder.core.interpreter import PseudoInst
    from thunder.core.trace import tracectx

    provenance = attributes.provenance
    if not (
        isinstance(attributes.value, dict)
        and provenance.inst is PseudoInst.LOAD_ATTR
        and provenance.inputs[1].inst is PseudoInst.CONSTANT
        and provenance.inputs[1].value == "__dict__"
        and hasattr(provenance.inputs[0], "proxy")
        and all(inst is PseudoInst.STORE_SUBSCR for inst, *_ in modifications)
    ):
        return modifications
    last = {key.value: value.value for _, _, key, value in modifications}
    replayable = (ProxyInterface, int, float, tuple, type(None), devices.Device, torch.dtype, dtypes.dtype, str)
    for key, value in last.items():
        if not isinstance(value, replayable):
            raise NotImplementedError(
                f"thunderplug: the jitted function sets `{_readable(provenance.inputs[0])}.{key}` to a "
                f"{type(value).__qualname__} (transformers 4.57 wraps each layer's `forward` this way for "
                "`output_hidden_states`); thunder 0.2.6 cannot replay such a write after the compiled call. Set it "
                "outside the jitted function, or leave the option that sets it off"
            )
    plain = {
        key: dtypes.to_torch_dtype(value) if isinstance(value, dtypes.dtype) else value
        for key, value in last.items()
        if isinstance(value, (torch.dtype, dtypes.dtype, str)) and isinstance(key, str)
    }
    with tracectx(epilogue_trace):
        for key, value in plain.items():
            epilogue_trace.bound_symbols.append(
                prims.pack_attr.bind(provenance.inputs[0].proxy, key, value, output=None)
            )
    return [m for m in modifications if m[2].value not in plain]


def _readable(provenance: Any) -> str:
    """Where a value came from, as the user would write it (``self.model.layers[0]``, ``args[1].cache``)."""
    from thunder.core.interpreter import PseudoInst
    from thunder.core.jit_ext import MODULE_MEMBER_DICT_ATTRS

    inst, inputs = provenance.inst, provenance.inputs
    if inst is PseudoInst.INPUT_FN:
        return "self"
    if inst in (PseudoInst.INPUT_ARGS, PseudoInst.INPUT_KWARGS):
        return "args" if inst is PseudoInst.INPUT_ARGS else "kwargs"
    if inst is PseudoInst.LOAD_ATTR and len(inputs) == 2:
        return f"{_readable(inputs[0])}.{inputs[1].value}"
    if inst is PseudoInst.BINARY_SUBSCR and len(inputs) == 2:
        container, key = inputs
        if container.inst is PseudoInst.LOAD_ATTR and container.inputs[1].value in MODULE_MEMBER_DICT_ATTRS:
            owner = _readable(container.inputs[0])
            return f"{owner}[{key.value}]" if str(key.value).isdigit() else f"{owner}.{key.value}"
        return f"{_readable(container)}[{key.value!r}]"
    return "an object"


def _write_back_to_the_jitted_module(attributes: Any) -> None:
    """thunder replays an attribute write on an object through the proxy the object got when it was first
    written, and the module ``thunder.jit`` was given gets none: its writes (``self.flag = True`` in its
    forward; transformers' ``_output_capturing_hooks_installed``) were dropped, silently. Its ``__dict__``
    is recorded as that of its ThunderModule's ``_model`` (the module itself), which the epilogue reads."""
    from thunder.core.interpreter import ProvenanceRecord, PseudoInst
    from thunder.core.jit_ext import EXT_FLAG_IS_MODULE
    from thunder.core.proxies import AnyProxy

    provenance = attributes.provenance
    if not (provenance.inst is PseudoInst.LOAD_ATTR and provenance.inputs[1].inst is PseudoInst.CONSTANT
            and provenance.inputs[1].value == "__dict__"):
        return
    owner = provenance.inputs[0]
    if owner.inst is not PseudoInst.INPUT_FN or not owner.ext_flag & EXT_FLAG_IS_MODULE or hasattr(owner, "proxy"):
        return
    model = ProvenanceRecord(PseudoInst.LOAD_ATTR,
                             inputs=[owner, ProvenanceRecord(PseudoInst.CONSTANT, inputs=[], value="_model")])
    model.proxy = AnyProxy(get_compile_data().fn, history=model)
    attributes.provenance = ProvenanceRecord(PseudoInst.LOAD_ATTR, inputs=[model, provenance.inputs[1]],
                                             ext_flag=provenance.ext_flag)


_autocast_rules = threading.local()


def autocast_rules_enabled() -> bool:
    """Replaces ``thunder.transforms.autocast.is_autocast_enabled``: whether thunder's autocast rules
    apply to the symbols this thread traces now."""
    return getattr(_autocast_rules, "enabled", True)


@contextlib.contextmanager
def autocast_rules_disabled() -> Iterator[None]:
    """Replaces ``thunder.transforms.autocast.disable_autocast``. thunder keeps the flag in a module
    global, saved and restored around each rule: two threads compiling at once (each subclass op's
    unrolled graph is traced under it) interleave their saves and restores and can leave it off for
    the whole process, after which no later compilation applies autocast (float32 where eager gives
    bfloat16, stock ``thunder.jit`` included). One flag per thread."""
    before = autocast_rules_enabled()
    _autocast_rules.enabled = False
    try:
        yield
    finally:
        _autocast_rules.enabled = before


def mark_static_address_lookaside(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """``torch._dynamo.mark_static_address(t)`` only tags ``t`` with an attribute that Dynamo alone reads
    (transformers' ``StaticCache`` tags its key/value tensors and length when it allocates them, during
    the first forward). thunder replays the attribute write onto a tensor input and fails (``trying to set
    ._dynamo_static_input_type``); a thunder trace has no use for the tag, so the call does nothing."""
    ours = interpreter_needs_wrap(lambda *args, **kwargs: None)

    def replacement(*args: Any, **kwargs: Any) -> Any:
        return ours(*args, **kwargs) if active() else original(*args, **kwargs)

    return replacement


def object_setattr_lookaside(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """Two thunder bugs in attribute writes (``obj.name = value``) inside jitted code, both silent.

    On an object the function did not create (``layer.keys = ...``), thunder records the write to replay
    it after the computation, as a write to the object's ``__dict__``. The first write swaps the wrapped
    ``__dict__`` for thunder's own copy, and thunder then writes the next attributes into that copy under
    a fresh wrapper that records nothing: only the first attribute written reached the object
    (transformers' ``StaticCache`` allocated in a compiled prefill kept ``device`` and lost its ``keys``,
    ``values`` and ``is_initialized``, so every token re-created an empty cache). The copy is made known
    as the same wrapped ``__dict__``, so every write is recorded.

    On an object the function created, thunder writes the attribute but keeps the wrapper of its former
    value, from which it builds the returned object: transformers' ``ModelOutput`` got
    ``hidden_states`` set after construction (``output_hidden_states=True``) and was returned with
    ``None``. The written value's wrapper replaces it."""
    from thunder.core.interpreter import get_interpreterruntimectx
    from thunder.core.jit_ext import is_created_during_tracing

    def replacement(obj: Any, name: Any, value: Any) -> Any:
        if not active():
            return original(obj, name, value)
        wrappers = getattr(obj, "attribute_wrappers", {})
        attributes = wrappers.get("__dict__")
        if attributes is not None and attributes.original_value is not attributes.nothing:
            get_interpreterruntimectx().cache_wrapper(attributes)  # its value is thunder's copy
        result = original(obj, name, value)
        key = unwrap(name)
        if result is not INTERPRETER_SIGNALS.EXCEPTION_RAISED and key in wrappers and is_created_during_tracing(
            obj.provenance
        ):
            if getattr(unwrap(obj), "__dict__", {}).get(key, wrappers) is unwrap(value):
                wrappers[key] = value
            else:
                del wrappers[key]
        return result

    return replacement


def thunder_module_getattr(
    original: Callable[..., Any], compiled_by_thunderplug: Callable[[Any], bool]
) -> Callable[..., Any]:
    """``ThunderModule.__getattr__`` finds what the ThunderModule lacks on the original module, so a method
    of the model (transformers' ``generate``) came back bound to the original module, and its
    ``self(...)`` / ``self.forward(...)`` ran the model uncompiled. For a ``discover()`` ThunderModule,
    such a method (one the model's classes define, not ``nn.Module``) is bound to a view of the model: an
    object of a subclass of the model's class, sharing the model's ``__dict__`` (its attributes, modules,
    parameters, and what the method writes), whose call and ``forward`` are the ThunderModule's."""
    views: dict[int, Any] = {}

    def view_of(thunder_module: torch.nn.Module) -> Any:
        model = thunder_module._model
        view = views.get(id(thunder_module))
        if view is None or view.__dict__ is not model.__dict__:
            compiled = weakref.ref(thunder_module)  # the view lives as long as the ThunderModule, not longer

            def forward(_: Any, *args: Any, **kwargs: Any) -> Any:
                return compiled().forward(*args, **kwargs)

            def call(_: Any, *args: Any, **kwargs: Any) -> Any:
                return compiled()(*args, **kwargs)

            cls = type(model)
            view_class = type(cls.__name__, (cls,), {
                "forward": functools.wraps(cls.forward)(forward), "__call__": functools.wraps(cls.__call__)(call),
                "__module__": cls.__module__, "__qualname__": cls.__qualname__,
            })
            view = object.__new__(view_class)
            view.__dict__ = model.__dict__
            views[id(thunder_module)] = view
            weakref.finalize(thunder_module, views.pop, id(thunder_module), None)
        return view

    def replacement(self: torch.nn.Module, name: str) -> Any:
        found = original(self, name)
        if (
            isinstance(found, types.MethodType)
            and found.__self__ is self._model
            and not hasattr(torch.nn.Module, name)
            and compiled_by_thunderplug(self)
        ):
            return types.MethodType(found.__func__, view_of(self))
        return found

    return replacement


#: the hooks registered on modules by the interpretation in progress in this thread (``None``: none is)
_registered_hooks = threading.local()

#: the module hook registrations that run eagerly when jitted code calls them (wiring.patches)
HOOK_REGISTRATIONS = (torch.nn.Module.register_forward_hook, torch.nn.Module.register_forward_pre_hook)


def hook_registration_lookaside(
    method: Callable[..., Any], interpret: Callable[..., Any], active: Callable[[], bool]
) -> Callable[[Any], Callable[..., Any]]:
    """A module hook registered inside jitted code (transformers 5 installs its output-capturing hooks
    in the first call that asks for ``output_hidden_states``) is registered on the module for real, as
    in eager: thunder interpreted the registration, so the prologue guarded on torch's global handle
    counter, which the registration itself advances (every call failed its own guard). Hooks that an
    interpretation registered are removed if it fails (:func:`removing_hooks_of_failed_interpretations`),
    so a retried or failed compilation leaves none behind."""
    unlooked = types.FunctionType(method.__code__, method.__globals__, method.__name__, method.__defaults__,
                                  method.__closure__)
    unlooked.__kwdefaults__ = method.__kwdefaults__

    def register(*args: Any, **kwargs: Any) -> Any:
        handle = method(*args, **kwargs)
        registered = getattr(_registered_hooks, "handles", None)
        if registered is not None:
            registered.append(handle)
        return handle

    eager = interpreter_needs_wrap(register)

    def make(_no_lookaside: Any) -> Callable[..., Any]:
        def lookaside(*args: Any, **kwargs: Any) -> Any:
            return eager(*args, **kwargs) if active() else interpret(unlooked, *args, **kwargs)

        return lookaside

    return make


def backward_hook_break(
    method: Callable[..., Any], interpret: Callable[..., Any], active: Callable[[], bool]
) -> Callable[[Any], Callable[..., Any]]:
    """A module called with backward hooks (``register_full_backward_hook``, ``register_full_backward_pre_hook``,
    registered before jit) breaks the graph at its call: torch's ``BackwardHook`` attaches the hooks to autograd
    nodes of the eager graph, which a thunder trace has none of (stock thunder runs the module without them and its
    gradients silently skip the hooks). The :class:`DataDependentShapeError` names the module and the user's line;
    on it the compilation runs through Dynamo (``wiring.graph_breaks``), which calls the hooked module eagerly, so
    the hooks see and change eager's gradients. Where the graph cannot break (thunder transforms), it is the error."""
    unlooked = types.FunctionType(method.__code__, method.__globals__, method.__name__, method.__defaults__,
                                  method.__closure__)

    def refuse(hook: Any, args: Any) -> Any:
        module = type(getattr(hook, "module", None)).__name__
        location = _caller_location()
        raise DataDependentShapeError(
            f"{module} has backward hooks (register_full_backward_hook/register_full_backward_pre_hook) and is "
            f"called{location} inside a thunder.jit(..., executors=thunderplug.discover()) function: a thunder 0.2.6 "
            "trace cannot run them, and its gradients would silently skip them. Remove the hooks, put the hook's "
            "effect into the module's forward (a torch.autograd.Function), or call the module outside the jitted "
            "function.",
            op=f"{module} with backward hooks", location=location,
            why="runs backward hooks, which a thunder 0.2.6 trace cannot run",
            advice="For one trace, put the hook's effect into the module's forward (a torch.autograd.Function).",
        )  # fmt: skip

    eager = interpreter_needs_wrap(refuse)

    def make(_no_lookaside: Any) -> Callable[..., Any]:
        def lookaside(*args: Any, **kwargs: Any) -> Any:
            return eager(*args, **kwargs) if active() else interpret(unlooked, *args, **kwargs)

        return lookaside

    return make


def _caller_location() -> str:
    """`` at path:line`` of the innermost interpreted frame outside the standard library and installed packages
    (the user's call of the module), else the current user location."""
    from thunder.core.interpreter import get_interpreterruntimectx

    try:
        frames = list(get_interpreterruntimectx().frame_stack)
    except Exception:  # noqa: BLE001 - outside the interpreter there is no user location
        return ""
    for frame in reversed(frames):
        line = frame.positions.lineno if frame.positions else None
        location = f" at {frame.code.co_filename}:{line}"
        if line is not None and not _in_a_library(location):
            return location
    return _user_location()


#: the methods of torch's ``BackwardHook`` a module call with backward hooks runs first (wiring.patches)
BACKWARD_HOOK_SETUPS = (torch.utils.hooks.BackwardHook.setup_input_hook,)


def removing_hooks_of_failed_interpretations(
    original: Callable[..., Any], active: Callable[[], bool]
) -> Callable[..., Any]:
    """``thunder_general_jit`` (one interpretation of a jitted function) that removes the module hooks it
    registered (:func:`hook_registration_lookaside`) when it fails."""

    def replacement(*args: Any, **kwargs: Any) -> Any:
        if not active():
            return original(*args, **kwargs)
        outer = getattr(_registered_hooks, "handles", None)
        _registered_hooks.handles = registered = []
        try:
            return original(*args, **kwargs)
        except BaseException:
            for handle in registered:
                handle.remove()
            raise
        finally:
            _registered_hooks.handles = outer

    return replacement


def hooks_read_from_the_module(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder's prologue reads what the program read from the jitted module through its ThunderModule
    (``get_thunder_module(module0)``), and the ThunderModule has hook tables of its own (empty): a hook of
    the module whose code the prologue guards (it reads a global or a closure cell, as transformers 5's
    output-capturing hooks do) failed every call with ``KeyError`` (its key is in the module's table
    only). The program ran the module's own hooks, so their tables are read from the module."""
    from thunder.core import prims

    from thunderplug.caching.reuse import HOOK_TABLES

    def replacement(ctx: Any, prologue_trace: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(ctx, prologue_trace, *args, **kwargs)
        if active():
            modules = {
                id(bsym.output): bsym.args[0]
                for bsym in prologue_trace.bound_symbols
                if bsym.sym.id == prims.PrimIDs.UNPACK_THUNDER_MODULE
            }
            prologue_trace.bound_symbols = [
                bsym.from_bsym(args=(modules[id(bsym.args[0])], bsym.args[1]))
                if bsym.sym.id == prims.PrimIDs.UNPACK_ATTR and id(bsym.args[0]) in modules
                and bsym.args[1] in HOOK_TABLES
                else bsym
                for bsym in prologue_trace.bound_symbols
            ]
        return result

    return replacement


#: thunder's prims that draw random numbers without its ``RANDOM_OP`` tag
_UNTAGGED_DRAWS = frozenset({prims.PrimIDs.RANDN, prims.PrimIDs.RANDINT, prims.PrimIDs.UNIFORM_PHILOX})
#: torch's random functions, as the ids of thunder's automatic registrations of them (opaque symbols, untagged)
_AUTO_REGISTERED_DRAWS = frozenset(
    f"torch.{name}" for name in (
        "poisson", "binomial", "normal", "_standard_gamma", "_sample_dirichlet", "randint_like", "dropout",
        "alpha_dropout", "feature_dropout", "feature_alpha_dropout", "native_dropout", "rrelu",
        "nn.functional.dropout1d", "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
        "nn.functional.feature_alpha_dropout", "nn.functional.gumbel_softmax", "nn.functional.rrelu",
    )
)
#: the torch executor's operators that run thunder's random prims and its automatic registrations of random torch
#: functions (untagged, and without subsymbols once claimed)
_TORCH_DRAWS = frozenset({"uniform", "randn", "randint", "ops.rngprims.philox_rand", "multinomial_helper"}) | {
    name.rsplit(".", 1)[-1] for name in _AUTO_REGISTERED_DRAWS
}


def draws(bsym: BoundSymbol, tags: frozenset = frozenset({prims.OpTags.RANDOM_OP})) -> bool:
    """Whether ``bsym`` draws random numbers: it or a subsymbol at any depth is tagged ``RANDOM_OP`` (thunder's
    ``uniform``, ``multinomial``, ``get_and_update_rng_state``; executors' operators that draw) or is thunder's
    ``randn``/``randint``/``uniform_philox``, the torch executor's operator of one of them (:data:`_TORCH_DRAWS`) or
    thunder's automatic registration of a random torch function (:data:`_AUTO_REGISTERED_DRAWS`). ``tags``: the tags
    that count (with ``DONT_DCE`` too, one walk answers ``dce``'s question)."""
    own = bsym.sym.tags or ()
    if not tags.isdisjoint(own) or not tags.isdisjoint(bsym.tags):
        return True
    if bsym.sym.id in _UNTAGGED_DRAWS:
        return True
    if prims.OpTags.AUTO_REGISTERED in own and bsym.sym.id in _AUTO_REGISTERED_DRAWS:
        return True
    if bsym.sym.executor is torchex.ex and bsym.sym.name in _TORCH_DRAWS:
        return True
    return any(draws(sub, tags) for sub in bsym.subsymbols)


def draws_kept(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder's ``dce`` keeps a bound symbol only when its result is used or it is tagged ``DONT_DCE``: a random op
    whose result is unused (``torch.rand(3)``, a dropout whose output is discarded) was dropped, so every later draw
    (the next dropout's mask) took other numbers than eager's. In ``discover()`` compilations, ``dce`` (and its
    no-op subsymbol pruning) asks for ``DONT_DCE`` through this: a bound symbol that :func:`draws` is kept too."""
    dont_dce = {prims.OpTags.DONT_DCE}
    kept = frozenset({prims.OpTags.DONT_DCE, prims.OpTags.RANDOM_OP})

    def replacement(bsym: BoundSymbol, tags: set) -> bool:
        if tags == dont_dce and active():
            return draws(bsym, kept)
        return original(bsym, tags)

    return replacement


def draws_in_forward(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder's ``split_into_forward_and_backward`` puts into the forward only what the forward's outputs need, so
    a draw whose result only the backward reads (random_ops' ``eager_random_dropout_forward`` of a discarded dropout:
    its saved generator state) or that nothing reads ran in the backward, after every later draw of the forward:
    eager's stream shifted. The draws of the forward (:func:`draws`, before the first cotangent) are kept in the
    forward: thunder's split runs with their outputs named among ``flat_args`` (what it treats as available in the
    forward, so the bound symbols producing them stay there and what the backward reads of them is saved), and the
    forward's return gets its own ``flat_args`` back."""

    def replacement(joint: TraceCtx) -> Any:
        if not active():
            return original(joint)
        returned = joint.bound_symbols[-1]
        results = returned.args[0]
        outputs: list = []
        for bsym in joint.bound_symbols[:-1]:
            if bsym.sym.id == prims.PrimIDs.GET_GRAD:
                break
            if draws(bsym):
                outputs.extend(bsym.flat_proxy_outs)
        if not outputs or not isinstance(results, dict) or "flat_args" not in results:
            return original(joint)
        flat_args = results["flat_args"]
        widened = from_trace(joint)
        widened.bound_symbols = [
            *joint.bound_symbols[:-1],
            returned.from_bsym(args=({**results, "flat_args": type(flat_args)((*flat_args, *outputs))},
                                     *returned.args[1:])),
        ]
        forward, backward = original(widened)
        forward_return = forward.bound_symbols[-1]
        forward.bound_symbols[-1] = forward_return.from_bsym(
            args=({**forward_return.args[0], "flat_args": flat_args}, *forward_return.args[1:]))
        return forward, backward

    return replacement


def none_reads_guarded(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder's wrap callback, through which every value the program reads from its inputs passes: a number or
    string read from an argument, a module attribute, a global or an argument's attribute gets a prologue check of
    its value, a ``None`` none, so a program traced while ``self.scale`` (``SCALE``, ``box.scale``, ``mask=``)
    was ``None`` was a cache hit after it became a tensor and kept the first call's branch, silently (stock thunder
    too; a region compiled for ``src_key_padding_mask=None`` was adopted by a block called with a mask). A ``None``
    read from such a source gets the same treatment as those constants: a proxy with the read's provenance and a
    ``check_none`` constraint, which ``unpack_inputs`` writes into the prologue after the read; a call where it is
    something else misses and compiles its own program."""
    from thunder.core.interpreter import ProvenanceRecord, PseudoInst
    from thunder.core.jit_ext import EXT_FLAG_IS_MODULE, get_jit_ctx, should_register_for_prologue
    from thunder.core.proxies import AnyProxy

    def as_attribute(read: ProvenanceRecord) -> ProvenanceRecord:
        """A ``None`` parameter, buffer or submodule (``Linear(bias=False)``'s ``bias``) read as the module's
        attribute: thunder's prologue reads ``_parameters[name]`` with ``get_parameter``, which takes tensors only."""
        table = read.inputs[0] if read.inst is PseudoInst.BINARY_SUBSCR else None
        if (table is None or table.inst is not PseudoInst.LOAD_ATTR or table.inputs[1].inst is not PseudoInst.CONSTANT
                or table.inputs[1].value not in ("_parameters", "_buffers", "_modules")
                or not table.inputs[0].ext_flag & EXT_FLAG_IS_MODULE):
            return read
        return ProvenanceRecord(PseudoInst.LOAD_ATTR, inputs=[table.inputs[0], read.inputs[1]])

    def replacement(value: Any) -> Any:
        result = original(value)  # first, as it rewrites a read of ``module.__dict__[name]`` to ``module.name``
        if value.value is None and active() and should_register_for_prologue(value.provenance):
            # an AnyProxy, as check_none's meta requires when a pass re-runs the prologue's metas
            guarded = AnyProxy(None, history=as_attribute(value.provenance))
            get_jit_ctx().add_constraint((prims.check_none, guarded))
        return result

    return replacement


def constraints_keep_their_reads(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """``unpack_inputs`` swaps each proxy of a prologue constraint for the computation's or epilogue's input of the
    same name (meant for one value proxied twice), but names are unique per trace only: the epilogue's proxy of an
    object the program returns (``AnyProxy``, ``any0`` in the epilogue's names) took the place of the ``None`` read's
    proxy named alike in the computation's (``any0``), so under transformers 4.57 ``check_none`` of
    ``past_key_values.layer_class_to_replicate`` checked the cache itself and failed at every call (and a guard left
    out for that was stale once the read changed). A constraint's proxy named like an input of another read is
    renamed first (discover() compilations), so each constraint checks the read it was made for."""
    from thunder.core.proxies import Proxy, variableify
    from thunder.core.trace import tracectx

    def replacement(ctx: Any, prologue_trace: TraceCtx, pro_to_comp: Any, pro_to_epi: Any, *rest: Any) -> Any:
        if active():
            inputs = {variableify(v): (v if isinstance(v, Proxy) else v.proxy) for v in (*pro_to_comp, *pro_to_epi)}
            taken = {v.name for v in inputs.values()} | set(ctx.computation_trace.names)
            renamed: dict[int, Any] = {}

            def own(a: Any) -> Any:
                if not isinstance(a, Proxy) or a.history is None:
                    return a
                other = inputs.get(variableify(a))
                if other is None or other is a or str(other.history) == str(a.history):
                    return a
                if id(a) not in renamed:
                    name, count = f"{a.name}_read", 0
                    while name in taken or prologue_trace.has_name(name):
                        name, count = f"{a.name}_read{count}", count + 1
                    taken.add(name)
                    with tracectx(prologue_trace):
                        renamed[id(a)] = a.replace(name=name)
                return renamed[id(a)]

            ctx._constraints = [(prim, *(own(a) for a in args)) for prim, *args in ctx._constraints]
        return original(ctx, prologue_trace, pro_to_comp, pro_to_epi, *rest)

    return replacement


def unreadable_inputs_break(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """``unpack_inputs`` (the prologue's reads of every value the program took from its inputs, globals and
    closures) that, where thunder 0.2.6 cannot write the read (a dict entry keyed by a ``torch.dtype``, as
    torchao's QAT fake quantizers look up ``_DTYPE_TO_BIT_WIDTH[torch.int4]``; another constant type),
    raises a :class:`DataDependentShapeError` instead of its ``NotImplementedError``: a discover() compilation
    then runs the function through Dynamo (``wiring.graph_breaks``), whose guards check such reads, and
    thunder.jit compiles Dynamo's graphs. Where the graph cannot break the error is thunder's message."""

    def replacement(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except NotImplementedError as error:
            if not active() or isinstance(error, DataDependentShapeError):
                raise
            cause = f" ({error.__cause__})" if error.__cause__ is not None else ""
            raise DataDependentShapeError(
                str(error), op=f"a value the program read{cause}",
                why="has no prologue check in thunder 0.2.6 (thunder cannot write that read)",
                advice="For one trace, pass the value in as an argument or read it outside the jitted function.",
            ) from error

    return replacement


def _holds_mutable(values: Any) -> bool:
    return any(type(v) in (list, dict) or (type(v) is tuple and _holds_mutable(v)) for v in values)


def _snapshot(value: Any) -> Any:
    """``value`` with every list and dict in it (through tuples) copied; proxies and other values shared."""
    kind = type(value)
    if kind is list:
        return [_snapshot(v) for v in value]
    if kind is dict:
        return {k: _snapshot(v) for k, v in value.items()}
    if kind is tuple and _holds_mutable(value):
        return tuple(_snapshot(v) for v in value)
    return value


def symbol_arguments_as_called(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """``Symbol.__call__`` that records a symbol's list and dict arguments as they were at the call: thunder's
    bound symbol kept the program's own list, so a program changing the list after the call changed the
    recorded op (``shape = [2, 8]; y = x.view(shape); shape[0], shape[1] = 8, 2`` ran ``view(x, [8, 2])``
    under metadata of ``[2, 8]``: silently other values (stock thunder too; torchao's QAT fake quantizer
    fails on it). Also ``torch.split``/``Tensor.split`` by a size return a tuple to the program, as in eager
    (thunder's meta returns a list, so ``parts + (y,)`` failed and the program could change the list the
    trace records); calls inside other symbols' metas get thunder's list as before."""

    def replacement(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not active():
            return original(self, *args, **kwargs)
        if _holds_mutable(args) or _holds_mutable(kwargs.values()):
            args, kwargs = _snapshot(args), _snapshot(kwargs)
        result = original(self, *args, **kwargs)
        if type(result) is list and self.id == "torch.split" and len(get_tracectx().scopes) == 1:
            return tuple(result)
        return result

    return replacement


#: the container methods that change the container they are called on (wiring.patches)
_MUTATING_METHOD_NAMES = {
    list: ("append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "__setitem__", "__delitem__",
           "__iadd__", "__imul__"),
    collections.deque: ("append", "appendleft", "extend", "extendleft", "insert", "pop", "popleft", "remove",
                        "clear", "rotate", "reverse", "__setitem__", "__delitem__", "__iadd__", "__imul__"),
    dict: ("__setitem__", "__delitem__", "update", "pop", "popitem", "clear", "setdefault", "__ior__"),
    collections.OrderedDict: ("__setitem__", "__delitem__", "update", "pop", "popitem", "clear", "setdefault",
                              "move_to_end", "__ior__"),
    set: ("add", "discard", "remove", "pop", "clear", "update", "difference_update", "intersection_update",
          "symmetric_difference_update", "__ior__", "__iand__", "__isub__", "__ixor__"),
}
MUTATING_METHODS = {
    id(method): f"{typ.__name__}.{name}"
    for typ, names in _MUTATING_METHOD_NAMES.items()
    for name in names
    if (method := typ.__dict__.get(name)) is not None
}

#: per interpretation in progress in this thread: id(container) -> _Mutated (``None``: none is in progress)
_mutated = threading.local()


@dataclasses.dataclass
class _Mutated:
    """A container the function did not create, as it was before the function's first change to it."""

    container: Any
    before: Any
    method: str  # the first change
    location: str
    with_proxy: tuple[str, str] | None = None  # the first change that passed a proxy: (method, location)

    def restore(self) -> None:
        c = self.container
        if isinstance(c, dict):
            c.clear()
            c.update(self.before)
        elif isinstance(c, set):
            c.clear()
            c.update(self.before.values())
        else:
            c.clear()
            c.extend(self.before)

    def refused(self) -> bool:
        """Whether the container now holds a thunder proxy it did not hold before (an element, key or value
        that is or contains one): thunder leaves it there after the first call and skips the change on later,
        cached calls. A container changed with other values only (a memo such as ``logging.Logger._cache``
        or ``re._cache``, a list a test appends to while tracing) is left as thunder leaves it."""
        c = self.container
        if isinstance(c, dict):
            return any(
                (_holds_proxy(k) or _holds_proxy(v)) and not _held_before(self.before, k, v) for k, v in c.items()
            )
        held = self.before if isinstance(c, set) else {id(e) for e in self.before}
        return any(id(e) not in held and _holds_proxy(e) for e in c)


def _held_before(before: dict, key: Any, value: Any) -> bool:
    try:
        return key in before and before[key] is value
    except Exception:  # noqa: BLE001 - a key that cannot be compared was not there before
        return False


def _holds_proxy(value: Any, depth: int = 0) -> bool:
    if isinstance(value, ProxyInterface):
        return True
    if depth > 4:
        return False
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_holds_proxy(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return any(_holds_proxy(k, depth + 1) or _holds_proxy(v, depth + 1) for k, v in value.items())
    attributes = getattr(value, "__dict__", None)  # a dataclass or plain object holding proxies
    if isinstance(attributes, dict) and not isinstance(value, (type, types.ModuleType, torch.nn.Module)):
        return any(_holds_proxy(v, depth + 1) for v in attributes.values())
    return False


def _made_outside(provenance: Any) -> bool:
    """Whether the wrapped value of this provenance was reached from the jitted function's inputs (its
    arguments, or the function itself: its globals, closure, module attributes), item by item and attribute
    by attribute; a slice of a list is a new list."""
    from thunder.core.interpreter import PseudoInst

    while True:
        inst = provenance.inst
        if inst in (PseudoInst.INPUT_FN, PseudoInst.INPUT_ARGS, PseudoInst.INPUT_KWARGS):
            return True
        if inst in (PseudoInst.LOAD_ATTR, PseudoInst.LIST_APPEND, PseudoInst.LIST_EXTEND) and provenance.inputs:
            provenance = provenance.inputs[0]
        elif inst is PseudoInst.BINARY_SUBSCR and len(provenance.inputs) == 2:
            key = provenance.inputs[1]
            if getattr(key.inst, "opname", None) == "BUILD_SLICE" or isinstance(key.value, slice):
                return False
            provenance = provenance.inputs[0]
        else:
            return False


def _is_attribute_namespace(wrapped: Any) -> bool:
    """A module's or object's ``__dict__``, a function's ``__globals__``, an ``nn.Module``'s tables: thunder
    records writes to those itself (attributes, buffers)."""
    from thunder.core.interpreter import PseudoInst
    from thunder.core.jit_ext import EXT_FLAG_IS_MODULE_MEMBER_DICT, MODULE_MEMBER_DICT_ATTRS

    provenance = wrapped.provenance
    if provenance.ext_flag & EXT_FLAG_IS_MODULE_MEMBER_DICT:
        return True
    if provenance.inst is PseudoInst.LOAD_ATTR and len(provenance.inputs) == 2:
        name = provenance.inputs[1].value
        return name in ("__dict__", "__globals__") or name in MODULE_MEMBER_DICT_ATTRS
    return False


def _note_mutation(method: str, args: tuple, kwargs: dict) -> None:
    mutated = getattr(_mutated, "containers", None)
    if mutated is None or not args:
        return
    wrapped = args[0]
    if getattr(wrapped, "original_value", None) is not getattr(wrapped, "nothing", True):
        return  # not a WrappedValue, or one thunder proxied (it records its changes itself)
    container = wrapped.value
    if not isinstance(container, (list, collections.deque, dict, set)):
        return
    record = mutated.get(id(container))
    if record is None:
        if not _made_outside(wrapped.provenance) or (isinstance(container, dict) and _is_attribute_namespace(wrapped)):
            return
        if isinstance(container, dict):
            before: Any = dict(container)
        elif isinstance(container, set):
            before = {id(e): e for e in container}
        else:
            before = list(container)
        record = mutated[id(container)] = _Mutated(container, before, method, _user_location())
    if record.with_proxy is None and any(_holds_proxy(unwrap(a)) for a in (*args[1:], *kwargs.values())):
        record.with_proxy = (method, _user_location())


def _warn_changes_made_once(records: Any) -> None:
    """A list or deque the function did not create, grown or shrunk with values that are not proxies by the
    user's own code (not a library's; not thunder's tests counting their traces): thunder made the change
    while tracing, and later (cached) calls skip it, where each eager call changes the length again. Kept as
    stock thunder does it (code that relies on it still runs), with a warning naming the method and the
    line. Dicts and sets are left alone: their usual changes (a memo filled once) repeat to the same state."""
    from thunderplug.plugin_api.notices import ThunderplugWarning

    for record in records:
        grown_or_shrunk = isinstance(record.container, (list, collections.deque)) and len(record.container) != len(
            record.before
        )
        if not grown_or_shrunk or not record.location or _in_a_library(record.location):
            continue
        kind = type(record.container).__name__
        warnings.warn(
            f"thunderplug: `{record.method}`{record.location} changes a {kind} that the jitted function did not "
            f"create. thunder makes that change while tracing, on the first call only: later (cached) calls skip "
            f"it, unlike eager. Return the value from the jitted function and change the {kind} outside it, or "
            f"create the {kind} inside the function.",
            ThunderplugWarning,
            stacklevel=2,
        )


def _in_a_library(location: str) -> bool:
    """Whether a user location (:func:`_user_location`'s `` at path:line``) is in the standard library or an
    installed package."""
    path = os.path.abspath(location[len(" at ") :].rsplit(":", 1)[0])
    return path.startswith(_library_roots())


@functools.cache
def _library_roots() -> tuple[str, ...]:
    """The standard library's and the installed packages' folders, each ending in a separator."""
    names = ("stdlib", "platstdlib", "purelib", "platlib")
    return tuple({os.path.join(os.path.abspath(sysconfig.get_paths()[name]), "") for name in names})


def _user_location() -> str:
    from thunder.core.interpreter import get_interpreterruntimectx

    try:
        filename, positions = get_interpreterruntimectx().get_current_user_source_location()
    except Exception:  # noqa: BLE001 - outside the interpreter there is no user location
        return ""
    return f" at {filename}:{positions.lineno}" if filename is not None and positions is not None else ""


def noting_container_mutations(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder's ``general_jit_lookaside`` (asked for every call the interpreter makes, just before it), noting
    the containers the function did not create that a call of a mutating method (``list.append``,
    ``dict.__setitem__``, ``set.add``, ...) is about to change, with their contents before the first change
    (:func:`breaking_at_outside_container_mutations` decides at the end). Which function runs is thunder's."""

    def replacement(fn: Any, *args: Any, **kwargs: Any) -> Any:
        method = MUTATING_METHODS.get(id(fn))  # first: asked for every call the interpreter makes
        if method is not None and active():
            _note_mutation(method, args, kwargs)
        return original(fn, *args, **kwargs)

    return replacement


def breaking_at_outside_container_mutations(
    original: Callable[..., Any], active: Callable[[], bool]
) -> Callable[..., Any]:
    """``thunder_general_jit`` (one interpretation of a jitted function) that refuses a function whose run
    changed a container it did not create (an argument list or dict, a list attribute of an argument or of
    the module, a global or closure list): thunder 0.2.6 changes the real container during tracing, so it
    holds thunder's proxies after the first call, and replays nothing on later, cached calls (silently
    wrong). When such a container ends up holding a proxy it did not hold (:meth:`_Mutated.refused`), the
    containers the function changed are restored to their contents before it ran, and the interpretation fails
    with a :class:`DataDependentShapeError` naming the method, the container's type and the user's line: a
    discover() compilation then breaks the graph (``wiring.graph_breaks``), and Dynamo, which replays such
    changes on every call, runs it as eager does; where the graph cannot break it is the error. They are
    restored also when the interpretation fails for another reason."""

    def replacement(*args: Any, **kwargs: Any) -> Any:
        if not active():
            return original(*args, **kwargs)
        outer = getattr(_mutated, "containers", None)
        _mutated.containers = mutated = {}
        try:
            result = original(*args, **kwargs)
        except BaseException:
            for record in mutated.values():
                record.restore()
            raise
        finally:
            _mutated.containers = outer
        refused = [record for record in mutated.values() if record.refused()]
        if not refused:
            _warn_changes_made_once(mutated.values())
            return result
        for record in mutated.values():
            record.restore()
        record = refused[0]
        method, location = record.with_proxy or (record.method, record.location)
        kind = type(record.container).__name__
        raise DataDependentShapeError(
            f"thunderplug: `{method}`{location} changes a {kind} that the jitted function did not create (an "
            f"argument, an attribute or item of one, a global or a closure variable). thunder would leave its "
            f"traced proxies in that {kind} on the first call and skip the change on every later (cached) "
            f"call, so this function is not compiled (the {kind} is left as it was). Return the value from "
            f"the jitted function and change the {kind} outside it (`out, item = jitted(x); "
            f"container.append(item)`), or create the {kind} inside the function.",
            op=f"`{method}`", location=location,
            why=f"changes a {kind} the jitted function did not create, which a thunder 0.2.6 trace cannot replay",
            advice=f"For one trace, return the value and change the {kind} outside the jitted function.",
        )

    return replacement


def recipe_without_missing_nvfuser(original: Callable[..., Any]) -> Callable[..., Any]:
    """thunder's default recipe asks for nvFuser even where it is not installed (no wheel for torch
    2.10 and newer), and ``thunder.jit`` then fails on the ``None`` it puts in the executor list. A
    recipe holding thunderplug's plugin (a plugin with ``replaces_missing_fusers``), whose executors
    bring their own fuser, leaves the missing nvFuser out; any other recipe is unchanged."""

    def replacement(self: Any) -> Any:
        from thunder.extend import get_executor

        names = self.executor_names
        bring_fusers = any(getattr(plugin, "replaces_missing_fusers", False) for plugin in self.plugins)
        if not (bring_fusers and isinstance(names, list) and "nvfuser" in names and get_executor("nvfuser") is None):
            return original(self)
        self.executor_names = [name for name in names if name != "nvfuser"]
        try:
            return original(self)
        finally:
            self.executor_names = names

    return replacement


def defaults_read_from_the_function(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder's interpreter binds a call's missing arguments to the function's default values as constants
    (``wrap_const`` of every item of ``__defaults__`` and ``__kwdefaults__``), which the prologue never checks:
    after ``f.__defaults__`` (a module's ``forward`` defaults, ``__kwdefaults__``) changed, or a list default was
    changed in place, a call relying on the default ran the first call's program with the first call's value,
    silently (stock thunder too); a tensor default, even one the call passed, became a constant the prologue cannot
    read. In discover() compilations each default the call relies on is passed as an argument read from the
    function, ``fn.__defaults__[i]`` (``fn.__kwdefaults__[name]``), where the function itself was read from the
    inputs: thunder checks it as any value read from them (a number's or a string's value, a ``None``
    (``none_reads_guarded``), a tensor's metadata, a list's items read), so a changed default misses and compiles its
    own program and an unchanged one is a hit. The frame then runs a copy of the function without defaults (the same
    code, globals and closure cells, under the function's provenance), so that none is bound as a constant. A value
    thunder checks no read of (:func:`_checked_as_read`), and every default of a function the prologue cannot read
    (one made inside the jitted program, whose defaults are the program's own values), is bound as before."""
    from thunder.core.interpreter import ProvenanceRecord, PseudoInst, WrappedValue, wrap
    from thunder.core.jit_ext import should_register_for_prologue

    def constant(value: Any) -> ProvenanceRecord:
        return ProvenanceRecord(PseudoInst.CONSTANT, inputs=[], value=value)

    def replacement(compilectx: Any, runtimectx: Any, wrapped_fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        fn = unwrap(wrapped_fn)
        if not active() or not (fn.__defaults__ or fn.__kwdefaults__):
            return original(compilectx, runtimectx, wrapped_fn, *args, **kwargs)
        tables: dict[str, ProvenanceRecord] = {}

        def default(table: str, key: Any) -> Any:
            """``fn.<table>[key]``, wrapped as read from the function where the prologue can read and check it."""
            value = getattr(fn, table)[key]
            if table not in tables:
                tables[table] = ProvenanceRecord(PseudoInst.LOAD_ATTR, inputs=[wrapped_fn.provenance, constant(table)])
            item = ProvenanceRecord(PseudoInst.BINARY_SUBSCR, inputs=[tables[table], constant(key)])
            if _checked_as_read(value) and should_register_for_prologue(item):
                return wrap(value, provenance=item)
            return wrap_const(value)

        code = fn.__code__
        first_default = code.co_argcount - len(fn.__defaults__ or ())
        args, kwargs = list(args), dict(kwargs)
        # each positional parameter not given positionally: its keyword argument moves to its place, else its default
        for index in range(len(args), code.co_argcount):
            name = code.co_varnames[index]
            if index >= code.co_posonlyargcount and name in kwargs:
                args.append(kwargs.pop(name))
            elif index >= first_default:
                args.append(default("__defaults__", index - first_default))
            else:  # missing: thunder's own error
                return original(compilectx, runtimectx, wrapped_fn, *args, **kwargs)
        for name in code.co_varnames[code.co_argcount:code.co_argcount + code.co_kwonlyargcount]:
            if name in kwargs:
                continue
            if not fn.__kwdefaults__ or name not in fn.__kwdefaults__:
                return original(compilectx, runtimectx, wrapped_fn, *args, **kwargs)
            kwargs[name] = default("__kwdefaults__", name)
        if not tables:  # every default was given
            return original(compilectx, runtimectx, wrapped_fn, *args, **kwargs)
        bare = types.FunctionType(code, fn.__globals__, fn.__name__, None, fn.__closure__)
        bare.__qualname__, bare.__module__ = fn.__qualname__, fn.__module__
        return original(compilectx, runtimectx, WrappedValue(bare, provenance=wrapped_fn.provenance), *args, **kwargs)

    return replacement


def _checked_as_read(value: Any) -> bool:
    """Whether thunder's prologue checks ``value`` where it was read from an input (a ``None``, a number or string by
    value, a tensor by metadata, a tuple, list or dict of those by the items read); thunder checks no other type
    (a ``torch.dtype``, an enum, an object), where it would rather warn of a sharp edge."""
    if value is None or isinstance(value, (bool, int, float, complex, str, torch.Tensor)):
        return True
    if type(value) in (tuple, list):
        return all(_checked_as_read(item) for item in value)
    if type(value) is dict:
        return all(type(key) in (int, str) and _checked_as_read(item) for key, item in value.items())
    return False
