"""Size/stride queries and ``.item()``: non-tensor results, answered from thunder's proxy metadata.

thunder tensors have no strides; every tensor is treated as contiguous with storage offset 0.
"""

from __future__ import annotations

import thunder.torch as ltorch
import torch
from thunder.core import prims, utils

from thunderplug import AtenOp

aten = torch.ops.aten


def _strides(a):
    strides, running = [], 1
    for size in reversed(a.shape):
        strides.append(running)
        running *= max(size, 1)
    return tuple(reversed(strides))


def sym_size(a, dim):
    return a.shape[utils.canonicalize_dim(a.ndim, dim)]


def sym_numel(a):
    return a.numel


def sym_stride(a, dim):
    return _strides(a)[utils.canonicalize_dim(a.ndim, dim)]


def sym_storage_offset(a):
    return 0


def sym_is_contiguous(a, memory_format=None):
    return True


def local_scalar_dense(a):
    return prims.item(a)


def resize_(a, size, *, memory_format=None):
    """Functional: a new tensor with ``a``'s leading elements (zeros where ``a`` had none; ATen leaves
    them uninitialized); ``a`` itself keeps its shape."""
    numel = 1
    for s in size:
        numel *= s
    flat = ltorch.reshape(a, (-1,))
    if numel <= a.numel:
        flat = ltorch.getitem(flat, slice(0, numel))
    else:
        flat = ltorch.pad(flat, (0, numel - a.numel), value=0)
    return ltorch.reshape(flat, tuple(size))


def ops() -> tuple[AtenOp, ...]:
    """This module's overloads and their decompositions."""
    return (
        AtenOp(aten.sym_size.int, sym_size, differentiable=False),
        AtenOp(aten.sym_numel.default, sym_numel, differentiable=False),
        AtenOp(aten.sym_stride.int, sym_stride, differentiable=False),
        AtenOp(aten.sym_storage_offset.default, sym_storage_offset, differentiable=False),
        AtenOp(aten.sym_is_contiguous.default, sym_is_contiguous, differentiable=False),
        AtenOp(aten._local_scalar_dense.default, local_scalar_dense, differentiable=False),
        AtenOp(aten.resize_.default, resize_),
    )
