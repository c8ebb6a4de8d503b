"""The ``eager_kernels`` executor: eager PyTorch's own ATen kernels, forward and backward, for ops
thunder decomposes differently.

Why: thunder differentiates GELU, LayerNorm, softmax, log-softmax, cross-entropy, NLL loss and SDPA through
its own decompositions into prims. Their values differ from ATen's kernels by an ulp here and there
(``thunder.jit(F.gelu)`` with grad differs from eager in a third of the elements), and float8
rounding amplifies that into 1e-4-level loss drift in a float8 transformer, where eager and
``torch.compile(backend="aot_eager")`` agree bit for bit. Running the very kernels eager's autograd
runs (``aten.gelu`` / ``aten.gelu_backward``, ``native_layer_norm`` / ``native_layer_norm_backward``,
``_softmax`` / ``_softmax_backward_data``, ``_log_softmax`` / ``_log_softmax_backward_data``,
``nll_loss_forward`` / ``nll_loss_backward`` (``nll_loss2d_*`` for inputs of 3 or more dims),
``_scaled_dot_product_flash_attention_for_cpu`` and its backward, ``convolution`` /
``convolution_backward`` for conv1d/2d/3d, whose gradients thunder computes as convolutions of its own
(a ViT's patch embedding drifted 7.5e-4 in three AdamW steps), ``native_batch_norm`` /
``native_batch_norm_backward`` (in training the running statistics from
``_native_batch_norm_legit_functional``, copied into the buffers as thunder's own rule copies its own: a
torchvision MobileNetV2's gradients were 1.6e3 (relative) off eager's at the first step, its BatchNorms seeing
two values per channel)) makes those ops bit-identical
to eager. On CPU they are also faster than the decompositions run op by op. thunder's own NLL-loss
backward is also wrong for 3-D and 5-D+ inputs (an ``(n, c, 1, -1)`` gradient, or a shape error
with ``reduction="none"``), which the kernels, fed the shapes ``nll_loss_nd`` feeds them, are not;
cross-entropy with label smoothing (declined here) reaches them through thunder's composition.

How: one thunder ``OperatorExecutor``; each ltorch symbol gets ``register_implementation(symbol,
operator, checker=..., grad_transform=...)``, the extension point thunder's own sdpa executor uses.
The executor sits before the fusers and behind every plugin's claims (``Priority.EAGER_KERNELS``),
so thunder's autodiff asks it before them and takes its grad rule: the forward kernel is recorded in
the forward trace, the backward kernel (fed by the kernel's own saved outputs, such as LayerNorm's
mean and rstd) in the backward trace, as thunder's sdpa executor records its kernels. Each kernel's
output metadata comes from running the overload on meta tensors, never from a guess. Without grad,
the op stays thunder's symbol in the trace (traces are read by thunder's transforms, its tests and
users' tools): the operator is registered ``like=`` it and calls eager's own function
(``torch.nn.functional.gelu``, ``torch.softmax``, ...), printed as thunder's torch executor prints
it; eager's function runs the same ATen kernel that the checker found eager picks.

Checkers decline (leaving the op to thunder) when eager would not run the kernel claimed here:
tensor-subclass arguments (the core unrolls those), softmax with a dtype cast, cross-entropy with
label smoothing or probability targets, SDPA with dropout, or a shape eager routes to its math fallback.
SDPA with a float mask requiring a gradient (T5's and Swin's position biases) is claimed where eager picks its
math backend for it: ATen's composite ``_scaled_dot_product_attention_math`` runs, and its backward runs the
composite again under grad and differentiates it with eager's engine (each op's derivative on the real tensors'
layouts, the order eager sums them in). SDPA with a boolean mask is claimed: eager hands the
flash kernel that mask as an additive one (``-inf`` where False), which the trace builds the same way;
transformers builds such masks under compilation where eager passes ``is_causal=True``, and the
kernel gives the same bits either way. ``discover(exclude=["eager_kernels"])`` turns the executor off,
e.g. to let a GPU fuser take these ops into its regions instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import thunder.torch as ltorch
import torch
from thunder.core import devices, dtypes
from thunder.core.proxies import TensorProxy
from thunder.core.transforms import get_grad, put_grad
from thunder.extend import OperatorExecutor

from thunderplug.caching import dynamic_sizes
from thunderplug.eager.output_grads import requires_grad
from thunderplug.thunder_compat import ltorch_private
from thunderplug.tracing.fake import to_torch_value

EXECUTOR_NAME = "eager_kernels"
aten = torch.ops.aten

#: ``reduction=`` strings as ATen's loss kernels number them (``at::Reduction``).
_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


# -- operators: an ATen overload, its metadata from its meta kernel ------------------------------


class UniqueNamesExecutor(OperatorExecutor):
    """An ``OperatorExecutor`` that refuses an operator name it already has. thunder keys an executor's
    implementations by the symbol's id, which ``register_operator`` makes the name: a second operator of one
    name silently shares the first's entry, so the first's calls run the second's execution transform
    (composites' ``eager_interpolate`` met ``interpolate_modes``' one of that name: ``TypeError: too many
    positional arguments`` in thunder's ``test_core_vs_torch_consistency_interpolate``)."""

    def register_operator(self, name: str, **kwargs: Any) -> Any:
        if name in self.opmap:
            raise ValueError(f"executor {self.name!r} already has an operator named {name!r}")
        return super().register_operator(name, **kwargs)




def _to_meta(x: Any) -> Any:
    if isinstance(x, TensorProxy):
        return torch.empty(tuple(x.shape), dtype=dtypes.to_torch_dtype(x.dtype), device="meta")
    return to_torch_value(x)


def _proxy_like(t: torch.Tensor | None, device: devices.Device, requires_grad: bool) -> TensorProxy | None:
    if t is None:  # an output the call's mask left undefined
        return None
    shape = dynamic_sizes.shape_of(t)
    return TensorProxy(shape=shape, dtype=dtypes.to_dtype(t.dtype), device=device, requires_grad=requires_grad)


def _call(overload: Any) -> Callable[..., Any]:
    """``overload`` taking all its arguments positionally, in schema order (keyword-only ones too),
    so traces print one plain call."""
    keyword_only = [arg.name for arg in overload._schema.arguments if arg.kwarg_only]
    positional = len(overload._schema.arguments) - len(keyword_only)

    def call(*args: Any) -> Any:
        return overload(*args[:positional], **dict(zip(keyword_only, args[positional:])))

    return call


def _operator(executor: OperatorExecutor, name: str, overload: Any, *, differentiable: Sequence[int] = ()):
    """A thunder operator running ``overload`` (all arguments positional, schema order).

    ``differentiable`` lists the outputs that carry ``requires_grad`` when an input does (the
    forward's primal; never saved statistics such as LayerNorm's mean).
    """

    call = _call(overload)

    def meta(*args: Any) -> Any:
        tensors = [a for a in args if isinstance(a, TensorProxy)]
        grad = any(t.requires_grad for t in tensors)
        if dynamic_sizes.active() is not None and dynamic_sizes.tracked(args):
            out = dynamic_sizes.symbolic_fake_call(call, args, to_torch_value)  # symbolic input sizes
        else:
            out = call(*(_to_meta(a) for a in args))
        if isinstance(out, torch.Tensor):
            return _proxy_like(out, tensors[0].device, grad and 0 in differentiable)
        return tuple(_proxy_like(o, tensors[0].device, grad and i in differentiable) for i, o in enumerate(out))

    def run(*args: Any) -> Any:
        return call(*(to_torch_value(a) for a in args))

    return executor.register_operator(name, meta=meta, fn=run)


def _plain(*values: Any) -> bool:
    """All given tensors are plain thunder tensors (``None`` allowed), none a subclass proxy."""
    return all(v is None or type(v) is TensorProxy for v in values)


def _class_dim(a: TensorProxy) -> int:
    """Where cross-entropy's classes are: the only dim of a 1-D input, else dim 1."""
    return 0 if a.ndim == 1 else 1


def _ignored(ignore_index: int | None) -> int:
    """thunder's ``nll_loss`` receives ``ignore_index=None`` when the caller gave none: eager's -100."""
    return -100 if ignore_index is None else ignore_index


def _float(a: Any) -> bool:
    return type(a) is TensorProxy and dtypes.is_float_dtype(a.dtype)


def _sdpa_math(q, k, v, mask, is_causal, scale):
    """What eager's ``F.scaled_dot_product_attention`` runs where it picks the math backend (a float mask
    requiring grad on CPU: T5's and Swin's position biases): ATen's composite ``_scaled_dot_product_attention_math``
    (query and key each scaled by the scale's square root, ``q @ k.mT``, the mask added, ``_safe_softmax``,
    ``@ v``), its output."""
    return aten._scaled_dot_product_attention_math(q, k, v, mask, 0.0, is_causal, None, scale=scale)[0]


def _sdpa_math_backward(grad, q, k, v, mask, is_causal, scale):
    """The gradients of :func:`_sdpa_math` for the query, key, value and mask, as eager's autograd computes them:
    the composite run again on the real tensors, under grad, and differentiated by eager's own engine (each op's
    derivative, on the layouts the real tensors have: thunder's proxies have no strides; the mask's gradient
    summed to its shape, as the engine sums a broadcast input's). The forward is run twice (the price of running
    eager's very ops; no graph is kept between the forward and the backward)."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (q, k, v, mask)]
        out = _sdpa_math(*leaves, is_causal, scale)
        return torch.autograd.grad(out, leaves, grad)


def _sdpa_math_operators(executor: OperatorExecutor) -> tuple[Any, Any]:
    """The operators running :func:`_sdpa_math` and :func:`_sdpa_math_backward`, their metadata from the
    composite on meta tensors (the forward) and the inputs (the gradients)."""

    def meta(q, k, v, mask, is_causal, scale):
        grad = any(t.requires_grad for t in (q, k, v, mask))
        out = _sdpa_math(*(_to_meta(t) for t in (q, k, v, mask)), is_causal, scale)
        return _proxy_like(out, q.device, grad)

    def run(*args):
        return _sdpa_math(*(to_torch_value(a) for a in args))

    def backward_meta(grad, q, k, v, mask, is_causal, scale):
        return tuple(_proxy_like(_to_meta(t), t.device, False) for t in (q, k, v, mask))

    def backward_run(*args):
        return _sdpa_math_backward(*(to_torch_value(a) for a in args))

    forward = executor.register_operator("eager_sdpa_math", meta=meta, fn=run)
    backward = executor.register_operator("eager_sdpa_math_backward", meta=backward_meta, fn=backward_run)
    return forward, backward


# -- the rules: forward kernel, get_grad, backward kernel, put_grad ------------------------------



def _wanted(*tensors: Any) -> list[bool]:
    """A backward kernel's output mask: the gradients eager's autograd asks for (of the tensors that require
    grad; where that is not known, asked for). The first conv of a network then computes no input gradient."""
    return [t is not None and requires_grad(t) is not False for t in tensors]


def _put_grads(tensors: tuple, grads: tuple) -> None:
    """Each gradient to its tensor (an input, an optional weight and bias: a ``None`` tensor, or one whose
    gradient the mask did not ask for, gets none)."""
    for tensor, grad in zip(tensors, grads, strict=True):
        if tensor is not None and grad is not None:
            put_grad(tensor, grad)


class _Kernels:
    """The operators of one executor (built once, by :func:`build_executor`)."""

    def __init__(self, executor: OperatorExecutor):
        op = lambda name, overload, **kw: _operator(executor, name, overload, **kw)  # noqa: E731
        self.gelu = op("eager_gelu", aten.gelu.default, differentiable=(0,))
        self.gelu_backward = op("eager_gelu_backward", aten.gelu_backward.default)
        self.layer_norm = op("eager_native_layer_norm", aten.native_layer_norm.default, differentiable=(0,))
        self.layer_norm_backward = op("eager_native_layer_norm_backward", aten.native_layer_norm_backward.default)
        self.softmax = op("eager_softmax", aten._softmax.default, differentiable=(0,))
        self.softmax_backward = op("eager_softmax_backward_data", aten._softmax_backward_data.default)
        self.log_softmax = op("eager_log_softmax", aten._log_softmax.default, differentiable=(0,))
        self.log_softmax_backward = op("eager_log_softmax_backward_data", aten._log_softmax_backward_data.default)
        self.nll_loss = op("eager_nll_loss_forward", aten.nll_loss_forward.default, differentiable=(0,))
        self.nll_loss_backward = op("eager_nll_loss_backward", aten.nll_loss_backward.default)
        self.nll_loss2d = op("eager_nll_loss2d_forward", aten.nll_loss2d_forward.default, differentiable=(0,))
        self.nll_loss2d_backward = op("eager_nll_loss2d_backward", aten.nll_loss2d_backward.default)
        self.batch_norm = op("eager_native_batch_norm", aten.native_batch_norm.default, differentiable=(0,))
        self.batch_norm_functional = op(
            "eager_native_batch_norm_functional", aten._native_batch_norm_legit_functional.default, differentiable=(0,)
        )
        self.batch_norm_backward = op("eager_native_batch_norm_backward", aten.native_batch_norm_backward.default)
        self.convolution = op("eager_convolution", aten.convolution.default, differentiable=(0,))
        self.convolution_backward = op("eager_convolution_backward", aten.convolution_backward.default)
        self.sdpa = op(
            "eager_sdpa_flash_cpu", aten._scaled_dot_product_flash_attention_for_cpu.default, differentiable=(0,)
        )
        self.sdpa_backward = op(
            "eager_sdpa_flash_cpu_backward", aten._scaled_dot_product_flash_attention_for_cpu_backward.default
        )
        self.sdpa_math, self.sdpa_math_backward = _sdpa_math_operators(executor)
        #: without grad: thunder's symbol, run as eager's function
        self.inference = {
            symbol: executor.register_operator(name, like=symbol, module=module)
            for symbol, (name, module) in _INFERENCE.items()
        }

    # gelu ---------------------------------------------------------------------------------------

    @staticmethod
    def gelu_checker(a: Any, /, *, approximate: str = "none") -> bool:
        return _float(a) and approximate in ("none", "tanh")

    def gelu_grad(self, a: TensorProxy, /, *, approximate: str = "none") -> TensorProxy:
        out = self.gelu(a, approximate)
        put_grad(a, self.gelu_backward(get_grad(out), a, approximate))
        return out

    # layer_norm ---------------------------------------------------------------------------------

    @staticmethod
    def layer_norm_checker(a: Any, /, normalized_shape: Sequence[int], weight=None, bias=None, eps=1e-5) -> bool:
        return _float(a) and _plain(weight, bias)

    def layer_norm_grad(self, a, /, normalized_shape, weight=None, bias=None, eps=1e-5):
        shape = list(normalized_shape)
        out, mean, rstd = self.layer_norm(a, shape, weight, bias, eps)
        mask = _wanted(a, weight, bias)
        ga, gw, gb = self.layer_norm_backward(get_grad(out), a, shape, mean, rstd, weight, bias, mask)
        _put_grads((a, weight, bias), (ga, gw, gb))
        return out

    # batch_norm: ATen's native_batch_norm and its backward; in training, the running statistics as the
    # kernel updates them (its functional form, then copied into the buffers, as thunder's own rule does)

    @staticmethod
    def batch_norm_checker(a: Any, /, running_mean=None, running_var=None, weight=None, bias=None, training=False,
                           momentum=0.1, eps=1e-5) -> bool:
        """Every tensor of ``a``'s dtype (eager's CPU kernel; mixed precision takes other paths), running
        statistics without grad, a number for ``momentum``."""
        return (
            _float(a) and a.ndim >= 2 and _plain(weight, bias, running_mean, running_var)
            and all(t.dtype == a.dtype for t in (weight, bias, running_mean, running_var) if t is not None)
            and not any(t.requires_grad for t in (running_mean, running_var) if t is not None)
            and type(momentum) in (int, float) and type(eps) in (int, float) and isinstance(training, bool)
        )

    def batch_norm_grad(self, a, /, running_mean=None, running_var=None, weight=None, bias=None, training=False,
                        momentum=0.1, eps=1e-5):
        if training and running_mean is not None and running_var is not None:
            out, mean, invstd, new_mean, new_var = self.batch_norm_functional(
                a, weight, bias, running_mean, running_var, True, momentum, eps
            )
            ltorch.copy_(running_mean, new_mean)
            ltorch.copy_(running_var, new_var)
        else:  # eval mode, or no running statistics: the kernel changes nothing
            out, mean, invstd = self.batch_norm(a, weight, bias, running_mean, running_var, training, momentum, eps)
        mask = _wanted(a, weight, bias)
        # in training the kernel reads the batch's statistics only: the buffers are not kept for the backward
        stats = (None, None) if training else (running_mean, running_var)
        ga, gw, gb = self.batch_norm_backward(get_grad(out), a, weight, *stats, mean, invstd, training, eps, mask)
        _put_grads((a, weight, bias), (ga, gw, gb))
        return out

    # conv1d / conv2d / conv3d -------------------------------------------------------------------

    @staticmethod
    def conv_checker(a: Any, /, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) -> bool:
        """Batched input, numeric padding (eager routes ``"same"``/``"valid"`` and unbatched input
        through other functions first)."""
        return (_float(a) and _plain(weight, bias) and a.ndim == weight.ndim and not isinstance(padding, str))

    def conv_grad(self, a, /, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        dims = a.ndim - 2
        stride, padding, dilation = (_per_dim(v, dims) for v in (stride, padding, dilation))
        out = self.convolution(a, weight, bias, stride, padding, dilation, False, [0] * dims, groups)
        bias_sizes = list(bias.shape) if bias is not None else None
        mask = _wanted(a, weight, bias)
        ga, gw, gb = self.convolution_backward(
            get_grad(out), a, weight, bias_sizes, stride, padding, dilation, False, [0] * dims, groups, mask
        )
        _put_grads((a, weight, bias), (ga, gw, gb))
        return out

    # softmax / log_softmax ----------------------------------------------------------------------

    @staticmethod
    def softmax_checker(a: Any, /, dim: int, *, dtype=None) -> bool:
        return _float(a) and (dtype is None or dtypes.to_dtype(dtype) == a.dtype)

    def softmax_execute(self, a, /, dim, *, dtype=None):
        return self.inference[ltorch_private("_softmax")](a, dim)  # the checker ensured dtype is a's

    def softmax_grad(self, a, /, dim, *, dtype=None):
        out = self.softmax(a, dim, False)
        put_grad(a, self.softmax_backward(get_grad(out), out, dim, a.dtype))
        return out

    def log_softmax_execute(self, a, /, dim, *, dtype=None):
        return self.inference[ltorch.log_softmax](a, dim)

    def log_softmax_grad(self, a, /, dim, *, dtype=None):
        out = self.log_softmax(a, dim, False)
        put_grad(a, self.log_softmax_backward(get_grad(out), out, dim, a.dtype))
        return out

    # cross_entropy = log_softmax + nll_loss, as ATen's cross_entropy_loss composes it -----------

    @staticmethod
    def cross_entropy_checker(
        a,
        /,
        target,
        weight=None,
        size_average=None,
        ignore_index=-100,
        reduce=None,
        reduction="mean",
        label_smoothing=0.0,
    ) -> bool:
        return (
            _float(a)
            and a.ndim >= 1
            and type(target) is TensorProxy
            and not dtypes.is_float_dtype(target.dtype)  # class indices, not probabilities
            and target.ndim == a.ndim - 1
            and _plain(weight)
            and (weight is None or requires_grad(weight) is False)  # eager raises; thunder's rule decides
            and size_average is None
            and reduce is None
            and reduction in _REDUCTIONS
            and label_smoothing == 0.0
        )

    def cross_entropy_grad(
        self,
        a,
        /,
        target,
        weight=None,
        size_average=None,
        ignore_index=-100,
        reduce=None,
        reduction="mean",
        label_smoothing=0.0,
    ):
        code = _REDUCTIONS[reduction]
        logp = self.log_softmax(a, _class_dim(a), False)
        out, saved = self._nll_loss(logp, target, weight, code, ignore_index)
        g_logp = self._nll_loss_grad(get_grad(out), logp, target, weight, code, ignore_index, *saved)
        put_grad(a, self.log_softmax_backward(g_logp, logp, _class_dim(a), a.dtype))
        return out

    # nll_loss: what cross_entropy composes; thunder's own backward returns an (n, c, 1, -1) gradient
    # for 3-D and 5-D+ inputs and reads an unspecified ignore_index as None -------------------------

    @staticmethod
    def nll_loss_checker(a, /, target, weight=None, ignore_index=None, reduction="mean") -> bool:
        return (
            _float(a)
            and a.ndim >= 1
            and type(target) is TensorProxy
            and not dtypes.is_float_dtype(target.dtype)
            and target.ndim == a.ndim - 1
            and _plain(weight)
            and (weight is None or requires_grad(weight) is False)  # eager raises; thunder's rule decides
            and (ignore_index is None or isinstance(ignore_index, int))
            and reduction in _REDUCTIONS
        )

    def nll_loss_execute(self, a, /, target, weight=None, ignore_index=None, reduction="mean"):
        return self._nll_loss(a, target, weight, _REDUCTIONS[reduction], _ignored(ignore_index))[0]

    def nll_loss_grad(self, a, /, target, weight=None, ignore_index=None, reduction="mean"):
        code, ignore_index = _REDUCTIONS[reduction], _ignored(ignore_index)
        out, saved = self._nll_loss(a, target, weight, code, ignore_index)
        put_grad(a, self._nll_loss_grad(get_grad(out), a, target, weight, code, ignore_index, *saved))
        return out

    def _nll_loss(self, logp, target, weight, code, ignore_index):
        """The loss and what its backward reads, as ATen's ``nll_loss_nd`` computes them: 1-D and
        2-D inputs through ``nll_loss``, others through ``nll_loss2d`` on an ``(n, c, 1, -1)`` view
        (a 4-D input as it is)."""
        if logp.ndim < 3:
            out, total_weight = self.nll_loss(logp, target, weight, code, ignore_index)
            return out, (logp, target, total_weight)
        n, c = logp.shape[0], logp.shape[1]
        loss_in = logp if logp.ndim == 4 else ltorch.reshape(logp, (n, c, 1, -1))
        loss_target = target if logp.ndim == 4 else ltorch.reshape(target, (n, 1, -1))
        out, total_weight = self.nll_loss2d(loss_in, loss_target, weight, code, ignore_index)
        if code == 0 and logp.ndim != 4:
            out = ltorch.reshape(out, (n, *logp.shape[2:]))
        return out, (loss_in, loss_target, total_weight)

    def _nll_loss_grad(self, grad, logp, target, weight, code, ignore_index, loss_in, loss_target, total_weight):
        """The gradient of :meth:`_nll_loss` with respect to ``logp``, in ``logp``'s shape."""
        if logp.ndim < 3:
            return self.nll_loss_backward(grad, logp, target, weight, code, ignore_index, total_weight)
        if code == 0:  # per-element losses: the gradient in the kernel's (n, 1, -1) layout
            grad = ltorch.reshape(grad, tuple(loss_target.shape))
        g_loss_in = self.nll_loss2d_backward(grad, loss_in, loss_target, weight, code, ignore_index, total_weight)
        return ltorch.reshape(g_loss_in, tuple(logp.shape))

    # scaled_dot_product_attention: the CPU flash kernel, where eager picks it ------------------

    @staticmethod
    def sdpa_checker(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None) -> bool:
        """The CPU flash kernel where eager picks it; eager's math composite for a float mask known to require
        grad (asked while autodiff runs), where eager picks the math backend (dropout declined: its random
        numbers could not be drawn again for the backward)."""
        if not all(_float(t) for t in (q, k, v)) or dropout_p != 0.0:
            return False
        if any(devices.to_torch_device(t.device).type != "cpu" for t in (q, k, v, attn_mask) if t is not None):
            return False
        if _math_mask(attn_mask, q):
            grads = tuple(requires_grad(t) is True for t in (q, k, v, attn_mask))
            backend = _eager_sdpa_backend(q, k, v, attn_mask, is_causal, scale, grads)
            return backend == torch.nn.attention.SDPBackend.MATH
        if not _kernel_mask(attn_mask, q):
            return False
        backend = _eager_sdpa_backend(q, k, v, attn_mask, is_causal, scale)
        return backend == torch.nn.attention.SDPBackend.FLASH_ATTENTION

    def sdpa_grad(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None):
        if _math_mask(attn_mask, q):  # eager's math composite, differentiated by eager's autograd
            out = self.sdpa_math(q, k, v, attn_mask, is_causal, scale)
            grads = self.sdpa_math_backward(get_grad(out), q, k, v, attn_mask, is_causal, scale)
            for t, g in zip((q, k, v, attn_mask), grads):
                put_grad(t, g)
            return out
        if attn_mask is not None and requires_grad(attn_mask) is not False:  # the checker let it through
            raise RuntimeError(  # the kernel's backward gives the mask no gradient: never silently
                f"eager_kernels: the flash kernel was asked to differentiate an SDPA whose mask {attn_mask.name} "
                "may require grad; it gives the mask no gradient (eager runs its math kernel there)"
            )
        if attn_mask is not None and attn_mask.dtype is dtypes.bool8:  # eager's additive mask: -inf where False
            zeros = ltorch.zeros_like(attn_mask, dtype=q.dtype)
            attn_mask = ltorch.masked_fill(zeros, ltorch.logical_not(attn_mask), float("-inf"))
        out, logsumexp = self.sdpa(q, k, v, dropout_p, is_causal, attn_mask, scale)
        gq, gk, gv = self.sdpa_backward(
            get_grad(out), q, k, v, out, logsumexp, dropout_p, is_causal, attn_mask, scale
        )
        for t, g in ((q, gq), (k, gk), (v, gv)):
            put_grad(t, g)
        return out


