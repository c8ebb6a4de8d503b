"""Views, copies, concatenation, padding and indexing: ops that move elements without arithmetic.

thunder tensors have no strides: views are new tensors here, and ops that read strides
(``as_strided``) index the tensor's logical, contiguous layout.
"""

from __future__ import annotations

import math
import sys

import thunder.torch as ltorch
import torch
from thunder import clang
from thunder.core import devices, dtypes, prims, utils
from thunder.core.symbol import Symbol
from thunder.core.transforms import get_grad, put_grad, register_grad

from thunderplug import AtenOp
from thunderplug_aten_ops._broadcast import elementwise
from thunderplug_aten_ops.reductions import tree_product

aten = torch.ops.aten


def view(a, size):
    return ltorch.reshape(a, tuple(size))


def alias(a):
    return prims.shallow_copy(a)


def clone(a, *, memory_format=None):
    """thunder tensors have no layout, so every memory format is the same copy."""
    return prims.clone(a)


def _copy_like(a, src):
    src = clang.maybe_convert_to_dtype(
        clang.expand(src, a.shape) if tuple(src.shape) != tuple(a.shape) else src, a.dtype
    )
    return prims.device_put(src, a.device) if src.device != a.device else src


def copy(a, src, non_blocking=False):
    return _copy_like(a, src)


def copy_(a, src, non_blocking=False):
    """Functional: returns the copied values; ``a`` itself is not written (thunder has no aliasing)."""
    return _copy_like(a, src)


