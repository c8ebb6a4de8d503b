"""The ``eager_backward_kernels`` executor: activations, clamps, powers, element-wise and reduced
maxima run as eager autograd runs them, forward and backward; and the ops thunder 0.2.6 cannot
differentiate at all (``flip``, ``lerp``, ``remainder``; ``round``, ``trunc`` and ``div`` with a rounding
mode, whose gradients are zeros; ``nextafter`` and zeta's first argument, whose backward raises eager's
``NotImplementedError``, as ``2 % x``'s and ``floor_divide``'s (``x // y``) raise eager's ``RuntimeError``);
``prod``, whose rule in thunder divides by the input (NaN at zeros).

Why: with gradients enabled thunder differentiates these ops through its own decompositions and
rules, which differ from eager in two ways.

* NaN and inf: ``relu`` becomes ``where(x > 0, x, 0)`` (``relu(NaN)`` is 0, so a diverged model
  reports a finite loss), ``clamp``'s rule passes the gradient of NaN and drops the one at the
  bounds, ``torch.max(x)`` distributes its gradient over the elements equal to a NaN maximum
  (none), ``max(x, dim)`` splits it among ties where eager gives it to the index it returns.
* ulps: ``tanh``, ``sigmoid``, ``silu``, ``softplus``, ``pow``, ``rsqrt``... have backward
  formulas that are mathematically eager's but rounded differently (``tanh`` and ``silu`` 2.4e-7,
  ``pow(x, 3)`` 7.6e-6 on one op; AdamW amplifies it over a few steps).

How: like :mod:`thunderplug_aten_ops.eager_kernels` (and in the same way: one
``OperatorExecutor``, ``register_implementation(symbol, checker, execution_transform,
grad_transform)`` on thunder's own symbols, placed before autodiff). The forward is ATen's kernel;
the backward is ATen's backward kernel where eager's autograd calls one (``threshold_backward``,
``hardtanh_backward``, ``tanh_backward``, ``silu_backward``, ...), else eager's derivative formula
(``derivatives.yaml`` / ``FunctionsManual.cpp``) written with the same torch calls in the same
order and run as one operator, so no fuser regroups it. Gradients of broadcast operands are summed
back with ``sum_to_size`` and cast to the input's dtype, as eager's autograd engine does.

Two ops are here for their gradients' bits rather than NaN/inf: ``torch._grouped_mm`` (transformers' MoE
experts; thunder's symbol takes no ``offs``), with ATen's arguments and kernel and derivatives.yaml's
layout-dependent backward (:mod:`thunderplug_aten_ops.grouped_mm`); and ``linear`` with a bias on an input of
3 or more dims, whose bias gradient eager sums over the rows of a copy of the upstream gradient (ATen runs a
contiguous batched ``linear`` as one ``addmm``), where thunder summed the gradient as it arrived (a key
bias's gradient, zero but for rounding, differed: DeBERTa-v2).

More ops thunder rounds otherwise than eager (``erfinv``, ``erfc``, ``addcmul``, ``addcdiv``, ``var``/``std``/
``var_mean``, ``repeat``, ``mse_loss``, ``rms_norm``, ``group_norm``, bilinear and nearest-exact ``interpolate``,
``number / x``, ``adaptive_avg_pool2d`` to one element, which eager computes as ``mean``) run as the torch
function itself and eager's autograd through it (:mod:`thunderplug_aten_ops.composites`); ``F.pad``'s reflect,
replicate and circular modes, which thunder refuses, as
``F.pad`` itself (:mod:`thunderplug_aten_ops.pad_modes`); ``F.interpolate`` in every form eager accepts (thunder refuses
some modes, ``align_corners=True``, an integer ``scale_factor``) as ``F.interpolate`` itself
(:mod:`thunderplug_aten_ops.interpolate_modes`); ``F.avg_pool*d`` with ``count_include_pad=False`` too
(:mod:`thunderplug_aten_ops.avg_pool_forms`); ``round(decimals=...)``, ``index_add`` (``alpha``), ``nan_to_num``'s
keywords, ``Tensor.unfold`` under grad and ``torch._weight_norm``, which thunder refuses, likewise
(:mod:`thunderplug_aten_ops.torch_forms`);
``torch.broadcast_tensors``/``meshgrid`` as one view per input, so that an input only unused outputs read gets no
gradient, as in eager (:mod:`thunderplug_aten_ops.broadcast_views`).
Random ops under grad (dropout in every form, ``rrelu``, ``gumbel_softmax``, SDPA with ``dropout_p``) as the torch
function itself, the backward replaying the generator's state so that it differentiates the forward's mask; the
in-place samplers (``bernoulli_``, ``normal_``, ``uniform_``, ``exponential_``, ...), ``torch.bernoulli`` and
``torch.randperm`` as the torch function itself at their place in the trace (:mod:`thunderplug_aten_ops.random_ops`).

Checkers decline (leaving the op to thunder) for tensor-subclass arguments, non-float inputs,
``inplace=True`` and argument forms eager would route to another kernel. ``discover(
exclude=["eager_backward_kernels"])`` turns the executor off.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from numbers import Number
from typing import Any

import thunder.torch as ltorch
import torch
from thunder.core.proxies import TensorProxy
from thunder.core.transforms import get_grad, put_grad
from thunder.extend import OperatorExecutor

from thunderplug.eager.output_grads import requires_grad
from thunderplug.tracing.fake import to_torch_value
from thunderplug_aten_ops import (
    attention,
    avg_pool_forms,
    broadcast_views,
    complex_ops,
    composites,
    grouped_mm,
    interpolate_modes,
    pad_modes,
    parametrizations,
    random_ops,
    rnns,
    scalar_operands,
    torch_forms,
)
from thunderplug_aten_ops.eager_kernels import UniqueNamesExecutor, _float, _operator

EXECUTOR_NAME = "eager_backward_kernels"
aten = torch.ops.aten

#: eager's SELU constants (``at::native``'s ``SELU_ALPHA`` / ``SELU_SCALE``)
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


# -- eager's derivative formulas, as torch calls on real tensors ---------------------------------


def _as_input(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """What eager's autograd engine does to a gradient before handing it to an input: sum it to the
    input's shape (a broadcast operand), then cast it to the input's dtype."""
    if grad.shape != like.shape:
        grad = grad.sum_to_size(like.shape)
    return grad.to(like.dtype) if grad.dtype != like.dtype else grad


def _mul_backward(grad, other, a):
    """``mul_tensor_backward(grad, other)``: ``grad * other``, the cotangent first (its layout decides the
    product's, and so the order in which a broadcast operand's gradient is summed), then summed to ``a``."""
    return _as_input(grad * other, a)


def _mean_backward(grad, a, dims, keepdim):
    """``mean``'s rule (``grad.expand(sizes) / numel``; ``mean_backward`` for dims): the cotangent expanded to
    the input's shape, then divided, which gives a tensor of the input's shape in the layout the division picks
    (thunder's rule divides first and expands the quotient: the same values in a stride-0 layout, which decides
    the order in which later reductions sum them, e.g. a layer scale's broadcast gradient after ConvNeXt's
    pooler)."""
    if not dims:  # all of them
        return grad.expand(a.shape) / a.numel()
    dims = sorted(d % a.ndim for d in dims) if a.ndim else []
    count = 1
    for d in dims:
        count *= a.shape[d]
    if not keepdim:
        for d in dims:
            grad = grad.unsqueeze(d)
    return grad.expand(a.shape) / count


def _rsqrt_backward(grad, result):
    return -0.5 * grad * result.pow(3)


def _reciprocal_backward(grad, result):
    return -grad * (result * result)


def _abs_backward(grad, a):
    return grad * a.sgn()


def _pow_scalar_backward(grad, a, exponent):
    """``pow_backward(grad, self, Scalar exponent)``."""
    if exponent == 0:
        return torch.zeros_like(a)
    exponent = float(exponent)
    return grad * (exponent * a.pow(exponent - 1))


def _pow_tensor_backward(grad, a, exponent, result):
    """``pow_backward_self`` and ``pow_backward_exponent`` for a tensor exponent."""
    zero = torch.zeros((), dtype=grad.dtype, device=grad.device)
    grad_a = torch.where(exponent == 0.0, zero, grad * (exponent * a.pow(exponent - 1)))
    at_zero = torch.logical_and(a == 0, exponent >= 0)
    grad_exponent = grad * torch.where(at_zero, zero, result * a.to(torch.result_type(a, exponent)).log())
    return _as_input(grad_a, a), _as_input(grad_exponent, exponent)


def _pow_scalar_base_backward(grad, base, exponent, result):
    """``pow.Scalar`` (``2 ** x``): ``pow_backward_exponent`` for a number base, ``grad * (result * log(base))``,
    zeros where the base is 0 and the exponent ``>= 0``."""
    log = math.log(base) if base > 0 else -math.inf if base == 0 else math.nan  # ``std::log`` of the number
    if base == 0:
        zero = torch.zeros((), dtype=grad.dtype, device=grad.device)
        return grad * torch.where(exponent >= 0, zero, result * log)
    return grad * (result * log)


def _maximum_backward(grad, a, b, smaller_is_kept: bool):
    """``maximum``'s (``minimum``'s with ``smaller_is_kept``) rule: half each to ties, nothing to
    the operand that lost; NaN compares false both ways, so both operands of a NaN get it all."""
    shared = torch.where(a == b, grad / 2, grad)
    a_lost, b_lost = (a > b, a < b) if smaller_is_kept else (a < b, a > b)
    return _as_input(shared.masked_fill(a_lost, 0), a), _as_input(shared.masked_fill(b_lost, 0), b)


def _clamp_backward(grad, a, low, high):
    """``clamp_backward`` (both bound kinds): the gradient where ``low <= a <= high``, bounds
    included; a NaN ``a`` compares false and gets none."""
    zero = torch.scalar_tensor(0.0, dtype=grad.dtype, device=grad.device)
    if low is not None and high is not None:
        kept = (a >= low).logical_and_(a <= high)
    elif low is not None:
        kept = a >= low
    else:
        kept = a <= high
    return torch.where(kept, grad, zero)


def _clamp_tensor_backward(grad, a, low, high):
    """``clamp_backward`` and ``clamp_backward_min_max`` for tensor bounds (``None`` where a
    bound is absent); each gradient summed to its operand's shape."""
    zero = torch.scalar_tensor(0.0, dtype=grad.dtype, device=grad.device)
    grads = [_as_input(_clamp_backward(grad, a, low, high), a)]
    if low is not None and high is not None:
        grads.append(_as_input(torch.where((a < low).logical_and_(low < high), grad, zero), low))
        grads.append(_as_input(torch.where((a > high).logical_or_(high < low), grad, zero), high))
    elif low is not None:
        grads.append(_as_input(torch.where(a < low, grad, zero), low))
    else:
        grads.append(_as_input(torch.where(a > high, grad, zero), high))
    return tuple(grads)


