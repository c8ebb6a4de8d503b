"""Factories and random ops: new tensors from sizes and fill values, defaults as in ATen.

Random ops draw from the right distribution with thunder's RNG, not torch's stream, so their
values differ from eager's for the same seed.
"""

from __future__ import annotations

import thunder.torch as ltorch
import torch
from thunder import clang
from thunder.core import devices, dtypes, prims

from thunderplug import AtenOp

aten = torch.ops.aten


def _device(device):
    return devices.to_device(device if device is not None else "cpu")


def _dtype(dtype, default=None):
    if dtype is not None:
        return dtypes.to_dtype(dtype)
    return dtypes.to_dtype(default if default is not None else torch.get_default_dtype())


def _fill_dtype(fill_value):
    """torch.full's dtype inference from the fill value."""
    if isinstance(fill_value, bool):
        return torch.bool
    if isinstance(fill_value, int):
        return torch.int64
    if isinstance(fill_value, complex):
        return torch.complex64
    return None


def arange(end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return ltorch.arange(0, end, 1, device=_device(device), dtype=dtype)


def arange_start(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    return ltorch.arange(start, end, step, device=_device(device), dtype=dtype)


def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return ltorch.full(tuple(size), fill_value, device=_device(device), dtype=_dtype(dtype, _fill_dtype(fill_value)))


def full_like(a, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return ltorch.full(
        tuple(a.shape),
        fill_value,
        device=_device(device) if device is not None else a.device,
        dtype=dtypes.to_dtype(dtype) if dtype is not None else a.dtype,
    )


def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return ltorch.full((), s, device=_device(device), dtype=_dtype(dtype))


def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return ltorch.empty(tuple(size), device=_device(device), dtype=_dtype(dtype))


def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return ltorch.empty(tuple(size), device=_device(device), dtype=_dtype(dtype))


def empty_like(a, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return ltorch.empty(
        tuple(a.shape),
        device=_device(device) if device is not None else a.device,
        dtype=dtypes.to_dtype(dtype) if dtype is not None else a.dtype,
    )


def rand(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return ltorch.uniform(tuple(size), 0.0, 1.0, device=_device(device), dtype=_dtype(dtype))


def randn(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return ltorch.randn(tuple(size), device=_device(device), dtype=_dtype(dtype))


def randperm(n, *, dtype=torch.int64, layout=None, device=None, pin_memory=None):
    """The sort order of ``n`` uniform draws: a uniformly random permutation."""
    keys = ltorch.uniform((n,), 0.0, 1.0, device=_device(device), dtype=dtypes.float64)
    return clang.maybe_convert_to_dtype(ltorch.argsort(keys), _dtype(dtype, torch.int64))


def native_dropout(a, p, train):
    if not train or p == 0:
        return prims.clone(a), ltorch.full(tuple(a.shape), True, device=a.device, dtype=dtypes.bool8)
    keep = clang.ge(ltorch.uniform(tuple(a.shape), 0.0, 1.0, device=a.device, dtype=dtypes.float32), p)
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    kept = prims.mul(prims.where(keep, a, 0), scale)
    return clang.maybe_convert_to_dtype(kept, a.dtype), keep


def ops() -> tuple[AtenOp, ...]:
    """This module's overloads and their decompositions."""
    return (
        AtenOp(aten.arange.default, arange, differentiable=False),
        AtenOp(aten.arange.start, arange_start, differentiable=False),
        AtenOp(aten.arange.start_step, arange_start, differentiable=False),
        AtenOp(aten.full.default, full),
        AtenOp(aten.full_like.default, full_like),
        AtenOp(aten.scalar_tensor.default, scalar_tensor),
        AtenOp(aten.empty.memory_format, empty),
        AtenOp(aten.empty_strided.default, empty_strided),
        AtenOp(aten.empty_like.default, empty_like),
        AtenOp(aten.rand.default, rand, differentiable=False),
        AtenOp(aten.randn.default, randn, differentiable=False),
        AtenOp(aten.randperm.default, randperm, differentiable=False),
        AtenOp(aten.native_dropout.default, native_dropout),
    )
