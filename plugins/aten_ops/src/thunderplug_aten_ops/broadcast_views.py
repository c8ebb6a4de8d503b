"""``torch.broadcast_tensors`` and ``torch.meshgrid`` as eager computes them, one view per input: part of the
``eager_backward_kernels`` executor (once KI-11 of docs/known-issues.md).

thunder 0.2.6 registers both automatically, as one operator whose backward differentiates all outputs together: an
input read only by outputs the function does not use got a zero gradient where eager's is ``None``
(``torch.broadcast_tensors(x, y)[0] * 2``: ``y.grad`` zeros; an optimizer applies weight decay and momentum to a zero
gradient, skips a ``None`` one).

How: lookasides of the functions in the compilations that list the executor. Each output is its input's view, as in
eager (``expand``; meshgrid's ``view`` then ``expand``), each thunder's own symbol, so an unused output's view is
removed from the trace and its input gets no gradient. The shapes, and eager's errors, come from the function itself
run on meta tensors.
"""

from __future__ import annotations

import math
from typing import Any

import thunder.torch as ltorch
import torch
from thunder.core import dtypes
from thunder.core.proxies import TensorProxy
from thunder.extend import OperatorExecutor


def _meta_tensor(a: Any) -> Any:
    if isinstance(a, TensorProxy):
        return torch.empty(tuple(a.shape), dtype=dtypes.to_torch_dtype(a.dtype), device="meta")
    return a


def broadcast_tensors(*tensors: Any) -> tuple:
    found = torch.broadcast_tensors(*(_meta_tensor(t) for t in tensors))
    return tuple(ltorch.expand(t, tuple(f.shape)) for t, f in zip(tensors, found, strict=True))


def meshgrid(*tensors: Any, indexing: str | None = None) -> tuple:
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    found = torch.meshgrid(*(_meta_tensor(t) for t in tensors), indexing=indexing)
    outputs = []
    for i, (t, f) in enumerate(zip(tensors, found, strict=True)):
        position = 1 - i if indexing == "xy" and len(tensors) >= 2 and i < 2 else i  # eager swaps the first two
        view = [1] * len(tensors)
        view[position] = math.prod(t.shape)
        outputs.append(ltorch.expand(ltorch.reshape(t, tuple(view)), tuple(f.shape)))
    return tuple(outputs)


def register(executor: OperatorExecutor) -> None:
    """The lookasides of ``torch.broadcast_tensors`` and ``torch.meshgrid`` on ``executor``."""
    executor._lookasides[torch.broadcast_tensors] = broadcast_tensors
    executor._lookasides[torch.meshgrid] = meshgrid
