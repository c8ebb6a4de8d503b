"""The ``@decomposes`` decorator and the list it fills; every category module registers here."""

from __future__ import annotations

from typing import Any

import torch

from thunderplug import AtenOp

aten = torch.ops.aten
ALL_OPS: list[AtenOp] = []


def decomposes(*overloads: Any, differentiable: bool = True):
    """Register the decorated function as the decomposition of each overload."""

    def decorator(fn):
        ALL_OPS.extend(AtenOp(overload, fn, differentiable) for overload in overloads)
        return fn

    return decorator
