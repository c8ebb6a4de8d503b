"""``F.normalize(..., out=t)`` runs as eager runs it: part of the ``eager_backward_kernels`` executor (issue 42:
``torch.nn.utils.parametrizations.spectral_norm``).

Why: spectral_norm's power method updates its ``_u``/``_v`` buffers in place under no_grad with
``F.normalize(torch.mv(W, v), dim=0, eps=eps, out=u)`` in training; thunder 0.2.6's symbol refuses ``out``
("normalize: out is not None which is currently unsupported").

How: a lookaside of ``F.normalize``: with ``out``, the normalized tensor is eager's own ``F.normalize`` (one operator,
eager's norm kernel and order of sums; its gradient eager's autograd where one is asked for), then thunder's
``copy_`` into ``out`` (a buffer is updated as in eager) whose result is returned, as eager returns ``out``.
Without ``out``, thunder's symbol (and the executor's rule for it) as before.
"""

from __future__ import annotations

from typing import Any

import thunder.torch as ltorch
import torch.nn.functional as F
from thunder.extend import OperatorExecutor

from thunderplug_aten_ops.attention import _EagerFunction, _never


def register(executor: OperatorExecutor) -> None:
    """The lookaside of ``F.normalize`` on ``executor``."""
    ops = _EagerFunction(executor, "normalize_into", F.normalize, _never)
    original = executor._lookasides.get(F.normalize, ltorch.normalize)

    def normalize(input: Any, p: float = 2.0, dim: int = 1, eps: float = 1e-12, out: Any = None) -> Any:
        if out is None:
            return original(input, p, dim, eps)
        return ltorch.copy_(out, ops.plain(input, p, dim, eps))

    executor._lookasides[F.normalize] = normalize
