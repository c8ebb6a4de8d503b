"""The ATen overloads this plugin defines, each with its decomposition into thunder prims/clang."""

from __future__ import annotations

from typing import Any

import torch
from thunder import clang
from thunder.core import prims, utils

from thunderplug import AtenOp
from thunderplug_aten_ops._broadcast import elementwise

aten = torch.ops.aten
ALL_OPS: list[AtenOp] = []


def decomposes(*overloads: Any, differentiable: bool = True):
    """Register the decorated function as the decomposition of each overload."""

    def decorator(fn):
        ALL_OPS.extend(AtenOp(overload, fn, differentiable) for overload in overloads)
        return fn

    return decorator


def _scaled(b: Any, alpha: Any) -> Any:
    return b if alpha == 1 else elementwise(prims.mul, b, alpha)


@decomposes(aten.add.Tensor, aten.add.Scalar)
def add(a, b, *, alpha=1):
    return elementwise(prims.add, a, _scaled(b, alpha))


@decomposes(aten.mul.Tensor, aten.mul.Scalar)
def mul(a, b):
    return elementwise(prims.mul, a, b)


@decomposes(aten.t.default)
def t(a):
    utils.check(a.ndim <= 2, lambda: f"t() expects a tensor with <= 2 dimensions, but self is {a.ndim}D")
    return prims.transpose(a, (1, 0)) if a.ndim == 2 else a


@decomposes(aten.mm.default)
def mm(a, b):
    utils.check(a.ndim == 2 and b.ndim == 2, lambda: "mm: both arguments must be 2D")
    return prims.matmul(a, b)


@decomposes(aten.sum.dim_IntList)
def sum_dim(a, dim, keepdim=False, *, dtype=None):
    dims = tuple(range(a.ndim)) if dim is None or len(dim) == 0 else utils.canonicalize_dims(a.ndim, tuple(dim))
    if dtype is None and (utils.is_integer_dtype(a.dtype) or utils.is_boolean_dtype(a.dtype)):
        dtype = torch.int64
    if dtype is not None:
        a = clang.maybe_convert_to_dtype(a, dtype)
    result = prims.sum(a, dims)
    if keepdim:
        result = prims.broadcast_in_dim(
            result, [1 if i in dims else s for i, s in enumerate(a.shape)], [i for i in range(a.ndim) if i not in dims]
        )
    return result