def _lerp_scalar_backward(grad, start, end, weight):
    """``lerp.Scalar``: ``grad * (1 - weight)`` to ``start``, ``grad * weight`` to ``end``."""
    weight = float(weight)
    return _as_input(grad * (1 - weight), start), _as_input(grad * weight, end)


def _lerp_tensor_backward(grad, start, end, weight):
    """``lerp.Tensor``: ``grad * (1 - weight)``, ``grad * weight``, ``grad * (end - start)``."""
    return (_as_input(grad * (1 - weight), start), _as_input(grad * weight, end),
            _as_input(grad * (end - start), weight))


def _remainder_backward(grad, a, b):
    """``remainder.Tensor``: the gradient itself to ``a``, ``-grad * a.div(b, "floor")`` to ``b``."""
    return _as_input(grad, a), _as_input(-grad * a.div(b, rounding_mode="floor"), b)


def _remainder_scalar_backward(grad, a):
    return _as_input(grad, a)


def _zeros_backward(grad, a):
    """``round``, ``trunc``, ``floor`` and ``ceil`` (``derivatives.yaml``: ``zeros_like(grad)``): a zero gradient."""
    return torch.zeros_like(grad)


def _zeros_binary_backward(grad, a, b):
    """``div`` with a rounding mode (``div_tensor_self_backward`` / ``div_tensor_other_backward``: zeros)."""
    return _as_input(torch.zeros_like(grad), a), _as_input(torch.zeros_like(grad), b)


def _zeta_backward(grad, a, b):
    """``special_zeta``'s rule for ``other`` (``q``): ``grad * -self * zeta(self + 1, other)``."""
    return _as_input(grad * -a * torch.special.zeta(a + 1.0, b), b)


def _zeta_self_scalar_backward(grad, a, b):
    """``special_zeta.self_scalar``'s rule for ``other``: ``grad * -self * special_zeta(self + 1., other)``."""
    return _as_input(grad * -a * torch.special.zeta(a + 1.0, b), b)


def _not_implemented(op: str) -> Callable[..., Any]:
    """Eager's ``not_implemented(op)`` derivative: the forward runs, the backward raises as eager's does."""

    def backward(grad, a):
        raise NotImplementedError(f"the derivative for '{op}' is not implemented.")

    return backward


def _prod_backward(grad, a, result, dim, keepdim):
    """``prod_backward`` (both overloads): ``grad * (result / a)`` without zeros; with zeros, the product of the
    other elements (``prod_safe_zeros_backward``), and for the whole product with two or more zeros (grad mode
    off, as in a backward without ``create_graph``) zeros, whatever the cotangent (thunder's rule divides by
    ``a``: NaN at a zero, and for a non-finite cotangent NaN everywhere)."""
    if a.dim() == 0:
        return grad
    if dim is None:
        zeros = (a == 0).nonzero()
        if zeros.numel() == 0:
            return grad * (result / a)
        if not torch.is_grad_enabled() and zeros.shape[0] > 1:
            return torch.zeros_like(a)
        return _prod_safe_zeros_backward(grad, a.contiguous().view(-1), 0).view_as(a)
    dim = dim % a.dim()
    if not keepdim:
        grad, result = grad.unsqueeze(dim), result.unsqueeze(dim)
    if int((a == 0).sum(dim, True).sum().item()) == 0:
        return grad * (result / a)
    return _prod_safe_zeros_backward(grad, a, dim)


def _prod_safe_zeros_backward(grad, a, dim):
    """The product of every element but one along ``dim``: exclusive cumulative products from both ends."""
    if a.numel() == 0:
        return grad.expand_as(a)
    ones_size = list(a.shape)
    ones_size[dim] = 1
    ones = torch.ones(ones_size, dtype=grad.dtype, device=grad.device)
    exclusive_normal = torch.cat([ones, a.narrow(dim, 0, a.shape[dim] - 1)], dim).cumprod(dim)
    narrow_reverse = a.narrow(dim, 1, a.shape[dim] - 1).flip(dim)
    exclusive_reverse = torch.cat([ones, narrow_reverse], dim).cumprod(dim).flip(dim)
    return grad * (exclusive_normal * exclusive_reverse)


def _derivative_not_implemented(op: str) -> Callable[..., Any]:
    """Eager's error for an overload ``derivatives.yaml`` does not list (``remainder.Scalar_Tensor``: ``2 % x``):
    its node raises ``RuntimeError`` when the backward reaches it."""

    def backward(grad, a):
        raise RuntimeError(f"derivative for {op} is not implemented")

    return backward


def _aminmax_backward(grad_min, grad_max, a):
    """``aminmax``: ``derivatives.yaml`` lists no rule, so eager's node raises when the backward reaches it."""
    raise RuntimeError("derivative for aten::aminmax is not implemented")


def _restore_reduced_dims(t, dims: Sequence[int], ndim: int, keepdim: bool):
    """``restore_reduced_dims``: size-1 dims back where a reduction without keepdim removed them."""
    if keepdim or not dims:  # no dims: all of them, and the result is 0-dim either way
        return t
    reduced = {d % ndim for d in dims} if ndim else set()
    sizes, rest = [], iter(t.shape)
    for i in range(ndim):
        sizes.append(1 if i in reduced else next(rest))
    return t.reshape(sizes)


def _amax_backward(grad, a, result, dims, keepdim):
    """``amax`` / ``amin``: ``scale_grad_by_count`` over the elements equal to the result (a NaN
    result equals none of them: the count is 0 and the gradient NaN, as in eager)."""
    mask = _restore_reduced_dims(result, dims, a.ndim, keepdim) == a
    return (_restore_reduced_dims(grad, dims, a.ndim, keepdim) / mask.sum(list(dims), True)) * mask


def _full_max_backward(grad, a, result):
    """``evenly_distribute_backward`` (``torch.max(x)`` / ``torch.min(x)`` without dim): shared
    by the elements equal to the result, or by the NaNs when the result is NaN."""
    mask = a.isnan() if result.isnan().item() else a == result
    return grad.new_zeros(a.shape).masked_fill_(mask, grad / mask.sum())


def _max_dim_backward(grad, a, indices, dim, keepdim):
    """``value_selecting_reduction_backward``: all of it to the index ``max(x, dim)`` returned."""
    if not keepdim and a.ndim:
        grad, indices = grad.unsqueeze(dim), indices.unsqueeze(dim)
    return torch.zeros(a.shape, dtype=grad.dtype, device=grad.device).scatter_(dim, indices, grad)


def _logsumexp_backward(grad, a, result, dims, keepdim):
    if not keepdim and a.ndim:
        for d in sorted(d % a.ndim for d in dims):
            grad, result = grad.unsqueeze(d), result.unsqueeze(d)
    return grad * (a - result).exp()