def _per_dim(value: int | Sequence[int], dims: int) -> list[int]:
    """A convolution's ``stride``/``padding``/``dilation`` as ATen's ``convolution`` takes it: one per dim."""
    return [int(value)] * dims if isinstance(value, int) else [int(v) for v in value]


def _kernel_mask(mask: Any, q: Any) -> bool:
    """No mask, or one of 2 or 4 dims (the layouts the CPU flash kernel reads) that gets no gradient:
    boolean (transformers 5's ``sdpa_mask``; eager converts it to an additive float mask) or additive in
    the query's dtype and known not to require grad (transformers 4's padding masks). Masks requiring a
    gradient (T5's and Swin's relative position biases, computed from parameters) stay thunder's, as
    eager runs its math kernel for them: whether one does is the trace's data flow (``output_grads.
    requires_grad``), not the proxy's ``requires_grad``, which thunder sets on the trace's inputs only."""
    if mask is None:
        return True
    if type(mask) is not TensorProxy or mask.ndim not in (2, 4):
        return False
    return mask.dtype is dtypes.bool8 or (mask.dtype == q.dtype and requires_grad(mask) is False)


def _math_mask(mask: Any, q: Any) -> bool:
    """A float mask of the query's dtype that the trace's data flow says requires grad (``True``, never the
    ``None`` of a question asked outside autodiff): eager's math backend differentiates it."""
    return (type(mask) is TensorProxy and dtypes.is_float_dtype(mask.dtype) and mask.dtype == q.dtype
            and requires_grad(mask) is True)


