"""Neural-network kernels: convolution, normalization, pooling, embedding, resampling."""

from __future__ import annotations

import math

import thunder.torch as ltorch
from thunder import clang
from thunder.core import dtypes, prims, utils

from thunderplug_aten_ops._broadcast import elementwise
from thunderplug_aten_ops._registry import aten, decomposes


def _per_dim(value, n):
    value = list(value) if isinstance(value, (list, tuple)) else [value]
    return value * n if len(value) == 1 else value


@decomposes(aten.convolution.default)
def convolution(a, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    return ltorch.convolution(a, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


@decomposes(aten.native_layer_norm.default)
def native_layer_norm(a, normalized_shape, weight, bias, eps):
    return ltorch._native_layer_norm(a, normalized_shape, weight, bias, eps)


@decomposes(aten.native_group_norm.default)
def native_group_norm(a, weight, bias, N, C, HxW, group, eps):
    computation_dtype = utils.get_computation_dtype(a.dtype)
    grouped = clang.maybe_convert_to_dtype(ltorch.reshape(a, (N, group, -1)), computation_dtype)
    var, mean = ltorch.var_mean(grouped, -1, keepdim=True, correction=0)
    rstd = ltorch.rsqrt(elementwise(prims.add, var, eps))
    out = ltorch.reshape(elementwise(prims.mul, elementwise(prims.sub, grouped, mean), rstd), a.shape)
    channel_shape = (1, C) + (1,) * (a.ndim - 2)
    if weight is not None:
        out = elementwise(prims.mul, out, ltorch.reshape(weight, channel_shape))
    if bias is not None:
        out = elementwise(prims.add, out, ltorch.reshape(bias, channel_shape))
    return (clang.maybe_convert_to_dtype(out, a.dtype), clang.maybe_convert_to_dtype(ltorch.reshape(mean, (N, group)), a.dtype),
            clang.maybe_convert_to_dtype(ltorch.reshape(rstd, (N, group)), a.dtype))


def _batch_norm(a, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_rstd); running statistics are read, never updated in place."""
    computation_dtype = utils.get_computation_dtype(a.dtype)
    x = clang.maybe_convert_to_dtype(a, computation_dtype)
    reduced = [0] + list(range(2, a.ndim))
    channel_shape = (1, -1) + (1,) * (a.ndim - 2)
    if training:
        var, mean = ltorch.var_mean(x, reduced, keepdim=False, correction=0)
        rstd = ltorch.rsqrt(elementwise(prims.add, var, eps))
        saved = (clang.maybe_convert_to_dtype(mean, a.dtype), clang.maybe_convert_to_dtype(rstd, a.dtype))
    else:
        mean = clang.maybe_convert_to_dtype(running_mean, computation_dtype)
        rstd = ltorch.rsqrt(elementwise(prims.add, clang.maybe_convert_to_dtype(running_var, computation_dtype), eps))
        saved = tuple(ltorch.empty((0,), device=a.device, dtype=a.dtype) for _ in range(2))
    out = elementwise(prims.mul, elementwise(prims.sub, x, ltorch.reshape(mean, channel_shape)), ltorch.reshape(rstd, channel_shape))
    if weight is not None:
        out = elementwise(prims.mul, out, ltorch.reshape(weight, channel_shape))
    if bias is not None:
        out = elementwise(prims.add, out, ltorch.reshape(bias, channel_shape))
    return (clang.maybe_convert_to_dtype(out, a.dtype), *saved)


@decomposes(aten._native_batch_norm_legit.default)
def native_batch_norm_legit(a, weight, bias, running_mean, running_var, training, momentum, eps):
    """Running statistics are not updated in place (thunder has no aliasing); outputs are exact."""
    return _batch_norm(a, weight, bias, running_mean, running_var, training, momentum, eps)


@decomposes(aten._native_batch_norm_legit.no_stats)
def native_batch_norm_legit_no_stats(a, weight, bias, training, momentum, eps):
    return _batch_norm(a, weight, bias, None, None, training, momentum, eps)


@decomposes(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_legit_no_training(a, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(a, weight, bias, running_mean, running_var, False, momentum, eps)


def _pool_output_size(size, kernel, stride, pad, dilation, ceil_mode):
    span = size + 2 * pad - dilation * (kernel - 1) - 1
    out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _max_pool_with_indices(a, nd, kernel_size, stride, padding, dilation, ceil_mode):
    """Max over unfolded windows; the values are gathered at the argmax, so the gradient goes to the
    first maximum of each window exactly as in ATen, and the indices are flat offsets per plane."""
    kernel = _per_dim(kernel_size, nd)
    stride = _per_dim(stride, nd) if stride else kernel
    padding, dilation = _per_dim(padding, nd), _per_dim(dilation, nd)
    spatial = list(a.shape[a.ndim - nd:])
    outs = [_pool_output_size(*args, ceil_mode) for args in zip(spatial, kernel, stride, padding, dilation)]
    low = -math.inf if dtypes.is_inexact_dtype(a.dtype) else -(2**63) if a.dtype == dtypes.int64 else -(2**31)
    pads = []
    for size, k, s, p, d, o in zip(spatial, kernel, stride, padding, dilation, outs):
        pads.append((p, max((o - 1) * s + d * (k - 1) + 1 - size - p, 0)))
    pad_arg = tuple(x for pair in reversed(pads) for x in pair)
    x = ltorch.pad(a, pad_arg, value=low)
    first = a.ndim - nd
    for i, (k, s, d, o) in enumerate(zip(kernel, stride, dilation, outs)):
        # windows by gathering (thunder 0.2.6 has no gradient rule for prims.unfold): dim -> (o, k)
        positions = ltorch.tensor([w * s + j * d for w in range(o) for j in range(k)], device=a.device, dtype=dtypes.int64)
        x = clang.take(x, positions, first + i)
        x = ltorch.reshape(x, tuple(x.shape[: first + i]) + (o, k) + tuple(x.shape[first + i + 1:]))
        x = ltorch.movedim(x, first + i + 1, -1)
    windows = ltorch.reshape(x, tuple(x.shape[: first + nd]) + (-1,))
    where = ltorch.argmax(windows, -1, True)
    values = ltorch.squeeze(clang.take_along_axis(windows, where, windows.ndim - 1), -1)
    where = ltorch.squeeze(where, -1)
    flat, plane = None, 1
    for i in reversed(range(nd)):
        offset = elementwise(prims.remainder, ltorch.div(where, math.prod(kernel[i + 1:]), rounding_mode="floor"), kernel[i])
        origin = ltorch.arange(0, outs[i], 1, device=a.device, dtype=dtypes.int64)
        origin = ltorch.reshape(origin, (outs[i],) + (1,) * (nd - 1 - i))
        position = elementwise(prims.add, elementwise(prims.mul, offset, dilation[i]),
                               elementwise(prims.sub, elementwise(prims.mul, origin, stride[i]), padding[i]))
        term = elementwise(prims.mul, position, plane)
        flat = term if flat is None else elementwise(prims.add, flat, term)
        plane *= spatial[i]
    return values, flat


@decomposes(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(a, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool_with_indices(a, 2, kernel_size, stride, padding, dilation, ceil_mode)


@decomposes(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(a, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool_with_indices(a, 3, kernel_size, stride, padding, dilation, ceil_mode)


@decomposes(aten.avg_pool1d.default)
def avg_pool1d(a, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True):
    return ltorch.avg_pool1d(a, kernel_size, stride or None, padding, ceil_mode, count_include_pad)


@decomposes(aten.avg_pool2d.default)
def avg_pool2d(a, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return ltorch.avg_pool2d(a, kernel_size, stride or None, padding, ceil_mode, count_include_pad, divisor_override)


@decomposes(aten.avg_pool3d.default)
def avg_pool3d(a, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return ltorch.avg_pool3d(a, kernel_size, stride or None, padding, ceil_mode, count_include_pad, divisor_override)


def _adaptive_avg_pool(a, output_size):
    """Each pooled dim is a matmul with an averaging matrix (ATen's windows: floor(i*n/m) to ceil((i+1)*n/m))."""
    nd = len(output_size)
    if a.numel == 0:
        return ltorch.full(tuple(a.shape[: a.ndim - nd]) + tuple(output_size), 0, device=a.device, dtype=a.dtype)
    result = a
    for i, out in enumerate(output_size):
        dim = a.ndim - nd + i
        size = a.shape[dim]
        rows = []
        for o in range(out):
            start, end = (o * size) // out, -((-(o + 1) * size) // out)
            rows.append([1.0 / (end - start) if start <= j < end else 0.0 for j in range(size)])
        weights = ltorch.tensor(rows, device=a.device, dtype=result.dtype)  # (out, size)
        moved = ltorch.movedim(result, dim, -1)
        pooled = ltorch.matmul(moved, ltorch.transpose(weights, 0, 1))
        result = ltorch.movedim(pooled, -1, dim)
    return result


@decomposes(aten.adaptive_avg_pool1d.default)
def adaptive_avg_pool1d(a, output_size):
    return _adaptive_avg_pool(a, _per_dim(output_size, 1))


@decomposes(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(a, output_size):
    return _adaptive_avg_pool(a, _per_dim(output_size, 2))


@decomposes(aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(a, output_size):
    return _adaptive_avg_pool(a, _per_dim(output_size, 3))


@decomposes(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad, a):
    return ltorch.adaptive_avg_pool2d_backward(grad, a)


@decomposes(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return ltorch.embedding(indices, weight, None if padding_idx == -1 else padding_idx, None, 2.0, scale_grad_by_freq, sparse)


@decomposes(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    return ltorch.embedding_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq, False)


@decomposes(aten.upsample_bilinear2d.vec)
def upsample_bilinear2d(a, output_size, align_corners, scale_factors):
    return ltorch.interpolate(a, size=output_size, scale_factor=scale_factors, mode="bilinear", align_corners=align_corners)


@decomposes(aten.upsample_nearest2d.vec)
def upsample_nearest2d(a, output_size, scale_factors):
    return ltorch.interpolate(a, size=output_size, scale_factor=scale_factors, mode="nearest")


@decomposes(aten.grid_sampler_2d.default)
def grid_sampler_2d(a, grid, interpolation_mode, padding_mode, align_corners):
    return ltorch.grid_sampler_2d(a, grid, interpolation_mode, padding_mode, align_corners)


@decomposes(aten.col2im.default)
def col2im(a, output_size, kernel_size, dilation, padding, stride):
    return ltorch.fold(a, output_size, kernel_size, dilation, padding, stride)