def _linear_bias_backward(grad, a, bias):
    """The bias's gradient as eager's ``linear`` computes it. ATen runs a contiguous input of 3 or more
    dims as one matrix product (``_flatten_nd_linear``: ``addmm`` on ``input.view(-1, in)``, the result
    viewed back): the gradient is reshaped into rows, which copies it when it arrives in another layout
    (DeBERTa's keys, transposed for ``q @ k.T``), and ``addmm``'s bias gradient sums those rows. Summed
    over the leading dims as the gradient arrives instead (thunder's rule), the near-zero sums of a key
    bias (softmax cancels it) differ in their last bits. Other inputs: ``matmul`` then ``add``, whose
    bias gradient is summed from the gradient as it arrives."""
    if a.dim() >= 3 and a.is_contiguous():
        rows = grad.reshape(-1, grad.shape[-1])
        return (rows if rows.is_contiguous() else rows.contiguous()).sum(0)
    return grad.sum(tuple(range(grad.dim() - 1)))


def _normalize_backward(grad, a, p, dim, eps):
    """``F.normalize`` is composite in eager (``a / vector_norm(a).clamp_min(eps)``): its backward
    is eager autograd's through that composition (``norm_backward`` masks the zeros a p < 1 norm
    would turn into NaN), recomputed from the input as thunder's own auto-registered torch ops do."""
    with torch.enable_grad():
        a = a.detach().requires_grad_()
        (found,) = torch.autograd.grad(torch.nn.functional.normalize(a, p, dim, eps), a, grad)
    return found


# -- operators -----------------------------------------------------------------------------------


def _formula(executor: OperatorExecutor, name: str, fn: Callable[..., Any], outputs: Sequence[int]):
    """An operator running ``fn`` (one of eager's formulas above) on real tensors; its outputs are
    shaped like the arguments at ``outputs`` (the inputs whose gradients it computes)."""

    def like(t: TensorProxy) -> TensorProxy:
        return TensorProxy(shape=tuple(t.shape), dtype=t.dtype, device=t.device, requires_grad=False)

    def meta(*args: Any) -> Any:
        found = tuple(like(args[i]) for i in outputs if args[i] is not None)
        return found[0] if len(outputs) == 1 else found

    def run(*args: Any) -> Any:
        return fn(*(to_torch_value(a) for a in args))

    return executor.register_operator(name, meta=meta, fn=run)


def _dims(a: TensorProxy, dim: Any) -> list[int]:
    """A reduction's ``dim`` as ATen's ``int[]`` (``None``: all of them, as an empty list)."""
    if dim is None:
        return []
    return [dim] if isinstance(dim, int) else list(dim)


def _is_bound(x: Any) -> bool:
    return x is None or (isinstance(x, Number) and not isinstance(x, bool))


def _is_tensor_bound(x: Any) -> bool:
    return x is None or _float(x)


class _Kernels:
    """The operators of one executor (built once, by :func:`build_executor`)."""

    def __init__(self, executor: OperatorExecutor):
        def op(name: str, overload: Any) -> Any:
            return _operator(executor, f"eager_{name}", overload, differentiable=(0,))

        def kernel(name: str, overload: Any) -> Any:
            return _operator(executor, f"eager_{name}", overload)

        def formula(name: str, fn: Callable[..., Any], outputs: Sequence[int] = (1,)) -> Any:
            return _formula(executor, f"eager_{name}", fn, outputs)

        self.relu = op("relu", aten.relu.default)
        self.threshold = op("threshold", aten.threshold.default)
        self.threshold_backward = kernel("threshold_backward", aten.threshold_backward.default)
        self.hardtanh = op("hardtanh", aten.hardtanh.default)
        self.hardtanh_backward = kernel("hardtanh_backward", aten.hardtanh_backward.default)
        self.leaky_relu = op("leaky_relu", aten.leaky_relu.default)
        self.leaky_relu_backward = kernel("leaky_relu_backward", aten.leaky_relu_backward.default)
        self.elu = op("elu", aten.elu.default)
        self.elu_backward = kernel("elu_backward", aten.elu_backward.default)
        self.tanh = op("tanh", aten.tanh.default)
        self.tanh_backward = kernel("tanh_backward", aten.tanh_backward.default)
        self.sigmoid = op("sigmoid", aten.sigmoid.default)
        self.sigmoid_backward = kernel("sigmoid_backward", aten.sigmoid_backward.default)
        self.silu = op("silu", aten.silu.default)
        self.silu_backward = kernel("silu_backward", aten.silu_backward.default)
        self.softplus = op("softplus", aten.softplus.default)
        self.softplus_backward = kernel("softplus_backward", aten.softplus_backward.default)
        self.hardswish = op("hardswish", aten.hardswish.default)
        self.hardswish_backward = kernel("hardswish_backward", aten.hardswish_backward.default)
        self.hardsigmoid = op("hardsigmoid", aten.hardsigmoid.default)
        self.hardsigmoid_backward = kernel("hardsigmoid_backward", aten.hardsigmoid_backward.default)
        self.mish = op("mish", aten.mish.default)
        self.mish_backward = kernel("mish_backward", aten.mish_backward.default)
        self.log_sigmoid = op("log_sigmoid_forward", aten.log_sigmoid_forward.default)
        self.log_sigmoid_backward = kernel("log_sigmoid_backward", aten.log_sigmoid_backward.default)
        self.hardshrink = op("hardshrink", aten.hardshrink.default)
        self.hardshrink_backward = kernel("hardshrink_backward", aten.hardshrink_backward.default)
        self.softshrink = op("softshrink", aten.softshrink.default)
        self.softshrink_backward = kernel("softshrink_backward", aten.softshrink_backward.default)
        self.mul = op("mul", aten.mul.Tensor)
        self.mul_backward = formula("mul_backward", _mul_backward, (2,))
        self.mean = op("mean", aten.mean.default)
        self.mean_dim = op("mean_dim", aten.mean.dim)
        self.mean_backward = formula("mean_backward", _mean_backward)
        self.rsqrt = op("rsqrt", aten.rsqrt.default)
        self.rsqrt_backward = formula("rsqrt_backward", _rsqrt_backward)
        self.reciprocal = op("reciprocal", aten.reciprocal.default)
        self.reciprocal_backward = formula("reciprocal_backward", _reciprocal_backward)
        self.glu = op("glu", aten.glu.default)
        self.glu_backward = kernel("glu_backward", aten.glu_backward.default)
        self.abs = op("abs", aten.abs.default)
        self.abs_backward = formula("abs_backward", _abs_backward)
        self.pow_scalar = op("pow_tensor_scalar", aten.pow.Tensor_Scalar)
        self.pow_scalar_backward = formula("pow_scalar_backward", _pow_scalar_backward)
        self.pow_tensor = op("pow_tensor_tensor", aten.pow.Tensor_Tensor)
        self.pow_tensor_backward = formula("pow_tensor_backward", _pow_tensor_backward, (1, 2))
        self.pow_scalar_base = op("pow_scalar_base", aten.pow.Scalar)
        self.pow_scalar_base_backward = formula("pow_scalar_base_backward", _pow_scalar_base_backward, (2,))
        self.maximum = op("maximum", aten.maximum.default)
        self.minimum = op("minimum", aten.minimum.default)
        self.maximum_backward = formula("maximum_backward", _maximum_backward, (1, 2))
        self.clamp = op("clamp", aten.clamp.default)
        self.clamp_backward = formula("clamp_backward", _clamp_backward)
        self.clamp_tensor = op("clamp_tensor", aten.clamp.Tensor)
        self.clamp_tensor_backward = formula("clamp_tensor_backward", _clamp_tensor_backward, (1, 2, 3))
        self.amax = op("amax", aten.amax.default)
        self.amin = op("amin", aten.amin.default)
        self.amax_backward = formula("amax_backward", _amax_backward)
        self.full_max = op("max", aten.max.default)
        self.full_max_backward = formula("max_backward", _full_max_backward)
        self.logsumexp = op("logsumexp", aten.logsumexp.default)
        self.logsumexp_backward = formula("logsumexp_backward", _logsumexp_backward)
        self.normalize = _formula(executor, "eager_normalize", torch.nn.functional.normalize, (0,))
        self.normalize_backward = formula("normalize_backward", _normalize_backward)
        self.max_dim = _operator(executor, "eager_max_dim", aten.max.dim, differentiable=(0,))
        self.aminmax = _operator(executor, "eager_aminmax", aten.aminmax.default, differentiable=(0, 1))
        self.aminmax_backward = formula("aminmax_backward", _aminmax_backward, (2,))
        self.flip = op("flip", aten.flip.default)
        self.lerp_scalar = op("lerp_scalar", aten.lerp.Scalar)
        self.lerp_tensor = op("lerp_tensor", aten.lerp.Tensor)
        self.lerp_scalar_backward = formula("lerp_scalar_backward", _lerp_scalar_backward, (1, 2))
        self.lerp_tensor_backward = formula("lerp_tensor_backward", _lerp_tensor_backward, (1, 2, 3))
        self.remainder_scalar = op("remainder_scalar", aten.remainder.Scalar)
        self.remainder_tensor = op("remainder_tensor", aten.remainder.Tensor)
        self.remainder_backward = formula("remainder_backward", _remainder_backward, (1, 2))
        self.remainder_scalar_backward = formula("remainder_scalar_backward", _remainder_scalar_backward)
        self.remainder_scalar_tensor = op("remainder_scalar_tensor", aten.remainder.Scalar_Tensor)
        self.round = op("round", aten.round.default)
        self.trunc = op("trunc", aten.trunc.default)
        self.floor = op("floor", aten.floor.default)
        self.ceil = op("ceil", aten.ceil.default)
        self.zeros_backward = formula("zeros_backward", _zeros_backward)
        self.zeros_binary_backward = formula("zeros_binary_backward", _zeros_binary_backward, (1, 2))
        self.div_mode = op("div_tensor_mode", aten.div.Tensor_mode)
        self.div_scalar_mode = op("div_scalar_mode", aten.div.Scalar_mode)
        self.floor_divide = op("floor_divide", aten.floor_divide.default)
        self.floor_divide_scalar = op("floor_divide_scalar", aten.floor_divide.Scalar)
        self.floor_divide_backward = formula(
            "floor_divide_backward", _derivative_not_implemented("aten::floor_divide"))
        self.heaviside = op("heaviside", aten.heaviside.default)
        self.heaviside_backward = formula("heaviside_backward", _derivative_not_implemented("aten::heaviside"))
        self.prod = op("prod", aten.prod.default)
        self.prod_dim = op("prod_dim", aten.prod.dim_int)
        self.prod_backward = formula("prod_backward", _prod_backward)
        self.remainder_scalar_tensor_backward = formula(
            "remainder_scalar_tensor_backward", _derivative_not_implemented("aten::remainder"))
        self.nextafter = op("nextafter", aten.nextafter.default)
        self.nextafter_backward = formula("nextafter_backward", _not_implemented("nextafter"))
        self.zeta = op("zeta", aten.special_zeta.default)
        self.zeta_backward = formula("zeta_backward", _zeta_backward, (2,))
        self.zeta_self_backward = formula("zeta_self_backward", _not_implemented("zeta"))
        self.zeta_other_scalar = op("zeta_other_scalar", aten.special_zeta.other_scalar)
        self.zeta_self_scalar = op("zeta_self_scalar", aten.special_zeta.self_scalar)
        self.zeta_self_scalar_backward = formula("zeta_self_scalar_backward", _zeta_self_scalar_backward, (2,))
        self.max_dim_backward = formula("max_dim_backward", _max_dim_backward)
        self.detach = kernel("detach", aten.detach.default)
        self.linear = op("linear", aten.linear.default)
        self.linear_inference = executor.register_operator("linear", like=ltorch.linear, module=torch.nn.functional)
        self.linear_bias_backward = formula("linear_bias_backward", _linear_bias_backward, (2,))

    def threshold_backward_at_zero(self, grad: TensorProxy, result: TensorProxy) -> TensorProxy:
        """``relu``'s backward: ``threshold_backward(grad, result, 0)``."""
        return self.threshold_backward(grad, result, 0)

    def elu_backward_input_last(self, grad, a, alpha, scale, input_scale, is_result):
        """``elu_backward(grad, alpha, scale, input_scale, is_result, self)``: the input comes last."""
        return self.elu_backward(grad, alpha, scale, input_scale, is_result, a)