def _eager_sdpa_backend(q, k, v, attn_mask, is_causal: bool, scale: float | None,
                        grads: Sequence[bool] = (False,) * 4) -> Any:
    """The backend eager's ``F.scaled_dot_product_attention`` picks for these shapes, dtypes and mask
    (``grads``: which of query, key, value and mask require grad, which the choice reads too).

    Asked of torch itself, on stand-ins that share one row of storage (shape and dtype are what
    the CPU choice reads; the last dim is kept unit-stride, as the flash kernel requires).
    """

    def stand_in(t: TensorProxy, grad: bool) -> torch.Tensor:
        shape = tuple(t.shape)
        row = torch.empty(shape[-1] if shape else 1, dtype=dtypes.to_torch_dtype(t.dtype), requires_grad=grad)
        return row.as_strided(shape, (0,) * (len(shape) - 1) + (1,)) if shape else row[0]

    mask = stand_in(attn_mask, grads[3]) if attn_mask is not None else None
    choice = torch._fused_sdp_choice(
        stand_in(q, grads[0]), stand_in(k, grads[1]), stand_in(v, grads[2]), attn_mask=mask, is_causal=is_causal,
        scale=scale
    )
    return torch.nn.attention.SDPBackend(choice)


#: ltorch symbol -> (checker, execution transform or None, grad transform) names on :class:`_Kernels`.
_RULES: dict[Any, tuple[str, str | None, str]] = {
    ltorch.gelu: ("gelu_checker", None, "gelu_grad"),
    ltorch.layer_norm: ("layer_norm_checker", None, "layer_norm_grad"),
    ltorch_private("_softmax"): ("softmax_checker", "softmax_execute", "softmax_grad"),
    ltorch.log_softmax: ("softmax_checker", "log_softmax_execute", "log_softmax_grad"),
    ltorch.cross_entropy: ("cross_entropy_checker", None, "cross_entropy_grad"),
    ltorch.nll_loss: ("nll_loss_checker", "nll_loss_execute", "nll_loss_grad"),
    ltorch.scaled_dot_product_attention: ("sdpa_checker", None, "sdpa_grad"),
    ltorch.batch_norm: ("batch_norm_checker", None, "batch_norm_grad"),
    ltorch.conv1d: ("conv_checker", None, "conv_grad"),
    ltorch.conv2d: ("conv_checker", None, "conv_grad"),
    ltorch.conv3d: ("conv_checker", None, "conv_grad"),
}

