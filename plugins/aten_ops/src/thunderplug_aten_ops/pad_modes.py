"""``F.pad`` with ``mode="reflect"``, ``"replicate"`` or ``"circular"`` (``nn.Conv2d(padding_mode=...)``), which
thunder 0.2.6's ``pad`` refuses while tracing (``Mode arguments other than constant are not supported``, with or
without grad): part of the ``eager_backward_kernels`` executor.

How: the executor's operator ``eager_pad`` replaces ``F.pad`` in the compilations that list the executor (thunder's
``register_operator(..., replaces=...)``: the lookaside of the function is the operator). A constant pad, and a pad
of a tensor-subclass value, is thunder's ``pad`` as before (its execution transform calls it; its gradient is the
cotangent padded back by the negated amounts, eager's ``constant_pad_nd`` backward, a copy); the other modes run
``F.pad`` itself, and their gradient is eager's autograd through it on the real tensors
(``reflection_pad*_backward``, ``replication_pad*_backward``, the circular pad's slices).
"""

from __future__ import annotations

from typing import Any

import thunder.torch as ltorch
import torch
import torch.nn.functional as F
from thunder.core import dtypes
from thunder.core.proxies import TensorProxy
from thunder.core.transforms import get_grad, put_grad
from thunder.extend import OperatorExecutor

from thunderplug.tracing.fake import to_torch_value


def _meta(a: TensorProxy, pad: Any, mode: str = "constant", value: Any = None) -> TensorProxy:
    found = F.pad(torch.empty(tuple(a.shape), dtype=dtypes.to_torch_dtype(a.dtype), device="meta"), tuple(pad), mode,
                  None if value is None else to_torch_value(value))
    return TensorProxy(like=a, shape=tuple(found.shape))


def _pad(a: torch.Tensor, pad: Any, mode: str = "constant", value: Any = None) -> torch.Tensor:
    return F.pad(a, tuple(pad), mode, value)


def _pad_backward(grad: torch.Tensor, a: torch.Tensor, pad: Any, mode: str, value: Any) -> torch.Tensor:
    with torch.enable_grad():
        leaf = a.detach().requires_grad_()
        (found,) = torch.autograd.grad(F.pad(leaf, tuple(pad), mode, value), leaf, grad)
    return found


def _eagers(a: Any, mode: str) -> bool:
    """A pad thunder refuses, of a plain tensor: eager's."""
    return mode != "constant" and type(a) is TensorProxy


def register(executor: OperatorExecutor) -> None:
    """``eager_pad`` (replacing ``F.pad``) and its backward on ``executor``."""
    pad = executor.register_operator("eager_pad", meta=_meta, fn=_pad, replaces=F.pad)
    backward = executor.register_operator(
        "eager_pad_backward", meta=lambda grad, a, pad, mode, value: TensorProxy(like=a, requires_grad=False),
        fn=_pad_backward)

    def execute(a, pad_, mode="constant", value=None):
        if _eagers(a, mode):
            return pad(a, pad_, mode, value)
        return ltorch.pad(a, pad_, mode, value)

    def grad(a, pad_, mode="constant", value=None):
        if _eagers(a, mode):
            out = pad(a, pad_, mode, value)
            put_grad(a, backward(get_grad(out), a, pad_, mode, value))
            return out
        out = ltorch.pad(a, pad_, mode, value)
        put_grad(a, ltorch.pad(get_grad(out), [-p for p in pad_], "constant", 0.0))
        return out

    executor.register_implementation(pad, execution_transform=execute, grad_transform=grad)