def _unary(forward: str, backward: str, *, reads: str, extra: Callable[..., tuple] = lambda **kw: (),
           inplace: str | None = None):
    """Checker, execution and grad transforms of a one-input activation: ``forward(a, *extra)``
    then ``backward(grad, <a or the result>, *extra-for-backward)``.

    ``reads`` is ``"input"`` or ``"result"`` (what ATen's backward kernel reads); ``extra`` maps the
    symbol's keyword arguments to ``(forward_args, backward_args)``. ``inplace``: how eager's autograd
    differentiates the ``inplace=True`` form (:data:`_INPLACE`), which is then taken too: ``"result"``, the
    backward kernel reads the result (``is_result=True`` where the kernel has that flag, its last argument),
    which the ``copy_`` into the input leaves intact; ``"original"``, it reads a copy of the input taken before
    the update (autograd's ``original_self``), here a ``clone`` the forward kernel reads too, so that it stays
    in the forward (thunder's split moves a value only the backward reads into the backward, where the input
    has been overwritten). ``None``: the in-place form stays thunder's.
    """

    def split(args: tuple, kwargs: dict) -> tuple[TensorProxy, tuple, tuple, bool]:
        a, *rest = args
        params = dict(kwargs)
        names = extra.__code__.co_varnames[: extra.__code__.co_kwonlyargcount]
        params.update(zip(names, rest))
        inplace = params.pop("inplace", False)
        fwd, bwd = extra(**params) or ((), ())
        return a, fwd, bwd, inplace

    def checker(*args: Any, **kwargs: Any) -> bool:
        a, _, _, in_place = split(args, kwargs)
        return _float(a) and (not in_place or inplace is not None)

    def execute(kernels: _Kernels, *args: Any, **kwargs: Any) -> TensorProxy:
        a, fwd, _, in_place = split(args, kwargs)
        out = getattr(kernels, forward)(a, *fwd)
        out = out[0] if isinstance(out, tuple) else out
        return ltorch.copy_(a, out) if in_place else out

    def grad(kernels: _Kernels, *args: Any, **kwargs: Any) -> TensorProxy:
        a, fwd, bwd, in_place = split(args, kwargs)
        source = ltorch.clone(a) if in_place and inplace == "original" else a
        out = getattr(kernels, forward)(source, *fwd)
        saved: tuple = ()
        if isinstance(out, tuple):  # log_sigmoid_forward: (result, buffer)
            out, *rest = out
            saved = tuple(rest)
        result = ltorch.copy_(a, out) if in_place else out
        read = source if reads == "input" else out
        if in_place and inplace == "result":
            read = out
            if reads == "input" and bwd and bwd[-1] is False:  # the kernel's is_result flag
                bwd = (*bwd[:-1], True)
        put_grad(a, getattr(kernels, backward)(get_grad(result), read, *bwd, *saved))
        return result

    return checker, execute, grad


def _no_params(*, inplace: bool = False) -> tuple:
    return ((), ())


def _threshold_params(*, threshold: float, value: float, inplace: bool = False) -> tuple:
    return ((threshold, value), (threshold,))