#: ltorch symbol -> the eager function its operator calls without grad (name, module), as thunder's
#: torch executor names them.
_INFERENCE: dict[Any, tuple[str, Any]] = {
    ltorch.gelu: ("gelu", torch.nn.functional),
    ltorch.layer_norm: ("layer_norm", torch.nn.functional),
    ltorch_private("_softmax"): ("softmax", torch),
    ltorch.log_softmax: ("log_softmax", torch.nn.functional),
    ltorch.cross_entropy: ("cross_entropy", torch.nn.functional),
    ltorch.scaled_dot_product_attention: ("scaled_dot_product_attention", torch.nn.functional),
    ltorch.batch_norm: ("batch_norm", torch.nn.functional),  # updates the running statistics, as eager's
    ltorch.conv1d: ("conv1d", torch.nn.functional),
    ltorch.conv2d: ("conv2d", torch.nn.functional),
    ltorch.conv3d: ("conv3d", torch.nn.functional),
}


def claimed_symbols() -> tuple[Any, ...]:
    """The ltorch symbols this executor may take (documentation and tests)."""
    return tuple(_RULES)


def build_executor() -> OperatorExecutor:
    """The executor, named :data:`EXECUTOR_NAME`; like the ``aten`` executor, not added to thunder's
    registry of executors."""
    executor = UniqueNamesExecutor(EXECUTOR_NAME, version="0.1.0")
    kernels = _Kernels(executor)
    for symbol, (checker, execute, grad) in _RULES.items():
        executor.register_implementation(
            symbol,
            kernels.inference.get(symbol),
            checker=getattr(kernels, checker),
            execution_transform=getattr(kernels, execute) if execute is not None else None,
            grad_transform=getattr(kernels, grad),
        )
    return executor
