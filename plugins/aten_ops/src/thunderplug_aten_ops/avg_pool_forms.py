"""``F.avg_pool1d``/``2d``/``3d`` in every form eager accepts, as eager computes them, forward and backward: part of
the ``eager_backward_kernels`` executor. thunder 0.2.6's ``avg_pool*d`` refuse ``count_include_pad=False`` while
tracing, with or without grad (``{count_include_pad=} is not supported``).

How: as :mod:`thunderplug_aten_ops.interpolate_modes` for ``F.interpolate``: the operators ``eager_avg_pool1d`` (2d,
3d) replace the functions in the compilations that list the executor and run them; their gradient is eager's
autograd through the function on the real tensors (``avg_pool*d_backward``). A tensor-subclass value is thunder's
``avg_pool*d``, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import thunder.torch as ltorch
import torch
import torch.nn.functional as F
from thunder.core import dtypes
from thunder.core.proxies import TensorProxy
from thunder.core.transforms import get_grad, put_grad
from thunder.extend import OperatorExecutor

from thunderplug.tracing.fake import to_torch_value


def _pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """``F.avg_pool1d`` (a builtin) with its arguments in order, defaults filled in."""
    return input, kernel_size, stride, padding, ceil_mode, count_include_pad


def _pool(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    """``F.avg_pool2d``/``3d``'s."""
    return input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override


#: eager's function -> (its arguments in order, thunder's symbol)
_FORMS: dict[Callable[..., Any], tuple[Callable[..., tuple], Any]] = {
    F.avg_pool1d: (_pool1d, ltorch.avg_pool1d),
    F.avg_pool2d: (_pool, ltorch.avg_pool2d),
    F.avg_pool3d: (_pool, ltorch.avg_pool3d),
}


def _register(executor: OperatorExecutor, fn: Callable[..., Any], arguments: Callable[..., tuple], thunders: Any):
    name = f"eager_avg_pool{fn.__name__[-2:]}"

    def meta(*args: Any, **kwargs: Any) -> TensorProxy:
        a, *rest = arguments(*args, **kwargs)
        found = fn(torch.empty(tuple(a.shape), dtype=dtypes.to_torch_dtype(a.dtype), device="meta"),
                   *(to_torch_value(r) for r in rest))
        return TensorProxy(like=a, shape=tuple(found.shape))

    def run(*args: Any, **kwargs: Any) -> torch.Tensor:
        return fn(*arguments(*args, **kwargs))

    def backward_run(grad: torch.Tensor, a: torch.Tensor, *rest: Any) -> torch.Tensor:
        with torch.enable_grad():
            leaf = a.detach().requires_grad_()
            (found,) = torch.autograd.grad(fn(leaf, *rest), leaf, grad)
        return found

    forward = executor.register_operator(name, meta=meta, fn=run, replaces=fn)
    backward = executor.register_operator(
        f"{name}_backward", meta=lambda grad, a, *rest: TensorProxy(like=a, requires_grad=False), fn=backward_run)

    def call(a: Any, rest: list) -> Any:
        return forward(a, *rest) if type(a) is TensorProxy else thunders(a, *rest)

    def execute(*args: Any, **kwargs: Any) -> Any:
        a, *rest = arguments(*args, **kwargs)
        return call(a, rest)

    def grad(*args: Any, **kwargs: Any) -> Any:
        a, *rest = arguments(*args, **kwargs)
        out = call(a, rest)
        put_grad(a, backward(get_grad(out), a, *rest))
        return out

    executor.register_implementation(forward, execution_transform=execute, grad_transform=grad)


def register(executor: OperatorExecutor) -> None:
    """The operators replacing :data:`_FORMS`' functions on ``executor``."""
    for fn, (arguments, thunders) in _FORMS.items():
        _register(executor, fn, arguments, thunders)
