"""``Tensor.to`` that changes nothing returns its input, as in eager, and so do ``squeeze``/``transpose`` of a
0-dim tensor over dim 0 or -1 (asked by the subclass core's ``Symbol.__call__`` replacement in ``discover()``
compilations)."""

from __future__ import annotations

from typing import Any

import thunder.torch as ltorch
import torch
from thunder.core.proxies import TensorProxy
from thunder.core.utils import are_same_dtypes

from thunderplug.thunder_compat import parse_to_device_and_dtype


def returns_input_unchanged(symbol: Any, args: tuple, kwargs: dict) -> bool:
    """Whether ``symbol(*args, **kwargs)`` is a ``Tensor.to`` that eager answers with the tensor itself
    (same dtype and device, no copy, no new memory format).

    thunder records such a call as a ``shallow_copy``: a new tensor whose gradients are summed
    among themselves before being added to the input's. Eager has no new tensor, so all of them go
    to the input, summed in the order its autograd engine receives them. Transformers' RMSNorm
    (``hidden_states.to(torch.float32)`` on float32 hidden states, used by both ``pow`` and ``mul``)
    differed from eager by ulps in every gradient below it, 7e-5 after three AdamW steps; returning
    the input, as eager does, makes the sums eager's.

    Also ``squeeze`` and ``transpose`` of a 0-dim tensor over dim 0 or -1 (:func:`_zero_dim_view`).
    """
    if symbol in (ltorch.squeeze, ltorch.transpose) and args and type(args[0]) is TensorProxy:
        return _zero_dim_view(symbol, args, kwargs)
    if symbol is not ltorch.to or not args or type(args[0]) is not TensorProxy:
        return False
    if kwargs.get("copy", False) or kwargs.get("memory_format") not in (None, torch.preserve_format):
        return False
    try:
        device, dtype = parse_to_device_and_dtype(
            *args[1:3], device=kwargs.get("device"), dtype=kwargs.get("dtype")
        )
    except Exception:  # noqa: BLE001 - thunder's own call then reports the bad arguments
        return False
    a = args[0]
    return (device is None or device == a.device) and (dtype is None or are_same_dtypes(a, dtype))


def _zero_dim_view(symbol: Any, args: tuple, kwargs: dict) -> bool:
    """``s.squeeze(0)``, ``s.squeeze(-1)``, ``s.transpose(0, -1)`` of a 0-dim ``s``: torch accepts dim 0 and -1
    of a 0-dim tensor and returns its values unchanged; thunder 0.2.6's symbols index the empty shape
    (``IndexError``, also inside its ``logsumexp(s, -1)``)."""
    if args[0].ndim != 0:
        return False
    if symbol is ltorch.squeeze:
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        dims = (dim,) if isinstance(dim, int) else dim
    else:
        dims = (*args[1:], *kwargs.values())
        if len(dims) != 2:
            return False
    return isinstance(dims, tuple | list) and all(type(d) is int and d in (0, -1) for d in dims)
