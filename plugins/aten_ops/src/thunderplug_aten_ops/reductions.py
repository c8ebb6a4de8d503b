"""Reductions, scans, sorts and softmaxes: dims normalised the way ATen does (``[]`` means all)."""

from __future__ import annotations

import thunder.torch as ltorch
from thunder import clang
from thunder.core import dtypes, prims, utils

from thunderplug_aten_ops._registry import aten, decomposes


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


@decomposes(aten.sum.dim_IntList, aten.sum.default)
def sum_dims(a, dim=None, keepdim=False, *, dtype=None):
    dims = tuple(range(a.ndim)) if _dims(a, dim) is None else utils.canonicalize_dims(a.ndim, tuple(dim))
    if dtype is None and (utils.is_integer_dtype(a.dtype) or utils.is_boolean_dtype(a.dtype)):
        dtype = dtypes.int64
    if dtype is not None:
        a = clang.maybe_convert_to_dtype(a, dtypes.to_dtype(dtype))
    result = prims.sum(a, dims)
    return _keep(result, a, dims) if keepdim else result


@decomposes(aten.mean.default, aten.mean.dim)
def mean(a, dim=None, keepdim=False, *, dtype=None):
    return ltorch.mean(a, _dims(a, dim), keepdim, dtype=dtype)


@decomposes(aten.prod.default, aten.prod.dim_int)
def prod(a, dim=None, keepdim=False, *, dtype=None):
    return ltorch.prod(a, dim, keepdim, dtype=dtype)


@decomposes(aten.amax.default)
def amax(a, dim=(), keepdim=False):
    return ltorch.amax(a, _dims(a, dim), keepdim)


@decomposes(aten.amin.default)
def amin(a, dim=(), keepdim=False):
    return ltorch.amin(a, _dims(a, dim), keepdim)


@decomposes(aten.max.default)
def max_all(a):
    """torch.max(x) with no dim (torchao's amax of a tensor); same value and gradient as amax."""
    return ltorch.amax(a, tuple(range(a.ndim)), False)


@decomposes(aten.min.default)
def min_all(a):
    return ltorch.amin(a, tuple(range(a.ndim)), False)


@decomposes(aten.any.default, aten.any.dim, aten.any.dims, differentiable=False)
def any_true(a, dim=None, keepdim=False):
    return ltorch.any_tensor(a, _dims(a, dim), keepdim)


@decomposes(aten.argmax.default, differentiable=False)
def argmax(a, dim=None, keepdim=False):
    return ltorch.argmax(a, dim, keepdim)


@decomposes(aten.argmin.default, differentiable=False)
def argmin(a, dim=None, keepdim=False):
    return ltorch.argmin(a, dim, keepdim)


def _values_at(a, dim, indices, keepdim):
    """``a`` gathered at ``indices`` (kept dim): the gradient flows to exactly that element, as in ATen."""
    if a.ndim == 0:
        return a
    values = clang.take_along_axis(a, indices, dim)
    return values if keepdim else clang.squeeze(values, (utils.canonicalize_dim(a.ndim, dim),))


@decomposes(aten.max.dim)
def max_dim(a, dim, keepdim=False):
    indices = ltorch.argmax(a, dim, True)
    return _values_at(a, dim, indices, keepdim), indices if keepdim else ltorch.squeeze(indices, dim)


@decomposes(aten.min.dim)
def min_dim(a, dim, keepdim=False):
    # argmax of the negation: thunder 0.2.6 has no gradient rule for prims.argmin
    indices = ltorch.argmax(prims.neg(a), dim, True) if dtypes.is_inexact_dtype(a.dtype) else ltorch.argmin(a, dim, True)
    return _values_at(a, dim, indices, keepdim), indices if keepdim else ltorch.squeeze(indices, dim)


@decomposes(aten.var.correction)
def var(a, dim=None, *, correction=None, keepdim=False):
    return ltorch.var(a, _dims(a, dim), keepdim=keepdim, correction=1 if correction is None else correction)


@decomposes(aten.var.dim)
def var_dim(a, dim, unbiased=True, keepdim=False):
    return ltorch.var(a, _dims(a, dim), keepdim=keepdim, correction=1 if unbiased else 0)


@decomposes(aten.cumsum.default)
def cumsum(a, dim, *, dtype=None):
    return ltorch.cumsum(a, dim, dtype=dtype)


@decomposes(aten.sort.default)
def sort(a, dim=-1, descending=False):
    return ltorch.sort(a, dim, descending)


@decomposes(aten.topk.default)
def topk(a, k, dim=-1, largest=True, sorted=True):
    return ltorch.topk(a, k, dim, largest, sorted)


@decomposes(aten._softmax.default)
def softmax(a, dim, half_to_float):
    return ltorch._softmax(a, dim, dtype=dtypes.float32 if half_to_float else None)


@decomposes(aten._log_softmax.default)
def log_softmax(a, dim, half_to_float):
    return ltorch.log_softmax(a, dim, dtype=dtypes.float32 if half_to_float else None)