def to_copy(a, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    result = (
        prims.clone(a)
        if dtype is None or dtypes.to_dtype(dtype) == a.dtype
        else prims.convert_element_type(a, dtypes.to_dtype(dtype))
    )
    if device is not None and devices.to_device(device) != a.device:
        result = prims.device_put(result, devices.to_device(device))
    return result


def t(a):
    utils.check(a.ndim <= 2, lambda: f"t() expects a tensor with <= 2 dimensions, but self is {a.ndim}D")
    return prims.transpose(a, (1, 0)) if a.ndim == 2 else a


def transpose(a, dim0, dim1):
    """A 0-dim tensor transposes to itself (dims 0 and -1 both name its one implicit dim)."""
    return prims.shallow_copy(a) if a.ndim == 0 else ltorch.transpose(a, dim0, dim1)


def expand(a, size, *, implicit=False):
    return ltorch.expand(a, tuple(size))


def permute(a, dims):
    return ltorch.permute(a, tuple(dims))


def squeeze(a, dim=None):
    if dim is None:
        return ltorch.squeeze(a)
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    dims = tuple(d for d in utils.canonicalize_dims(max(a.ndim, 1), dims) if a.ndim > 0 and a.shape[d] == 1)
    return clang.squeeze(a, dims) if dims else a


def _slice_bounds(size, start, end, step):
    utils.check(step > 0, lambda: "slice step must be positive")
    start = 0 if start is None else start
    end = sys.maxsize if end is None else end
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end


def slice_tensor(a, dim=0, start=None, end=None, step=1):
    dim = utils.canonicalize_dim(a.ndim, dim)
    start, end = _slice_bounds(a.shape[dim], start, end, step)
    return clang.slice_in_dim(a, start, end, step, dim)


def _scatter_positions(a, src, dim, positions):
    """``a`` with the slices ``positions`` along ``dim`` replaced by ``src`` (same length)."""
    index = ltorch.tensor(list(positions), device=a.device, dtype=dtypes.int64)
    src = clang.maybe_convert_to_dtype(src, a.dtype)
    return ltorch.index_copy(a, dim, index, src)


def slice_scatter(a, src, dim=0, start=None, end=None, step=1):
    dim = utils.canonicalize_dim(a.ndim, dim)
    start, end = _slice_bounds(a.shape[dim], start, end, step)
    positions = range(start, end, step)
    if len(positions) == 0:
        return prims.clone(a)
    return _scatter_positions(a, src, dim, positions)


def select_scatter(a, src, dim, index):
    dim = utils.canonicalize_dim(a.ndim, dim)
    index = index + a.shape[dim] if index < 0 else index
    return _scatter_positions(a, ltorch.unsqueeze(src, dim), dim, (index,))


def cat(tensors, dim=0):
    # ATen skips legacy empty 1-D tensors of shape (0,) when other tensors have more dims.
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or list(tensors[:1])
    dtype = utils.elementwise_type_promotion(*kept, type_promotion_kind=utils.ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[
        1
    ]
    return ltorch.cat([clang.maybe_convert_to_dtype(t, dtype) for t in kept], dim)


def split_with_sizes(a, split_sizes, dim=0):
    return list(ltorch.split(a, list(split_sizes), dim))


def flip(a, dims):
    """Reversed gathers: thunder 0.2.6 has no gradient rule for prims.flip."""
    result = prims.clone(a)
    for dim in utils.canonicalize_dims(max(a.ndim, 1), tuple(dims)) if a.ndim else ():
        reversed_index = ltorch.tensor(list(range(a.shape[dim] - 1, -1, -1)), device=a.device, dtype=dtypes.int64)
        result = clang.take(result, reversed_index, dim)
    return result


def repeat(a, repeats):
    return ltorch.repeat(a, tuple(repeats))


def as_strided(a, size, stride, storage_offset=None):
    """Indexes ``a``'s logical (contiguous) layout: exact for contiguous inputs, which is all thunder has."""
    offset = 0 if storage_offset is None else storage_offset
    flat_positions = [offset]
    for length, step in zip(size, stride):
        flat_positions = [p + i * step for p in flat_positions for i in range(length)]
    index = ltorch.tensor(flat_positions, device=a.device, dtype=dtypes.int64)
    return ltorch.reshape(clang.take(ltorch.reshape(a, (-1,)), index, 0), tuple(size))


def constant_pad_nd(a, pad, value=0):
    return ltorch.pad(a, tuple(pad), value=value)


def _pad_by_index(a, pad, source_index):
    """Pad the last ``len(pad) // 2`` dims by gathering, ``source_index(i, size)`` naming the source
    of padded position ``i`` (negative or past the end)."""
    for k in range(len(pad) // 2):
        dim = a.ndim - 1 - k
        size, before, after = a.shape[dim], pad[2 * k], pad[2 * k + 1]
        positions = [source_index(i, size) for i in range(-before, size + after)]
        index = ltorch.tensor(positions, device=a.device, dtype=dtypes.int64)
        a = clang.take(a, index, dim)
    return a


def _reflect(i, size):
    return -i if i < 0 else (2 * (size - 1) - i if i >= size else i)


def _replicate(i, size):
    return min(max(i, 0), size - 1)


def reflection_pad(a, padding):
    return _pad_by_index(a, padding, _reflect)


def replication_pad(a, padding):
    return _pad_by_index(a, padding, _replicate)


def index(a, indices):
    """Integer tensor indices (``None`` keeps a dim); boolean masks have data-dependent shapes."""
    return ltorch.getitem(a, tuple(slice(None) if i is None else i for i in indices))


def index_put(a, indices, values, accumulate=False):
    values = clang.maybe_convert_to_dtype(values, a.dtype)
    if any(i is not None and dtypes.is_boolean_dtype(i.dtype) for i in indices):
        return _masked_put(a, indices, values, accumulate)
    return _index_put(a, list(indices), values, accumulate)


def _masked_put(a, indices, values, accumulate):
    """``a[mask] = values`` (or ``+=``) for one leading boolean mask and values broadcast over the
    selected rows: a ``where``. Values with one row per True element have a data-dependent shape."""
    (mask,) = indices if len(indices) == 1 else (None,)
    rest = tuple(a.shape[mask.ndim :]) if mask is not None else ()
    rows = values.shape[0] if values.ndim > len(rest) else 1
    utils.check(
        mask is not None and tuple(mask.shape) == tuple(a.shape[: mask.ndim]) and rows == 1,
        lambda: (
            "index_put with a boolean mask and one value row per True element has a data-dependent shape "
            "(the mask's True count); thunder 0.2.6 traces have static shapes: use torch.where(mask, values, a) instead"
        ),
        NotImplementedError,
    )
    if values.ndim > len(rest):
        values = ltorch.reshape(values, tuple(values.shape[1:]))
    values = ltorch.expand(values, tuple(a.shape))
    selected = ltorch.expand(ltorch.reshape(mask, tuple(mask.shape) + (1,) * len(rest)), tuple(a.shape))
    if accumulate:
        return elementwise(prims.add, a, prims.where(selected, values, dtypes.dtype_to_numbertype(a.dtype)(0)))
    return prims.where(selected, values, a)


def _index_put_meta(a, indices, values, accumulate):
    return ltorch.index_put(a, indices, values, accumulate)


#: ltorch.index_put with eager's gradient: thunder 0.2.6's autodiff pairs ltorch.index_put's two
#: gradients with its first two arguments (``a`` and the index list), so ``values`` got none
_index_put = Symbol(name="index_put", meta=_index_put_meta, id="thunderplug_aten_ops.index_put", _module=ltorch)


def _index_put_grad(a, indices, values, accumulate):
    out = _index_put(a, indices, values, accumulate)
    g = get_grad(out)
    g_values = ltorch.getitem(g, tuple(slice(None) if i is None else i for i in indices))
    if tuple(g_values.shape) != tuple(values.shape):  # values broadcast over the indexed positions
        leading = g_values.ndim - values.ndim
        dims = [*range(leading), *(leading + k for k, size in enumerate(values.shape) if size == 1)]
        g_values = ltorch.reshape(ltorch.sum(g_values, dims, keepdim=True), tuple(values.shape))
    put_grad(values, g_values)
    put_grad(a, g if accumulate else ltorch.index_put(g, indices, ltorch.zeros_like(values), False))
    return out


register_grad(_index_put.id, _index_put_grad)


def index_select(a, dim, index):
    if a.ndim == 0:
        return ltorch.reshape(clang.take(ltorch.reshape(a, (1,)), ltorch.reshape(index, (-1,)), 0), ())
    return ltorch.index_select(a, dim, index)


def gather(a, dim, index, *, sparse_grad=False):
    """ATen's edge cases too: an empty index gives an empty result of its shape, a 0-dim input acts as 1-D."""
    if index.numel == 0:
        return ltorch.full(tuple(index.shape), 0, device=a.device, dtype=a.dtype)
    if a.ndim == 0:
        flat = ltorch.gather(ltorch.reshape(a, (1,)), 0, ltorch.reshape(index, (-1,)))
        return ltorch.reshape(flat, tuple(index.shape))
    return ltorch.gather(a, dim, index)


def scatter_reduce(a, dim, index, src, reduce, *, include_self=True):
    """Every reduction of ATen's ``scatter_reduce.two``, with and without ``include_self``."""
    if a.ndim == 0:
        flat = [ltorch.reshape(t, (1,)) for t in (a, index, src)]
        return ltorch.reshape(scatter_reduce(flat[0], 0, flat[1], flat[2], reduce, include_self=include_self), ())
    if reduce in ("prod", "amax", "amin"):
        return _scatter_dense(a, dim, index, src, reduce, include_self)
    utils.check(
        reduce in ("sum", "mean"),
        lambda: f"scatter_reduce: reduce={reduce!r} is not one of sum, prod, mean, amax, amin",
    )
    base = a if include_self else ltorch.scatter(a, dim, index, 0)
    total = ltorch.scatter_add(base, dim, index, src)
    if reduce == "sum":
        return total
    one = 1.0 if dtypes.is_inexact_dtype(a.dtype) else 1
    counts = ltorch.scatter_add(
        ltorch.full_like(a, one if include_self else 0 * one), dim, index, ltorch.full_like(src, one)
    )
    counts = prims.where(clang.eq(counts, 0), one, counts)
    if dtypes.is_exact_dtype(a.dtype):
        return ltorch.div(total, counts, rounding_mode="floor")
    return prims.div(total, counts)


def _identity(reduce, dtype):
    """The element that leaves ``reduce`` unchanged, in ``dtype``."""
    if reduce == "prod":
        return 1
    if dtypes.is_inexact_dtype(dtype):
        return -math.inf if reduce == "amax" else math.inf
    info = torch.iinfo(dtypes.to_torch_dtype(dtype))
    return info.min if reduce == "amax" else info.max


def _scatter_dense(a, dim, index, src, reduce, include_self):
    """thunder has no scatter-prod/max/min: a one-hot ``(other dims, index dim, a's dim)`` mask picks,
    for every target position, the ``src`` values scattered to it (the reduction's identity
    elsewhere), then a reduction over the index dim. Its memory is index size times
    ``a.shape[dim]``. The reductions' own gradients give ATen's: amax/amin share the gradient evenly
    among the maxima (``self`` included when ``include_self``), prod the product rule
    (:func:`~thunderplug_aten_ops.reductions.tree_product`)."""
    dim = utils.canonicalize_dim(a.ndim, dim)
    if index.numel == 0:
        return prims.clone(a)
    for k in range(a.ndim):  # the region the index covers
        src = clang.slice_in_dim(src, 0, index.shape[k], dim=k)
    region = a
    for k in range(a.ndim):
        if k != dim:
            region = clang.slice_in_dim(region, 0, index.shape[k], dim=k)
    target = ltorch.movedim(region, dim, -1)  # (O, N)
    positions = ltorch.arange(0, a.shape[dim], 1, device=a.device, dtype=dtypes.int64)
    hits = clang.eq(ltorch.unsqueeze(ltorch.movedim(index, dim, -1), -1), positions)  # (O, J, N)
    values = ltorch.where(hits, ltorch.unsqueeze(ltorch.movedim(src, dim, -1), -1), _identity(reduce, a.dtype))
    values = clang.maybe_convert_to_dtype(values, a.dtype)
    if include_self:
        values = ltorch.cat([ltorch.unsqueeze(target, -2), values], -2)  # (O, 1 + J, N)
    reduced = (
        ltorch.squeeze(tree_product(values, values.ndim - 2), -2)
        if reduce == "prod"
        else (ltorch.amax if reduce == "amax" else ltorch.amin)(values, -2, False)
    )
    touched = ltorch.any_tensor(hits, -2, False)
    result = ltorch.movedim(prims.where(touched, reduced, target), -1, dim)
    padding = [(0, a.shape[k] - result.shape[k], 0) for k in range(a.ndim)]
    if all(high == 0 for _, high, _ in padding):
        return result
    inside = prims.pad(ltorch.full(result.shape, True, device=a.device, dtype=dtypes.bool8), False, padding)
    return prims.where(inside, prims.pad(result, dtypes.dtype_to_numbertype(a.dtype)(0), padding), a)


def ops() -> tuple[AtenOp, ...]:
    """This module's overloads and their decompositions."""
    return (
        AtenOp(aten.view.default, view),
        AtenOp(aten._unsafe_view.default, view),
        AtenOp(aten.alias.default, alias),
        AtenOp(aten.clone.default, clone),
        AtenOp(aten.copy.default, copy),
        AtenOp(aten.copy_.default, copy_),
        AtenOp(aten._to_copy.default, to_copy),
        AtenOp(aten.t.default, t),
        AtenOp(aten.transpose.int, transpose),
        AtenOp(aten.expand.default, expand),
        AtenOp(aten.permute.default, permute),
        AtenOp(aten.squeeze.dim, squeeze),
        AtenOp(aten.squeeze.dims, squeeze),
        AtenOp(aten.squeeze.default, squeeze),
        AtenOp(aten.slice.Tensor, slice_tensor),
        AtenOp(aten.slice_scatter.default, slice_scatter),
        AtenOp(aten.select_scatter.default, select_scatter),
        AtenOp(aten.cat.default, cat),
        AtenOp(aten.split_with_sizes.default, split_with_sizes),
        AtenOp(aten.flip.default, flip),
        AtenOp(aten.repeat.default, repeat),
        AtenOp(aten.as_strided.default, as_strided),
        AtenOp(aten.constant_pad_nd.default, constant_pad_nd),
        AtenOp(aten.reflection_pad1d.default, reflection_pad),
        AtenOp(aten.reflection_pad2d.default, reflection_pad),
        AtenOp(aten.reflection_pad3d.default, reflection_pad),
        AtenOp(aten.replication_pad2d.default, replication_pad),
        AtenOp(aten.replication_pad3d.default, replication_pad),
        AtenOp(aten.index.Tensor, index),
        AtenOp(aten.index_put.default, index_put),
        AtenOp(aten.index_select.default, index_select),
        AtenOp(aten.gather.default, gather),
        AtenOp(aten.scatter_reduce.two, scatter_reduce),
    )
