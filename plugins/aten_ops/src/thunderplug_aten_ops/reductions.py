"""Reductions, scans, sorts and softmaxes: dims normalised the way ATen does (``[]`` means all)."""

from __future__ import annotations

import thunder.torch as ltorch
import torch
from thunder import clang
from thunder.core import dtypes, prims, utils

from thunderplug import AtenOp

aten = torch.ops.aten


def _dims(a, dim):
    """ATen's dim lists: ``None`` or ``[]`` reduce every dimension."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    return dim


def _keep(result, a, dims):
    """Reinsert the reduced dims as size 1 (keepdim=True)."""
    return prims.broadcast_in_dim(
        result, [1 if i in dims else s for i, s in enumerate(a.shape)], [i for i in range(a.ndim) if i not in dims]
    )


def sum_dims(a, dim=None, keepdim=False, *, dtype=None):
    dims = tuple(range(a.ndim)) if _dims(a, dim) is None else utils.canonicalize_dims(a.ndim, tuple(dim))
    if dtype is None and (utils.is_integer_dtype(a.dtype) or utils.is_boolean_dtype(a.dtype)):
        dtype = dtypes.int64
    if dtype is not None:
        a = clang.maybe_convert_to_dtype(a, dtypes.to_dtype(dtype))
    result = prims.sum(a, dims)
    return _keep(result, a, dims) if keepdim else result


def mean(a, dim=None, keepdim=False, *, dtype=None):
    return ltorch.mean(a, _dims(a, dim), keepdim, dtype=dtype)


def amax(a, dim=(), keepdim=False):
    return ltorch.amax(a, _dims(a, dim), keepdim)


def amin(a, dim=(), keepdim=False):
    return ltorch.amin(a, _dims(a, dim), keepdim)


def max_all(a):
    """torch.max(x) with no dim (torchao's amax of a tensor); same value and gradient as amax."""
    return ltorch.amax(a, tuple(range(a.ndim)), False)


def min_all(a):
    return ltorch.amin(a, tuple(range(a.ndim)), False)


def any_true(a, dim=None, keepdim=False):
    return ltorch.any_tensor(a, _dims(a, dim), keepdim)


def tree_product(a, dim):
    """The product along ``dim`` (kept, size 1) as a tree of multiplications: its gradient is the
    product of the other factors even where a factor is zero, as ATen's, where thunder's prod
    gradient divides by the factor (NaN at zeros)."""
    if a.shape[dim] == 0:
        return ltorch.full(
            tuple(1 if k == dim else s for k, s in enumerate(a.shape)), 1, device=a.device, dtype=a.dtype
        )
    while a.shape[dim] > 1:
        if a.shape[dim] % 2:
            one = ltorch.full(
                tuple(1 if k == dim else s for k, s in enumerate(a.shape)), 1, device=a.device, dtype=a.dtype
            )
            a = ltorch.cat([a, one], dim)
        size = a.shape[dim]
        a = prims.mul(clang.slice_in_dim(a, 0, size, 2, dim=dim), clang.slice_in_dim(a, 1, size, 2, dim=dim))
    return a


def prod(a, dim=None, keepdim=False, *, dtype=None):
    """torch.prod: integer and bool inputs multiply in int64 unless ``dtype`` says otherwise."""
    if dtype is not None:
        a = clang.maybe_convert_to_dtype(a, dtypes.to_dtype(dtype))
    elif utils.is_integer_dtype(a.dtype) or utils.is_boolean_dtype(a.dtype):
        a = clang.maybe_convert_to_dtype(a, dtypes.int64)
    if dim is None:
        return ltorch.reshape(tree_product(ltorch.reshape(a, (-1,)), 0), ())
    if a.ndim == 0:
        return prims.clone(a)
    dim = utils.canonicalize_dim(a.ndim, dim)
    result = tree_product(a, dim)
    return result if keepdim else ltorch.squeeze(result, dim)


def _values_at(a, dim, indices, keepdim):
    """``a`` gathered at ``indices`` (kept dim): the gradient flows to exactly that element, as in ATen."""
    if a.ndim == 0:
        return a
    values = clang.take_along_axis(a, indices, dim)
    return values if keepdim else clang.squeeze(values, (utils.canonicalize_dim(a.ndim, dim),))


def _scalar_extremum(a):
    """max/min along dim 0 of a 0-dim tensor: the value itself, at index 0."""
    return prims.clone(a), ltorch.full((), 0, device=a.device, dtype=dtypes.int64)


def max_dim(a, dim, keepdim=False):
    if a.ndim == 0:
        return _scalar_extremum(a)
    indices = ltorch.argmax(a, dim, True)
    return _values_at(a, dim, indices, keepdim), indices if keepdim else ltorch.squeeze(indices, dim)


def min_dim(a, dim, keepdim=False):
    if a.ndim == 0:
        return _scalar_extremum(a)
    # argmax of the negation: thunder 0.2.6 has no gradient rule for prims.argmin
    indices = (
        ltorch.argmax(prims.neg(a), dim, True) if dtypes.is_inexact_dtype(a.dtype) else ltorch.argmin(a, dim, True)
    )
    return _values_at(a, dim, indices, keepdim), indices if keepdim else ltorch.squeeze(indices, dim)


def var(a, dim=None, *, correction=None, keepdim=False):
    return ltorch.var(a, _dims(a, dim), keepdim=keepdim, correction=1 if correction is None else correction)


def var_dim(a, dim, unbiased=True, keepdim=False):
    return ltorch.var(a, _dims(a, dim), keepdim=keepdim, correction=1 if unbiased else 0)


def _empty_softmax(a, half_to_float):
    """(log-)softmax of an empty tensor: empty (thunder's amax refuses a zero-size dim)."""
    return ltorch.full(tuple(a.shape), 0, device=a.device, dtype=dtypes.float32 if half_to_float else a.dtype)


def softmax(a, dim, half_to_float):
    if a.numel == 0:
        return _empty_softmax(a, half_to_float)
    return ltorch.softmax(a, dim, dtype=dtypes.float32 if half_to_float else None)


def log_softmax(a, dim, half_to_float):
    if a.numel == 0:
        return _empty_softmax(a, half_to_float)
    return ltorch.log_softmax(a, dim, dtype=dtypes.float32 if half_to_float else None)


def ops() -> tuple[AtenOp, ...]:
    """This module's overloads and their decompositions."""
    return (
        AtenOp(aten.prod.default, prod),
        AtenOp(aten.prod.dim_int, prod),
        AtenOp(aten.sum.dim_IntList, sum_dims),
        AtenOp(aten.sum.default, sum_dims),
        AtenOp(aten.mean.default, mean),
        AtenOp(aten.mean.dim, mean),
        AtenOp(aten.amax.default, amax),
        AtenOp(aten.amin.default, amin),
        AtenOp(aten.max.default, max_all),
        AtenOp(aten.min.default, min_all),
        AtenOp(aten.any.default, any_true, differentiable=False),
        AtenOp(aten.any.dim, any_true, differentiable=False),
        AtenOp(aten.any.dims, any_true, differentiable=False),
        AtenOp(aten.max.dim, max_dim),
        AtenOp(aten.min.dim, min_dim),
        AtenOp(aten.var.correction, var),
        AtenOp(aten.var.dim, var_dim),
        AtenOp(aten._softmax.default, softmax),
        AtenOp(aten._log_softmax.default, log_softmax),
    )
