"""``F.interpolate`` in every form eager accepts, as eager computes it, forward and backward: part of the
``eager_backward_kernels`` executor. thunder 0.2.6's ``interpolate`` refuses, while tracing and with or without
grad, the ``"linear"``, ``"bicubic"``, ``"trilinear"`` and ``"area"`` modes (``only modes 'nearest',
'nearest-exact' and 'bilinear' are supported``), ``align_corners=True`` and an integer ``scale_factor``
(``scale_factor=2 is expected to be a strictly positive floating point number``).

How: the operator ``eager_f_interpolate`` (not ``eager_interpolate``: the composite of
``ltorch.interpolate`` has that name) replaces ``F.interpolate`` in the compilations that list the executor
(thunder's ``register_operator(..., replaces=...)``), and ``nn.Upsample`` with it. It runs ``F.interpolate`` itself
(metadata from the same call on a meta tensor); its gradient is eager's autograd through ``F.interpolate`` on the
real tensors (``upsample_*_backward``, ``adaptive_avg_pool*``'s for ``"area"``). The forms thunder traced were
eager's already (``"nearest"``) or taken by the composites (``"bilinear"``, ``"nearest-exact"``); they are eager's
as before. A tensor-subclass value is thunder's ``interpolate``, as before.
"""

from __future__ import annotations

import inspect
from typing import Any

import thunder.torch as ltorch
import torch
import torch.nn.functional as F
from thunder.core import dtypes
from thunder.core.proxies import TensorProxy
from thunder.core.transforms import get_grad, put_grad
from thunder.extend import OperatorExecutor

from thunderplug.tracing.fake import to_torch_value

_SIGNATURE = inspect.signature(F.interpolate)


def _positional(args: tuple, kwargs: dict) -> tuple:
    """A call's arguments in ``F.interpolate``'s order, defaults filled in."""
    bound = _SIGNATURE.bind(*args, **kwargs)
    bound.apply_defaults()
    return tuple(bound.arguments.values())


def _meta(a: TensorProxy, *args: Any, **kwargs: Any) -> TensorProxy:
    a_, *rest = _positional((a, *args), kwargs)
    found = F.interpolate(torch.empty(tuple(a.shape), dtype=dtypes.to_torch_dtype(a.dtype), device="meta"),
                          *(to_torch_value(r) for r in rest))
    return TensorProxy(like=a, shape=tuple(found.shape))


def _interpolate(a: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return F.interpolate(a, *_positional((a, *args), kwargs)[1:])


def _interpolate_backward(grad: torch.Tensor, a: torch.Tensor, *rest: Any) -> torch.Tensor:
    with torch.enable_grad():
        leaf = a.detach().requires_grad_()
        (found,) = torch.autograd.grad(F.interpolate(leaf, *rest), leaf, grad)
    return found


def register(executor: OperatorExecutor) -> None:
    """``eager_interpolate`` (replacing ``F.interpolate``) and its backward on ``executor``."""
    forward = executor.register_operator("eager_f_interpolate", meta=_meta, fn=_interpolate, replaces=F.interpolate)
    backward = executor.register_operator(
        "eager_f_interpolate_backward", meta=lambda grad, a, *rest: TensorProxy(like=a, requires_grad=False),
        fn=_interpolate_backward)

    def execute(*args: Any, **kwargs: Any) -> Any:
        a, *rest = _positional(args, kwargs)
        return forward(a, *rest) if type(a) is TensorProxy else ltorch.interpolate(a, *rest)

    def grad(*args: Any, **kwargs: Any) -> Any:
        a, *rest = _positional(args, kwargs)
        out = forward(a, *rest) if type(a) is TensorProxy else ltorch.interpolate(a, *rest)
        put_grad(a, backward(get_grad(out), a, *rest))
        return out

    executor.register_implementation(forward, execution_transform=execute, grad_transform=grad)