def _hardtanh_params(*, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> tuple:
    return ((min_val, max_val), (min_val, max_val))


def _relu6_params(*, inplace: bool = False) -> tuple:
    return ((0.0, 6.0), (0.0, 6.0))


def _leaky_relu_params(*, negative_slope: float = 0.01, inplace: bool = False) -> tuple:
    return ((negative_slope,), (negative_slope, False))


def _elu_params(*, alpha: float = 1.0, inplace: bool = False) -> tuple:
    return ((alpha, 1.0, 1.0), (alpha, 1.0, 1.0, False))


def _celu_params(*, alpha: float = 1.0, inplace: bool = False) -> tuple:
    return ((alpha, 1.0, 1.0 / alpha), (alpha, 1.0, 1.0 / alpha, False))


def _selu_params(*, inplace: bool = False) -> tuple:
    return ((_SELU_ALPHA, _SELU_SCALE, 1.0), (_SELU_ALPHA, _SELU_SCALE, 1.0, False))


def _aten_elu_params(*, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> tuple:
    return ((alpha, scale, input_scale), (alpha, scale, input_scale, False))


def _glu_params(*, dim: int = -1) -> tuple:
    return ((dim,), (dim,))


def _softplus_params(*, beta: float = 1.0, threshold: float = 20.0) -> tuple:
    return ((beta, threshold), (beta, threshold))


def _shrink_params(*, lambd: float = 0.5) -> tuple:
    return ((lambd,), (lambd,))


# -- multi-input rules ---------------------------------------------------------------------------


class _Rules:
    """Checkers, execution transforms and grad transforms that are not one-input activations."""

    def __init__(self, kernels: _Kernels):
        self.k = kernels

    # pow ------------------------------------------------------------------------------------

    @staticmethod
    def pow_checker(a: Any, b: Any, /) -> bool:
        if _is_scalar(a):  # ``2 ** x``: eager's ``pow.Scalar``
            return _float(b)
        if not _float(a):
            return False
        if isinstance(b, TensorProxy):  # a float exponent of a's dtype: no promotion of `a`
            return _float(b) and b.dtype == a.dtype
        return isinstance(b, Number) and not isinstance(b, (bool, complex))

    def pow_execute(self, a, b, /):
        if _is_scalar(a):
            return self.k.pow_scalar_base(a, b)
        return self.k.pow_tensor(a, b) if isinstance(b, TensorProxy) else self.k.pow_scalar(a, b)

    def pow_grad(self, a, b, /):
        if _is_scalar(a):
            out = self.k.pow_scalar_base(a, b)
            put_grad(b, self.k.pow_scalar_base_backward(get_grad(out), a, b, out))
            return out
        if isinstance(b, TensorProxy):
            out = self.k.pow_tensor(a, b)
            ga, gb = self.k.pow_tensor_backward(get_grad(out), a, b, out)
            put_grad(a, ga)
            put_grad(b, gb)
            return out
        out = self.k.pow_scalar(a, b)
        put_grad(a, self.k.pow_scalar_backward(get_grad(out), a, b))
        return out

    # mul with a broadcast operand requiring grad: its gradient summed as eager sums it ----------

    @staticmethod
    def mul_checker(a: Any, b: Any, /) -> bool:
        """Two float tensors of one dtype, of different shapes, one of them known to require grad (asked while
        autodiff runs; elsewhere thunder's ``mul`` stays, for the fusers). thunder's rule multiplies
        ``other * grad``, eager's ``grad * other``: the same values, but the product takes the layout of its
        first operand, and a broadcast operand's gradient is the sum of that product (a ConvNeXt layer scale's
        ``gamma * x`` on a permuted cotangent: 1 ulp)."""
        return (_float(a) and _float(b) and a.dtype == b.dtype and tuple(a.shape) != tuple(b.shape)
                and _broadcast_shape((a, b)) is not None and bool(requires_grad(a) or requires_grad(b)))

    def mul_execute(self, a, b, /):
        return self.k.mul(a, b)

    def mul_grad(self, a, b, /):
        out = self.k.mul(a, b)
        g = get_grad(out)
        put_grad(a, self.k.mul_backward(g, b, a))
        put_grad(b, self.k.mul_backward(g, a, b))
        return out

    # mean: its cotangent expanded, then divided, as eager's rule computes it ----------------------

    @staticmethod
    def mean_checker(a: Any, /, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> bool:
        """A float mean without ``dtype``, known to require grad (asked while autodiff runs; elsewhere thunder's
        ``mean`` stays, for the fusers)."""
        return (_float(a) and dtype is None and isinstance(keepdim, bool)
                and (dim is None or isinstance(dim, int) or all(isinstance(d, int) for d in dim))
                and bool(requires_grad(a)))

    def mean_execute(self, a, /, dim=None, keepdim=False, *, dtype=None):
        if dim is None:
            return self.k.mean(a) if not keepdim else self.k.mean_dim(a, None, True)
        return self.k.mean_dim(a, _dims(a, dim), keepdim)

    def mean_grad(self, a, /, dim=None, keepdim=False, *, dtype=None):
        out = self.mean_execute(a, dim, keepdim)
        put_grad(a, self.k.mean_backward(get_grad(out), a, _dims(a, dim), keepdim))
        return out

    # rsqrt, abs -----------------------------------------------------------------------------

    @staticmethod
    def unary_checker(a: Any, /) -> bool:
        return _float(a)

    def rsqrt_execute(self, a, /):
        return self.k.rsqrt(a)

    def rsqrt_grad(self, a, /):
        out = self.k.rsqrt(a)
        put_grad(a, self.k.rsqrt_backward(get_grad(out), out))
        return out

    def reciprocal_execute(self, a, /):
        return self.k.reciprocal(a)

    def reciprocal_grad(self, a, /):
        out = self.k.reciprocal(a)
        put_grad(a, self.k.reciprocal_backward(get_grad(out), out))
        return out

    def abs_execute(self, a, /):
        return self.k.abs(a)

    def abs_grad(self, a, /):
        out = self.k.abs(a)
        put_grad(a, self.k.abs_backward(get_grad(out), a))
        return out

    # maximum / minimum ----------------------------------------------------------------------

    @staticmethod
    def binary_checker(a: Any, b: Any, /) -> bool:
        return _float(a) and _float(b)

    def maximum_execute(self, a, b, /):
        return self.k.maximum(a, b)

    def maximum_grad(self, a, b, /):
        return self._extremum_grad(self.k.maximum, a, b, False)

    def minimum_execute(self, a, b, /):
        return self.k.minimum(a, b)

    def minimum_grad(self, a, b, /):
        return self._extremum_grad(self.k.minimum, a, b, True)

    def _extremum_grad(self, forward, a, b, smaller_is_kept):
        out = forward(a, b)
        ga, gb = self.k.maximum_backward(get_grad(out), a, b, smaller_is_kept)
        put_grad(a, ga)
        put_grad(b, gb)
        return out

    # clamp ----------------------------------------------------------------------------------

    @staticmethod
    def clamp_checker(a: Any, /, min: Any = None, max: Any = None) -> bool:
        if not _float(a) or (min is None and max is None):
            return False
        if _is_bound(min) and _is_bound(max):
            return True
        return _is_tensor_bound(min) and _is_tensor_bound(max)

    def clamp_execute(self, a, /, min=None, max=None):
        if _is_bound(min) and _is_bound(max):
            return self.k.clamp(a, min, max)
        return self.k.clamp_tensor(a, min, max)

    def clamp_grad(self, a, /, min=None, max=None):
        if _is_bound(min) and _is_bound(max):
            out = self.k.clamp(a, min, max)
            put_grad(a, self.k.clamp_backward(get_grad(out), a, min, max))
            return out
        out = self.k.clamp_tensor(a, min, max)
        grads = self.k.clamp_tensor_backward(get_grad(out), a, min, max)
        for t, g in zip((a, *(b for b in (min, max) if b is not None)), grads):
            put_grad(t, g)
        return out

    # normalize ------------------------------------------------------------------------------

    @staticmethod
    def normalize_checker(a: Any, /, p: float = 2.0, dim: Any = 1, eps: float = 1e-12, out: Any = None) -> bool:
        return _float(a) and out is None and isinstance(p, (int, float)) and not isinstance(p, bool)

    def normalize_execute(self, a, /, p=2.0, dim=1, eps=1e-12, out=None):
        return self.k.normalize(a, p, dim, eps)

    def normalize_grad(self, a, /, p=2.0, dim=1, eps=1e-12, out=None):
        result = self.k.normalize(a, p, dim, eps)
        put_grad(a, self.k.normalize_backward(get_grad(result), a, p, dim, eps))
        return result

    # amax / amin / max / logsumexp ----------------------------------------------------------

    @staticmethod
    def reduction_checker(a: Any, /, dim: Any = None, keepdim: bool = False) -> bool:
        return _float(a) and a.numel > 0 and isinstance(keepdim, bool)

    def amax_execute(self, a, /, dim=None, keepdim=False):
        return self.k.amax(a, _dims(a, dim), keepdim)

    def amax_grad(self, a, /, dim=None, keepdim=False):
        return self._reduced_grad(self.k.amax, a, dim, keepdim)

    def amin_execute(self, a, /, dim=None, keepdim=False):
        return self.k.amin(a, _dims(a, dim), keepdim)

    def amin_grad(self, a, /, dim=None, keepdim=False):
        return self._reduced_grad(self.k.amin, a, dim, keepdim)

    def _reduced_grad(self, forward, a, dim, keepdim):
        dims = _dims(a, dim)
        out = forward(a, dims, keepdim)
        put_grad(a, self.k.amax_backward(get_grad(out), a, out, dims, keepdim))
        return out

    @staticmethod
    def max_checker(a: Any, /, dim: Any = None, keepdim: bool = False) -> bool:
        """``torch.max(x)`` and ``max(x, dim)``; ``max(x, y)`` is ``maximum``, taken separately."""
        if not (_float(a) and a.numel > 0 and isinstance(keepdim, bool)):
            return False
        return (dim is None and not keepdim) or (isinstance(dim, int) and not isinstance(dim, bool))

    def max_execute(self, a, /, dim=None, keepdim=False):
        return self.k.full_max(a) if dim is None else self.k.max_dim(a, dim, keepdim)

    def max_grad(self, a, /, dim=None, keepdim=False):
        if isinstance(dim, TensorProxy):
            # torch.max(a, b), eager's maximum: thunder asks this rule for it too, though max_checker refuses it,
            # because the executor can run every subsymbol (can_execute_or_fuse)
            return self.maximum_grad(a, dim)
        if dim is None:
            out = self.k.full_max(a)
            put_grad(a, self.k.full_max_backward(get_grad(out), a, out))
            return out
        values, indices = self.k.max_dim(a, dim, keepdim)
        put_grad(a, self.k.max_dim_backward(get_grad(values), a, indices, dim, keepdim))
        return values, indices

    @staticmethod
    def aminmax_checker(a: Any, /, *, dim: Any = None, keepdim: bool = False) -> bool:
        """``torch.aminmax``, which thunder registers automatically and then cannot differentiate (its automatic
        registration asks torch's autograd for a derivative at trace time: ``derivative for aten::aminmax is not
        implemented``); eager runs the forward, its outputs require grad, and the backward raises."""
        return (_float(a) and isinstance(keepdim, bool)
                and (dim is None or (isinstance(dim, int) and not isinstance(dim, bool))))

    def aminmax_execute(self, a, /, *, dim=None, keepdim=False):
        return self.k.aminmax(a, dim, keepdim)

    def aminmax_grad(self, a, /, *, dim=None, keepdim=False):
        low, high = self.k.aminmax(a, dim, keepdim)
        if requires_grad(a) is not False:
            put_grad(a, self.k.aminmax_backward(get_grad(low), get_grad(high), a))
        return low, high

    @staticmethod
    def logsumexp_checker(a: Any, /, dim: Any, keepdim: bool = False) -> bool:
        """Also a 0-dim ``a`` with ``dim`` 0 or -1, which torch accepts (thunder's decomposition did not)."""
        if not (_float(a) and isinstance(keepdim, bool)):
            return False
        return a.ndim > 0 or all(isinstance(d, int) and d in (0, -1) for d in _dims(a, dim))

    def logsumexp_execute(self, a, /, dim, keepdim=False):
        return self.k.logsumexp(a, _dims(a, dim), keepdim)

    def logsumexp_grad(self, a, /, dim, keepdim=False):
        dims = _dims(a, dim)
        out = self.k.logsumexp(a, dims, keepdim)
        put_grad(a, self.k.logsumexp_backward(get_grad(out), a, out, dims, keepdim))
        return out


    # linear with a bias, on a batched input: the bias's gradient as eager sums it ----------------

    @staticmethod
    def linear_checker(a: Any, w: Any, /, bias: Any = None) -> bool:
        return (_float(a) and a.ndim >= 3 and _float(w) and _float(bias) and bias.ndim == 1
                and a.dtype == w.dtype == bias.dtype)

    def linear_execute(self, a, w, /, bias=None):
        return self.k.linear_inference(a, w, bias)

    def linear_grad(self, a, w, /, bias=None):
        """thunder's own rule (``_linear_prim_grad``) for the input and the weight, eager's for the bias."""
        out = self.k.linear(a, w, bias)
        g = get_grad(out)
        rows = g.reshape(-1, g.shape[-1])
        put_grad(a, ltorch.matmul(rows, w).reshape(a.shape))
        put_grad(w, ltorch.matmul(g.reshape(-1, g.shape[-1]).mT, a.reshape(-1, a.shape[-1])))
        put_grad(bias, self.k.linear_bias_backward(g, a, bias))
        return out

    # flip, lerp, remainder, round, trunc, nextafter, zeta: thunder 0.2.6 has no rule for their prims --------

    @staticmethod
    def flip_checker(a: Any, /, *dims: Any) -> bool:
        return _float(a)

    def flip_execute(self, a, /, *dims):
        return self.k.flip(a, list(_flip_dims(dims)))

    def flip_grad(self, a, /, *dims):
        dims = list(_flip_dims(dims))
        out = self.k.flip(a, dims)
        put_grad(a, self.k.flip(get_grad(out), dims))
        return out

    @staticmethod
    def lerp_checker(start: Any, end: Any, weight: Any) -> bool:
        if not (_float(start) and _float(end) and end.dtype == start.dtype):
            return False
        if isinstance(weight, TensorProxy):
            tensors = (start, end, weight)
            ok = _float(weight) and weight.dtype == start.dtype
        else:
            tensors = (start, end)
            ok = isinstance(weight, Number) and not isinstance(weight, (bool, complex))
        # thunder's lerp takes its result's shape from ``start``: only where that is the broadcast shape does the
        # traced result have eager's shape (discover() expands a smaller start first: thunderplug.eager.tensor_api)
        return ok and _broadcast_shape(tensors) == tuple(start.shape)

    def lerp_execute(self, start, end, weight):
        if isinstance(weight, TensorProxy):
            return self.k.lerp_tensor(start, end, weight)
        return self.k.lerp_scalar(start, end, weight)

    def lerp_grad(self, start, end, weight):
        if isinstance(weight, TensorProxy):
            out = self.k.lerp_tensor(start, end, weight)
            grads = self.k.lerp_tensor_backward(get_grad(out), start, end, weight)
            for t, g in zip((start, end, weight), grads):
                put_grad(t, g)
            return out
        out = self.k.lerp_scalar(start, end, weight)
        g_start, g_end = self.k.lerp_scalar_backward(get_grad(out), start, end, weight)
        put_grad(start, g_start)
        put_grad(end, g_end)
        return out

    @staticmethod
    def remainder_checker(a: Any, b: Any, /) -> bool:
        if _is_scalar(a):  # ``2 % x``: eager's ``remainder.Scalar_Tensor``, which eager cannot differentiate
            return _float(b)
        if not _float(a):
            return False
        if isinstance(b, TensorProxy):
            return _float(b) and b.dtype == a.dtype
        return isinstance(b, Number) and not isinstance(b, (bool, complex))

    def remainder_execute(self, a, b, /):
        if _is_scalar(a):
            return self.k.remainder_scalar_tensor(a, b)
        return self.k.remainder_tensor(a, b) if isinstance(b, TensorProxy) else self.k.remainder_scalar(a, b)

    def remainder_grad(self, a, b, /):
        if _is_scalar(a):
            out = self.k.remainder_scalar_tensor(a, b)
            if _needing_grad(b):  # eager's backward never reaches the node of ``2 % x.detach()``
                put_grad(b, self.k.remainder_scalar_tensor_backward(get_grad(out), b))
            return out
        if isinstance(b, TensorProxy):
            out = self.k.remainder_tensor(a, b)
            ga, gb = self.k.remainder_backward(get_grad(out), a, b)
            put_grad(a, ga)
            put_grad(b, gb)
            return out
        out = self.k.remainder_scalar(a, b)
        put_grad(a, self.k.remainder_scalar_backward(get_grad(out), a))
        return out

    def round_execute(self, a, /):
        return self.k.round(a)

    def round_grad(self, a, /):
        out = self.k.round(a)
        put_grad(a, self.k.zeros_backward(get_grad(out), a))
        return out

    def trunc_execute(self, a, /):
        return self.k.trunc(a)

    def trunc_grad(self, a, /):
        out = self.k.trunc(a)
        put_grad(a, self.k.zeros_backward(get_grad(out), a))
        return out

    def floor_execute(self, a, /):
        return self.k.floor(a)

    def floor_grad(self, a, /):
        """eager's ``FloorBackward0``: a zero gradient, so ``x.floor()`` of a tensor requiring grad requires grad
        (thunder's autodiff gives none: its output did not, and a parameter reached only through it got no
        gradient, which AdamW skips where eager decays it)."""
        out = self.k.floor(a)
        put_grad(a, self.k.zeros_backward(get_grad(out), a))
        return out

    def ceil_execute(self, a, /):
        return self.k.ceil(a)

    def ceil_grad(self, a, /):
        out = self.k.ceil(a)
        put_grad(a, self.k.zeros_backward(get_grad(out), a))
        return out

    @staticmethod
    def div_checker(a: Any, b: Any, /, *, rounding_mode: Any = None, out: Any = None) -> bool:
        """``div`` with a rounding mode (thunder's ``trunc`` decomposition has no rule)."""
        return rounding_mode in ("trunc", "floor") and out is None and _float_operands(a, b)

    def div_execute(self, a, b, /, *, rounding_mode=None, out=None):
        if isinstance(b, TensorProxy):
            return self.k.div_mode(a, b, rounding_mode)
        return self.k.div_scalar_mode(a, b, rounding_mode)

    def div_grad(self, a, b, /, *, rounding_mode=None, out=None):
        """Zeros to both (``div_tensor_self_backward`` with a rounding mode)."""
        out = self.div_execute(a, b, rounding_mode=rounding_mode)
        if isinstance(b, TensorProxy):
            ga, gb = self.k.zeros_binary_backward(get_grad(out), a, b)
            put_grad(a, ga)
            put_grad(b, gb)
        else:
            put_grad(a, self.k.zeros_backward(get_grad(out), a))
        return out

    @staticmethod
    def floor_divide_checker(a: Any, b: Any, /) -> bool:
        return _float_operands(a, b)

    def floor_divide_execute(self, a, b, /):
        return self.k.floor_divide(a, b) if isinstance(b, TensorProxy) else self.k.floor_divide_scalar(a, b)

    def floor_divide_grad(self, a, b, /):
        """``torch.floor_divide`` and ``//``: eager has no derivative (``derivative for aten::floor_divide is not
        implemented`` when the backward reaches it), where ``div(rounding_mode="floor")``'s is zeros."""
        out = self.floor_divide_execute(a, b)
        for t in (a, b):
            if isinstance(t, TensorProxy) and requires_grad(t) is not False:  # as ``2 % x``'s
                put_grad(t, self.k.floor_divide_backward(get_grad(out), t))
        return out

    # hstack, vstack, dstack, column_stack, row_stack: thunder's automatic registration differentiates none of a
    # list argument's tensors (the result did not require grad, silently) --------------------------------------

    @staticmethod
    def stack_checker(tensors: Any, /) -> bool:
        return (isinstance(tensors, (list, tuple)) and len(tensors) > 0 and all(_float(t) for t in tensors)
                and len({t.dtype for t in tensors}) == 1)

    def hstack_execute(self, tensors, /):
        return _stacked(tensors, _STACKS["hstack"])[0]

    def hstack_grad(self, tensors, /):
        return _stacked_grad(tensors, _STACKS["hstack"])

    def vstack_execute(self, tensors, /):
        return _stacked(tensors, _STACKS["vstack"])[0]

    def vstack_grad(self, tensors, /):
        return _stacked_grad(tensors, _STACKS["vstack"])

    def dstack_execute(self, tensors, /):
        return _stacked(tensors, _STACKS["dstack"])[0]

    def dstack_grad(self, tensors, /):
        return _stacked_grad(tensors, _STACKS["dstack"])

    def column_stack_execute(self, tensors, /):
        return _stacked(tensors, _STACKS["column_stack"])[0]

    def column_stack_grad(self, tensors, /):
        return _stacked_grad(tensors, _STACKS["column_stack"])

    @staticmethod
    def detach_checker(a: Any, /) -> bool:
        return _float(a)

    def detach_execute(self, a, /):
        return self.k.detach(a)

    def detach_grad(self, a, /):
        """No gradient for ``a`` (thunder registers ``torch.detach`` automatically, and differentiates it with
        torch's ``vjp``: zeros, for which it kept ``a`` and computed the cotangent ``x * w.detach()`` sends ``w``;
        ``w``'s gradient was then zeros where eager's is ``None``, and a rule that raises, as eager's node for an
        op without a derivative does, raised where eager's backward never reaches the node)."""
        return self.k.detach(a)

    def heaviside_execute(self, a, b, /):
        return self.k.heaviside(a, b)

    def heaviside_grad(self, a, b, /):
        """``torch.heaviside``: eager's result requires grad and its backward raises (``derivative for
        aten::heaviside is not implemented``); thunder's automatic registration asked torch for the derivative at
        trace time and failed there."""
        out = self.k.heaviside(a, b)
        for t in (a, b):
            if requires_grad(t) is not False:
                put_grad(t, self.k.heaviside_backward(get_grad(out), t))
        return out

    @staticmethod
    def prod_checker(a: Any, /, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> bool:
        """``torch.prod(x)`` and ``torch.prod(x, dim)`` of a float tensor, without a ``dtype``."""
        if not (_float(a) and dtype is None and isinstance(keepdim, bool)):
            return False
        return (dim is None and not keepdim) or (isinstance(dim, int) and not isinstance(dim, bool))

    def prod_execute(self, a, /, dim=None, keepdim=False, *, dtype=None):
        return self.k.prod(a) if dim is None else self.k.prod_dim(a, dim, keepdim)

    def prod_grad(self, a, /, dim=None, keepdim=False, *, dtype=None):
        out = self.prod_execute(a, dim, keepdim)
        put_grad(a, self.k.prod_backward(get_grad(out), a, out, dim, keepdim))
        return out

    def nextafter_execute(self, a, b, /):
        return self.k.nextafter(a, b)

    def nextafter_grad(self, a, b, /):
        out = self.k.nextafter(a, b)
        for t in _needing_grad(a, b):  # eager raises in the backward, when one of these gradients is computed
            put_grad(t, self.k.nextafter_backward(get_grad(out), t))
        return out

    @staticmethod
    def same_float_checker(a: Any, b: Any, /) -> bool:
        return _float(a) and _float(b) and a.dtype == b.dtype

    @staticmethod
    def zeta_checker(a: Any, b: Any, /) -> bool:
        """Two float tensors of one dtype, or a float tensor and a number (``special_zeta.other_scalar`` /
        ``self_scalar``; thunder's own rule failed on the number: ``'float' object has no attribute 'device'``)."""
        if _is_scalar(a):
            return _float(b)
        return _float(a) and ((_float(b) and b.dtype == a.dtype) or _is_scalar(b))

    def zeta_execute(self, a, b, /):
        if _is_scalar(a):
            return self.k.zeta_self_scalar(a, b)
        return self.k.zeta_other_scalar(a, b) if _is_scalar(b) else self.k.zeta(a, b)

    def zeta_grad(self, a, b, /):
        out = self.zeta_execute(a, b)
        if _needing_grad(a):  # eager: not implemented for ``self``, raised when the backward reaches it
            put_grad(a, self.k.zeta_self_backward(get_grad(out), a))
        if _is_scalar(a):
            put_grad(b, self.k.zeta_self_scalar_backward(get_grad(out), a, b))
        elif not _is_scalar(b):
            put_grad(b, self.k.zeta_backward(get_grad(out), a, b))
        return out


def _at_least(ndim: int) -> Callable[[TensorProxy], tuple[int, ...]]:
    """The shape ``atleast_{ndim}d`` gives a tensor (a 1-D one becomes ``(1, n)`` or ``(1, n, 1)``, a 2-D one
    ``(m, n, 1)``)."""

    def shape(t: TensorProxy) -> tuple[int, ...]:
        found = tuple(t.shape)
        if len(found) >= ndim:
            return found
        if len(found) == 0:
            return (1,) * ndim
        if len(found) == 1:
            return (1, found[0], 1)[:ndim] if ndim > 1 else found
        return (*found, 1)

    return shape


def _column(t: TensorProxy) -> tuple[int, ...]:
    """``column_stack``: a 0-dim or 1-D tensor as a column, others as they are."""
    return tuple(t.shape) if t.ndim > 1 else (t.numel, 1)


#: eager's composite for each (ATen ``hstack``, ``vstack``, ``dstack``, ``column_stack``): the shape each tensor
#: is reshaped to, and the dim ``cat`` joins them on (``None``: ``hstack``'s, 0 for 1-D tensors, else 1)
_STACKS: dict[str, tuple[Callable[[TensorProxy], tuple[int, ...]], int | None]] = {
    "hstack": (_at_least(1), None),
    "vstack": (_at_least(2), 0),
    "dstack": (_at_least(3), 2),
    "column_stack": (_column, 1),
}


def _stacked(tensors: Sequence[TensorProxy], how: tuple) -> tuple[TensorProxy, list[tuple[int, ...]], int]:
    """``cat`` of the reshaped tensors, as eager's composite computes it (the same values: a copy), with the
    reshaped shapes and the dim."""
    shape_of, dim = how
    shapes = [shape_of(t) for t in tensors]
    if dim is None:
        dim = 0 if len(shapes[0]) == 1 else 1
    parts = [t if tuple(t.shape) == shape else ltorch.reshape(t, shape) for t, shape in zip(tensors, shapes)]
    return ltorch.cat(parts, dim), shapes, dim


def _stacked_grad(tensors: Sequence[TensorProxy], how: tuple) -> TensorProxy:
    """``cat``'s gradient (each tensor's slice of the cotangent, ``narrow``), reshaped back as the reshape's."""
    out, shapes, dim = _stacked(tensors, how)
    g = get_grad(out)
    start = 0
    for t, shape in zip(tensors, shapes):
        piece = ltorch.narrow(g, dim, start, shape[dim])
        put_grad(t, piece if tuple(t.shape) == shape else ltorch.reshape(piece, tuple(t.shape)))
        start += shape[dim]
    return out


def _float_operands(a: Any, b: Any) -> bool:
    """A float tensor and a float tensor of its dtype or a (real) number."""
    if not _float(a):
        return False
    return (_float(b) and b.dtype == a.dtype) if isinstance(b, TensorProxy) else _is_scalar(b)


def _is_scalar(a: Any) -> bool:
    return isinstance(a, Number) and not isinstance(a, (bool, complex))


def _needing_grad(*args: Any) -> tuple[TensorProxy, ...]:
    """The tensors among ``args`` whose gradient eager's backward computes: those that require grad, not
    ``x.detach()`` (thunder's autodiff asks each op's rule for every tensor argument's gradient, and a rule that
    raises, as eager's node for an op without a derivative does, raised where eager's backward never reaches it)."""
    return tuple(a for a in args if isinstance(a, TensorProxy) and requires_grad(a) is not False)


def _flip_dims(dims: tuple) -> tuple:
    """``x.flip(0, 1)``, ``x.flip((0, 1))`` and ``torch.flip(x, [0])`` as one tuple of dims."""
    return tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else tuple(dims)


def _broadcast_shape(tensors: Sequence[TensorProxy]) -> tuple[int, ...] | None:
    try:
        return tuple(torch.broadcast_shapes(*(tuple(t.shape) for t in tensors)))
    except RuntimeError:
        return None


#: one-input activations: ltorch symbol -> (forward op, backward op, what the backward reads,
#: keyword arguments -> (forward args, backward args))
_ACTIVATIONS: dict[Any, tuple[str, str, str, Callable[..., tuple]]] = {
    ltorch.relu: ("relu", "threshold_backward_at_zero", "result", _no_params),
    ltorch.threshold: ("threshold", "threshold_backward", "input", _threshold_params),
    ltorch.relu6: ("hardtanh", "hardtanh_backward", "input", _relu6_params),
    ltorch.hardtanh: ("hardtanh", "hardtanh_backward", "input", _hardtanh_params),
    ltorch.leaky_relu: ("leaky_relu", "leaky_relu_backward", "input", _leaky_relu_params),
    ltorch.elu: ("elu", "elu_backward_input_last", "input", _elu_params),
    ltorch.celu: ("elu", "elu_backward_input_last", "input", _celu_params),
    ltorch.selu: ("elu", "elu_backward_input_last", "input", _selu_params),
    ltorch.tanh: ("tanh", "tanh_backward", "result", _no_params),
    ltorch.sigmoid: ("sigmoid", "sigmoid_backward", "result", _no_params),
    ltorch.silu: ("silu", "silu_backward", "input", _no_params),
    ltorch.softplus: ("softplus", "softplus_backward", "input", _softplus_params),
    ltorch.hardswish: ("hardswish", "hardswish_backward", "input", _no_params),
    ltorch.hardsigmoid: ("hardsigmoid", "hardsigmoid_backward", "input", _no_params),
    ltorch.mish: ("mish", "mish_backward", "input", _no_params),
    ltorch.logsigmoid: ("log_sigmoid", "log_sigmoid_backward", "input", _no_params),
    ltorch.hardshrink: ("hardshrink", "hardshrink_backward", "input", _shrink_params),
    ltorch.softshrink: ("softshrink", "softshrink_backward", "input", _shrink_params),
    ltorch.glu: ("glu", "glu_backward", "input", _glu_params),
}

#: other ops: ltorch symbol -> (checker, execution transform, grad transform) names on :class:`_Rules`
_RULES: dict[Any, tuple[str, str, str]] = {
    ltorch.pow: ("pow_checker", "pow_execute", "pow_grad"),
    ltorch.mul: ("mul_checker", "mul_execute", "mul_grad"),
    ltorch.mean: ("mean_checker", "mean_execute", "mean_grad"),
    ltorch.rsqrt: ("unary_checker", "rsqrt_execute", "rsqrt_grad"),
    ltorch.reciprocal: ("unary_checker", "reciprocal_execute", "reciprocal_grad"),
    ltorch.abs: ("unary_checker", "abs_execute", "abs_grad"),
    ltorch.maximum: ("binary_checker", "maximum_execute", "maximum_grad"),
    ltorch.minimum: ("binary_checker", "minimum_execute", "minimum_grad"),
    ltorch.clamp: ("clamp_checker", "clamp_execute", "clamp_grad"),
    ltorch.amax: ("reduction_checker", "amax_execute", "amax_grad"),
    ltorch.amin: ("reduction_checker", "amin_execute", "amin_grad"),
    ltorch.torch_max: ("max_checker", "max_execute", "max_grad"),
    ltorch.aminmax: ("aminmax_checker", "aminmax_execute", "aminmax_grad"),
    ltorch.normalize: ("normalize_checker", "normalize_execute", "normalize_grad"),
    ltorch.logsumexp: ("logsumexp_checker", "logsumexp_execute", "logsumexp_grad"),
    ltorch.flip: ("flip_checker", "flip_execute", "flip_grad"),
    ltorch.lerp: ("lerp_checker", "lerp_execute", "lerp_grad"),
    ltorch.remainder: ("remainder_checker", "remainder_execute", "remainder_grad"),
    ltorch.prod: ("prod_checker", "prod_execute", "prod_grad"),
    ltorch.heaviside: ("same_float_checker", "heaviside_execute", "heaviside_grad"),
    ltorch.round: ("unary_checker", "round_execute", "round_grad"),
    ltorch.trunc: ("unary_checker", "trunc_execute", "trunc_grad"),
    ltorch.floor: ("unary_checker", "floor_execute", "floor_grad"),
    ltorch.ceil: ("unary_checker", "ceil_execute", "ceil_grad"),
    ltorch.div: ("div_checker", "div_execute", "div_grad"),
    ltorch.hstack: ("stack_checker", "hstack_execute", "hstack_grad"),
    ltorch.vstack: ("stack_checker", "vstack_execute", "vstack_grad"),
    ltorch.row_stack: ("stack_checker", "vstack_execute", "vstack_grad"),
    ltorch.dstack: ("stack_checker", "dstack_execute", "dstack_grad"),
    ltorch.column_stack: ("stack_checker", "column_stack_execute", "column_stack_grad"),
    ltorch.floor_divide: ("floor_divide_checker", "floor_divide_execute", "floor_divide_grad"),
    ltorch.nextafter: ("same_float_checker", "nextafter_execute", "nextafter_grad"),
    ltorch.zeta: ("zeta_checker", "zeta_execute", "zeta_grad"),
    ltorch.linear: ("linear_checker", "linear_execute", "linear_grad"),
    ltorch.detach: ("detach_checker", "detach_execute", "detach_grad"),
}


#: how eager's autograd differentiates each activation's ``inplace=True`` form (the tensors its backward node
#: saves, ``grad_fn._saved_result`` or ``_saved_self``): from the result (``relu_``; ``leaky_relu_`` and the ELUs
#: with ``is_result=True``; ``hardtanh_``/``relu6_`` save the input, and the result gives the same mask and bits)
#: or from the original input
_INPLACE: dict[Any, str] = {
    **dict.fromkeys((ltorch.relu, ltorch.relu6, ltorch.hardtanh, ltorch.leaky_relu, ltorch.elu, ltorch.celu,
                     ltorch.selu), "result"),
    **dict.fromkeys((ltorch.threshold, ltorch.silu, ltorch.hardswish, ltorch.hardsigmoid, ltorch.mish), "original"),
}

#: ATen overloads the aten_ops plugin decomposes itself (what ``torch.ops.aten`` calls and subclass
#: programs compile to), by symbol id: the rule of the ltorch symbol with the same arguments, or
#: (elu's scales) of its own. The others forward to the ltorch symbols above (forwards.py).
_ATEN_ACTIVATIONS: dict[str, tuple[str, str, str, Callable[..., tuple]]] = {
    "torch.ops.aten.hardtanh.default": _ACTIVATIONS[ltorch.hardtanh],
    "torch.ops.aten.leaky_relu.default": _ACTIVATIONS[ltorch.leaky_relu],
    "torch.ops.aten.elu.default": ("elu", "elu_backward_input_last", "input", _aten_elu_params),
}
_ATEN_RULES: dict[str, tuple[str, str, str]] = {
    "torch.ops.aten.pow.Tensor_Scalar": _RULES[ltorch.pow],
    "torch.ops.aten.pow.Tensor_Tensor": _RULES[ltorch.pow],
    "torch.ops.aten.maximum.default": _RULES[ltorch.maximum],
    "torch.ops.aten.minimum.default": _RULES[ltorch.minimum],
    "torch.ops.aten.clamp.default": _RULES[ltorch.clamp],
    "torch.ops.aten.clamp.Tensor": _RULES[ltorch.clamp],
    "torch.ops.aten.amax.default": _RULES[ltorch.amax],
    "torch.ops.aten.amin.default": _RULES[ltorch.amin],
    "torch.ops.aten.max.default": _RULES[ltorch.torch_max],
}


def claimed_symbols() -> tuple[Any, ...]:
    """The ltorch symbols and ATen symbol ids this executor may take (documentation and tests)."""
    return (*_ACTIVATIONS, *_RULES, *_ATEN_ACTIVATIONS, *_ATEN_RULES, *composites.COMPOSITES)


def build_executor() -> OperatorExecutor:
    """The executor (not added to thunder's global executor registry: ``discover()`` lists it)."""
    executor = UniqueNamesExecutor(EXECUTOR_NAME, version="0.1.0")
    kernels = _Kernels(executor)
    for symbol, (forward, backward, reads, params) in (*_ACTIVATIONS.items(), *_ATEN_ACTIVATIONS.items()):
        checker, execute, grad = _unary(forward, backward, reads=reads, extra=params, inplace=_INPLACE.get(symbol))
        executor.register_implementation(
            symbol,
            checker=checker,
            execution_transform=lambda *a, _f=execute, **kw: _f(kernels, *a, **kw),
            grad_transform=lambda *a, _f=grad, **kw: _f(kernels, *a, **kw),
        )
    rules = _Rules(kernels)
    for symbol, names in (*_RULES.items(), *_ATEN_RULES.items()):
        checker, execute, grad = (getattr(rules, name) for name in names)
        executor.register_implementation(symbol, checker=checker, execution_transform=execute, grad_transform=grad)
    grouped_mm.register(executor)
    composites.register(executor)
    pad_modes.register(executor)
    interpolate_modes.register(executor)
    avg_pool_forms.register(executor)
    torch_forms.register(executor)
    attention.register(executor)
    rnns.register(executor)
    parametrizations.register(executor)
    broadcast_views.register(executor)
    random_ops.register(executor)
    random_ops.register_samplers(executor)
    scalar_operands.register(executor)  # in front of the rules above for its symbols
    complex_ops.register(executor)  # last: in front of every rule above for calls with a complex argument
    return executor
