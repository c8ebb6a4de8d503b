"""Ops whose result or gradient thunder 0.2.6 rounds otherwise than eager, run as eager runs them: the torch
function itself forward, and eager's autograd through it backward (part of the ``eager_backward_kernels``
executor; found by tests/test_torch_functions_under_grad.py, which lists each one's difference).

thunder decomposes these into its own primitives and differentiates the decomposition; eager runs fused kernels
(``addcmul``, ``native_group_norm``, ``upsample_bilinear2d``) or composites whose backward formulas are written
otherwise (``var_backward``, ``repeat``'s sum over a reshaped gradient): values or gradients 1-2 ulps off. Others
are thunder's automatic registrations, whose backward asks torch for the derivative of every float argument while
tracing (refused: ``soft_margin_loss``'s target, a float keyword tensor such as ``pos_weight``,
``per_sample_weights``, ``diff``'s ``prepend``) or whose values differ under grad (``svdvals``, ``eigvalsh``).

How: the forward is one operator calling the torch function on the real tensors (its metadata from the same call on
meta tensors; under grad with the inputs that require grad requiring it, as eager's call: ``svdvals`` and
``eigvalsh`` then compute the vectors their gradient reads, and different singular values); the backward is one
operator running the function again under grad on detached copies of the inputs and asking eager's own engine for
the gradients (``torch.autograd.grad``), as the ``normalize`` rule does: eager's very ops and derivative formulas,
on the layouts the real tensors have, at the price of running the forward twice. Gradients are asked for the inputs
that require grad (eager refuses some: ``soft_margin_loss``'s target); one eager leaves undefined for an input the
function reads (none of these ops) would be zeros.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from numbers import Number
from typing import Any

import thunder.torch as ltorch
import torch
import torch.nn.functional as F
from thunder.core import dtypes
from thunder.core.proxies import NumberProxy, TensorProxy
from thunder.core.transforms import get_grad, put_grad
from thunder.extend import OperatorExecutor

from thunderplug.eager.output_grads import requires_grad
from thunderplug.thunder_compat import torch_to_thunder_function_map
from thunderplug.tracing.fake import to_torch_value
from thunderplug_aten_ops.eager_kernels import _float, _proxy_like, _to_meta


def _always(*args: Any, **kwargs: Any) -> bool:
    return True


def _index(t: TensorProxy) -> bool:
    """An integer or bool tensor (indices, offsets), which has no gradient."""
    return type(t) is TensorProxy and (dtypes.is_integer_dtype(t.dtype) or dtypes.is_boolean_dtype(t.dtype))


def _diff(input, n=1, dim=-1, prepend=None, append=None):
    """``torch.diff`` (a builtin: the signature its automatic registration's calls are read with)."""
    return torch.diff(input, n, dim, prepend, append)


def _svdvals(A, *, driver=None):
    return torch.linalg.svdvals(A, driver=driver)


def _eigvalsh(A, UPLO="L"):
    return torch.linalg.eigvalsh(A, UPLO)


def _interpolate_modes(a, size=None, scale_factor=None, mode="nearest", align_corners=None,
                       recompute_scale_factor=None, antialias=False) -> bool:
    """The modes thunder traces whose results or gradients differ (``nearest`` is eager's already)."""
    return mode in ("bilinear", "nearest-exact") and not antialias


def _mse_reduction(a, target, size_average=None, reduce=None, reduction="mean") -> bool:
    return size_average is None and reduce is None


def _number_first(a, b) -> bool:
    return isinstance(a, Number) and not isinstance(a, (bool, complex))


def _rtruediv(a, b):
    """``number / x``: eager's ``Tensor.__rtruediv__``, ``x.reciprocal() * number`` (thunder: ``true_divide``)."""
    return b.reciprocal() * a


def _symbol(fn: Callable[..., Any]) -> Any:
    """The symbol thunder's interpreter calls for ``fn`` (``thunder.torch``'s attribute of the name can be another:
    ``binary_cross_entropy_with_logits``)."""
    return torch_to_thunder_function_map()[fn]


def _global_pool(a, output_size) -> bool:
    """``adaptive_avg_pool2d`` to one element per channel, which ATen computes as ``mean`` over the last two dims
    (so its backward is mean's: the gradient expanded and divided by the count; thunder's is the pool's own)."""
    sizes = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
    return sizes == (1, 1)


def _value_without_grad(a, b, c, *, value=None) -> bool:
    """``addcmul``/``addcdiv``'s ``value``: eager reads a tensor ``value`` as a number (``.item()``), so one that
    requires grad gets none; that is left to thunder's own forward."""
    return not (isinstance(value, TensorProxy) and value.requires_grad)


def _scalar(value: Any) -> Any:
    """``value`` as eager's kernels take it: None is thunder's default, 1; a meta tensor (the forward's shape
    inference) has no value to read, and any number gives the same shapes."""
    if value is None or (isinstance(value, torch.Tensor) and value.is_meta):
        return 1
    return value


def _addcmul(a, b, c, *, value=None):
    """``torch.addcmul`` with thunder's default ``value`` (None: 1)."""
    return torch.addcmul(a, b, c, value=_scalar(value))


def _addcdiv(a, b, c, *, value=None):
    return torch.addcdiv(a, b, c, value=_scalar(value))


#: ltorch symbol -> (eager's function, taking the symbol's arguments; what else the call must satisfy; whether
#: only its gradient differs: then it is taken only where an input requires grad (asked while autodiff runs),
#: and thunder's forward stays elsewhere, for the fusers)
COMPOSITES: dict[Any, tuple[Callable[..., Any], Callable[..., bool], bool]] = {
    ltorch.erfinv: (torch.erfinv, _always, True),  # 3e-8
    ltorch.erfc: (torch.erfc, _always, True),  # 1.2e-7
    ltorch.copysign: (torch.copysign, _always, True),  # other's gradient: zeros, where thunder had none
    ltorch.addcmul: (_addcmul, _value_without_grad, False),  # the value: 1.2e-7 (eager's fused kernel)
    ltorch.addcdiv: (_addcdiv, _value_without_grad, True),  # 1.5e-8
    ltorch.var: (torch.var, _always, True),  # 1.5e-8 (var_backward)
    ltorch.std: (torch.std, _always, True),  # 3e-8
    ltorch.var_mean: (torch.var_mean, _always, True),  # 6e-8
    ltorch.repeat: (torch.Tensor.repeat, _always, True),  # 2.4e-7 (the sum of the repeated copies' gradients)
    ltorch.mse_loss: (F.mse_loss, _mse_reduction, True),  # 3e-8 (mse_loss_backward)
    ltorch.rms_norm: (F.rms_norm, _always, True),  # 1.2e-7
    ltorch.group_norm: (F.group_norm, _always, False),  # the value: 2.4e-7 (native_group_norm)
    ltorch.interpolate: (F.interpolate, _interpolate_modes, False),  # bilinear's value 1.8e-7, nearest-exact's grad
    ltorch.true_divide: (_rtruediv, _number_first, False),  # ``2 / x``: the value and the gradient, 6e-8
    ltorch.adaptive_avg_pool2d: (F.adaptive_avg_pool2d, _global_pool, True),  # 3.7e-9 (torchvision's SE blocks)
    # thunder's automatic registrations: asked torch for a gradient for the target too, which eager refuses
    # (``soft_margin_loss``), or refused a float keyword argument (``pos_weight``) or a float ``weight``
    **{_symbol(fn): (fn, _always, True) for fn in (F.soft_margin_loss, F.binary_cross_entropy,
                                                    F.binary_cross_entropy_with_logits)},
    # ... or a float tensor passed by keyword (``per_sample_weights``, ``prepend``/``append``)
    _symbol(F.embedding_bag): (F.embedding_bag, _always, True),
    _symbol(torch.diff): (_diff, _always, True),
    # the automatic registrations' values differ (3.6e-7, 2.4e-7): eager's kernels on the real tensors
    _symbol(torch.linalg.svdvals): (_svdvals, _always, False),
    _symbol(torch.linalg.eigvalsh): (_eigvalsh, _always, False),
}


class _Call:
    """One symbol's calls as flat operator arguments: the positional ones (``*repeats`` expanded), then the
    keyword-only ones in the signature's order."""

    def __init__(self, symbol: Any, fn: Callable[..., Any]):
        self.signature = inspect.signature(symbol.meta)
        if any(p.kind is p.VAR_KEYWORD for p in self.signature.parameters.values()):  # an automatic registration
            self.signature = inspect.signature(fn)
        self.keyword_only = [p.name for p in self.signature.parameters.values() if p.kind is p.KEYWORD_ONLY]
        self.fn = fn

    def flat(self, args: tuple, kwargs: dict) -> tuple:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return (*bound.args, *(bound.kwargs[name] for name in self.keyword_only))

    def __call__(self, flat: tuple) -> Any:
        count = len(flat) - len(self.keyword_only)
        return self.fn(*flat[:count], **dict(zip(self.keyword_only, flat[count:])))


def _operators(executor: OperatorExecutor, name: str, call: _Call) -> tuple[Any, Any]:
    """The forward and backward operators of one op."""

    def forward_meta(positions: tuple, *flat: Any) -> Any:
        tensors = [a for a in flat if isinstance(a, TensorProxy)]
        grad = any(t.requires_grad for t in tensors)
        # a number proxy (thunder's phantom-grad tests pass var_mean's correction and keepdim so) as its value:
        # torch's function takes no proxy
        out = call(tuple(a.value if isinstance(a, NumberProxy) else _to_meta(a) for a in flat))
        if isinstance(out, torch.Tensor):
            return _proxy_like(out, tensors[0].device, grad)
        return tuple(_proxy_like(o, tensors[0].device, grad) for o in out)

    def forward(positions: tuple, *flat: Any) -> Any:
        """The function; with the inputs at ``positions`` requiring grad, as eager's forward under grad (which
        picks another kernel for some: ``svdvals`` and ``eigvalsh`` compute the vectors their gradient needs)."""
        flat = [to_torch_value(a) for a in flat]
        if not positions:
            return call(tuple(flat))
        with torch.enable_grad():
            for i in positions:
                flat[i] = flat[i].detach().requires_grad_()
            out = call(tuple(flat))
        return out.detach() if isinstance(out, torch.Tensor) else tuple(o.detach() for o in out)

    def backward_meta(grads: tuple, positions: tuple, *flat: Any) -> Any:
        return tuple(TensorProxy(like=flat[i], requires_grad=False) for i in positions)

    def backward(grads: tuple, positions: tuple, *flat: Any) -> tuple:
        flat = [to_torch_value(a) for a in flat]
        with torch.enable_grad():
            for i in positions:
                flat[i] = flat[i].detach().requires_grad_()
            out = call(tuple(flat))
            outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
            found = torch.autograd.grad(outs, [flat[i] for i in positions], [to_torch_value(g) for g in grads],
                                        allow_unused=True)
        return tuple(torch.zeros_like(flat[i]) if g is None else g for i, g in zip(positions, found))

    return (executor.register_operator(f"eager_{name}", meta=forward_meta, fn=forward),
            executor.register_operator(f"eager_{name}_backward", meta=backward_meta, fn=backward))


def _rule(call: _Call, condition: Callable[..., bool], grad_only: bool, forward: Any, backward: Any):
    def checker(*args: Any, **kwargs: Any) -> bool:
        try:
            flat = call.flat(args, kwargs)
        except TypeError:
            return False
        tensors = [a for a in flat if isinstance(a, TensorProxy)]
        floats = [t for t in tensors if _float(t)]
        if not (floats and all(_float(t) or _index(t) for t in tensors) and condition(*args, **kwargs)):
            return False
        return not grad_only or any(requires_grad(t) for t in floats)

    def execute(*args: Any, **kwargs: Any) -> Any:
        return forward((), *call.flat(args, kwargs))

    def grad(*args: Any, **kwargs: Any) -> Any:
        flat = call.flat(args, kwargs)
        positions = tuple(i for i, a in enumerate(flat) if _float(a) and requires_grad(a) is not False)
        out = forward(positions, *flat)
        outs = (out,) if isinstance(out, TensorProxy) else tuple(out)
        found = backward(tuple(get_grad(o) for o in outs), positions, *flat)
        for i, g in zip(positions, found):
            put_grad(flat[i], g)
        return out

    return checker, execute, grad


def register(executor: OperatorExecutor) -> None:
    """Add the operators and rules of :data:`COMPOSITES` to ``executor``."""
    for symbol, (fn, condition, grad_only) in COMPOSITES.items():
        call = _Call(symbol, fn)
        forward, backward = _operators(executor, symbol.name, call)
        checker, execute, grad = _rule(call, condition, grad_only, forward, backward)
        executor.register_implementation(symbol, checker=checker, execution_transform=execute, grad_transform=grad)
