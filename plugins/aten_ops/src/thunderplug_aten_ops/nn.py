"""Neural-network kernels: convolution, normalization, pooling, embedding, resampling."""

from __future__ import annotations

import math

import thunder.torch as ltorch
import torch
from thunder import clang
from thunder.core import dtypes, prims, utils

from thunderplug import AtenOp
from thunderplug_aten_ops._broadcast import elementwise
from thunderplug_aten_ops.shape import flip as _flip

aten = torch.ops.aten


def _per_dim(value, n):
    value = list(value) if isinstance(value, (list, tuple)) else [value]
    return value * n if len(value) == 1 else value


def _zero(dtype):
    return dtypes.dtype_to_numbertype(dtype)(0)


def _transposed_convolution(a, weight, bias, stride, padding, dilation, output_padding, groups):
    """A transposed convolution (the adjoint of a regular one) as a regular stride-1 convolution:
    the input dilated by the stride (``stride - 1`` interior zeros), padded by
    ``dilation * (kernel - 1) - padding`` on both sides plus ``output_padding`` on the high side
    (negative amounts crop: one ``prims.pad``), and the weight ``(C_in, C_out / groups, *k)`` flipped
    spatially with its in/out channels swapped within each group."""
    nd = weight.ndim - 2
    stride, padding, dilation, output_padding = (_per_dim(v, nd) for v in (stride, padding, dilation, output_padding))
    kernel = tuple(weight.shape[2:])
    config = [(0, 0, 0)] * (a.ndim - nd) + [
        (d * (k - 1) - p, d * (k - 1) - p + op, s - 1)
        for k, s, p, d, op in zip(kernel, stride, padding, dilation, output_padding)
    ]
    x = prims.pad(a, _zero(a.dtype), config)
    c_in, c_out_per_group = weight.shape[0], weight.shape[1]
    w = ltorch.reshape(weight, (groups, c_in // groups, c_out_per_group) + kernel)
    w = ltorch.reshape(ltorch.transpose(w, 1, 2), (groups * c_out_per_group, c_in // groups) + kernel)
    w = _flip(w, tuple(range(2, 2 + nd)))
    return ltorch.convolution(x, w, bias, [1] * nd, [0] * nd, dilation, False, [0] * nd, groups)


def convolution(a, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        return _transposed_convolution(a, weight, bias, stride, padding, dilation, output_padding, groups)
    return ltorch.convolution(a, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


def _regular_convolution_backward(grad, a, weight, stride, padding, dilation, groups):
    """(input grad, weight grad) of a regular convolution, as thunder's grad rule of prims.convolution
    computes them, except that the input grad is the transposed convolution above (thunder's uses
    prims.flip, which has no gradient rule in thunder 0.2.6, so this stays twice differentiable)."""
    nd = weight.ndim - 2
    stride, padding, dilation = (_per_dim(v, nd) for v in (stride, padding, dilation))
    batch, spatial = a.shape[0], list(a.shape[2:])
    gin_channels, kernel = weight.shape[1], list(weight.shape[2:])
    out_spatial = list(grad.shape[2:])
    # input grad: the adjoint, with output_padding making the result exactly the input's size
    output_padding = [
        i - ((o - 1) * s - 2 * p + d * (k - 1) + 1)
        for i, o, s, p, d, k in zip(spatial, out_spatial, stride, padding, dilation, kernel)
    ]
    grad_input = _transposed_convolution(grad, weight, None, stride, padding, dilation, output_padding, groups)
    # weight grad: a convolution of the (padded) input with the output grad as kernel, groups moved
    # into the batch; stride and dilation swap roles
    config = [(0, 0, 0), (0, 0, 0)] + [
        (p, (o - 1) * s + d * (k - 1) + 1 - (i + p), 0)
        for o, i, k, p, s, d in zip(out_spatial, spatial, kernel, padding, stride, dilation)
    ]
    x = prims.pad(a, _zero(a.dtype), config)
    x_spatial = list(x.shape[2:])
    x = ltorch.transpose(x, 0, 1)  # (C_in, N, ...)
    x = ltorch.reshape(x, [groups, gin_channels, batch] + x_spatial)
    x = ltorch.reshape(ltorch.transpose(x, 0, 1), [gin_channels, groups * batch] + x_spatial)
    g = ltorch.transpose(grad, 0, 1)  # (C_out, N, ...)
    grad_weight = ltorch.convolution(x, g, None, dilation, [0] * nd, stride, False, [0] * nd, groups)
    return grad_input, ltorch.transpose(grad_weight, 0, 1)


def convolution_backward(
    grad, a, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask
):
    """Regular: thunder's grad rule of prims.convolution. Transposed (the adjoint ``T_w`` of the
    regular convolution ``C_w``): the input grad is ``C_w(grad)``, and since
    ``<T_w(x), g> = <x, C_w(g)>`` the weight grad is that of ``C_w`` at input ``g``, output grad ``x``."""
    if transposed:
        grad_input = ltorch.convolution(
            grad, weight, None, stride, padding, dilation, False, [0] * (weight.ndim - 2), groups
        )
        _, grad_weight = _regular_convolution_backward(a, grad, weight, stride, padding, dilation, groups)
    else:
        grad_input, grad_weight = _regular_convolution_backward(grad, a, weight, stride, padding, dilation, groups)
    grad_bias = ltorch.sum(grad, [0] + list(range(2, grad.ndim))) if output_mask[2] else None
    return (grad_input if output_mask[0] else None, grad_weight if output_mask[1] else None, grad_bias)


def native_layer_norm(a, normalized_shape, weight, bias, eps):
    """(out, mean, rstd) over the trailing ``normalized_shape`` dims, in the computation dtype;
    mean and rstd keep the reduced dims (size 1) and are returned in ``a``'s dtype, as ATen's CPU kernel."""
    dims = list(range(a.ndim - len(normalized_shape), a.ndim))
    x = clang.maybe_convert_to_dtype(a, utils.get_computation_dtype(a.dtype))
    var, mean = ltorch.var_mean(x, dims, keepdim=True, correction=0)
    rstd = ltorch.rsqrt(elementwise(prims.add, var, eps))
    out = elementwise(prims.mul, elementwise(prims.sub, x, mean), rstd)
    if weight is not None:
        out = elementwise(prims.mul, out, weight)
    if bias is not None:
        out = elementwise(prims.add, out, bias)
    return tuple(clang.maybe_convert_to_dtype(t, a.dtype) for t in (out, mean, rstd))


def native_group_norm(a, weight, bias, N, C, HxW, group, eps):
    computation_dtype = utils.get_computation_dtype(a.dtype)
    grouped = clang.maybe_convert_to_dtype(ltorch.reshape(a, (N, group, (C // group) * HxW)), computation_dtype)
    var, mean = ltorch.var_mean(grouped, -1, keepdim=True, correction=0)
    rstd = ltorch.rsqrt(elementwise(prims.add, var, eps))
    out = ltorch.reshape(elementwise(prims.mul, elementwise(prims.sub, grouped, mean), rstd), a.shape)
    channel_shape = (1, C) + (1,) * (a.ndim - 2)
    if weight is not None:
        out = elementwise(prims.mul, out, ltorch.reshape(weight, channel_shape))
    if bias is not None:
        out = elementwise(prims.add, out, ltorch.reshape(bias, channel_shape))
    return (
        clang.maybe_convert_to_dtype(out, a.dtype),
        clang.maybe_convert_to_dtype(ltorch.reshape(mean, (N, group)), a.dtype),
        clang.maybe_convert_to_dtype(ltorch.reshape(rstd, (N, group)), a.dtype),
    )


def _normalization_input_grad(g, x_hat, rstd, dims, count):
    """``rstd / n * (n * g - sum(g) - x_hat * sum(g * x_hat))`` over the normalized ``dims``."""
    sum_g = ltorch.sum(g, dims, keepdim=True)
    sum_gx = ltorch.sum(elementwise(prims.mul, g, x_hat), dims, keepdim=True)
    inner = elementwise(
        prims.sub,
        elementwise(prims.sub, elementwise(prims.mul, g, count), sum_g),
        elementwise(prims.mul, x_hat, sum_gx),
    )
    return elementwise(prims.mul, elementwise(prims.div, rstd, count), inner)


def native_layer_norm_backward(grad, a, normalized_shape, mean, rstd, weight, bias, output_mask):
    """ATen's formula (mean and rstd as saved by native_layer_norm), in the computation dtype."""
    computation_dtype = utils.get_computation_dtype(a.dtype)
    axis = a.ndim - len(normalized_shape)
    inner, outer = list(range(axis, a.ndim)), list(range(axis))
    x, g = (clang.maybe_convert_to_dtype(t, computation_dtype) for t in (a, grad))
    mean, rstd = (clang.maybe_convert_to_dtype(t, computation_dtype) for t in (mean, rstd))
    x_hat = elementwise(prims.mul, elementwise(prims.sub, x, mean), rstd)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        gw = g if weight is None else elementwise(prims.mul, g, clang.maybe_convert_to_dtype(weight, computation_dtype))
        grad_input = clang.maybe_convert_to_dtype(
            _normalization_input_grad(gw, x_hat, rstd, inner, math.prod(normalized_shape)), a.dtype
        )
    if output_mask[1] and weight is not None:
        grad_weight = clang.maybe_convert_to_dtype(ltorch.sum(elementwise(prims.mul, g, x_hat), outer), weight.dtype)
    if output_mask[2] and bias is not None:
        grad_bias = clang.maybe_convert_to_dtype(ltorch.sum(g, outer), bias.dtype)
    return grad_input, grad_weight, grad_bias


def native_group_norm_backward(grad, a, mean, rstd, weight, N, C, HxW, group, output_mask):
    """ATen's formula per (sample, group), mean and rstd ``(N, group)`` as saved by native_group_norm."""
    computation_dtype = utils.get_computation_dtype(a.dtype)
    shape = (N, group, C // group, HxW)
    x, g = (clang.maybe_convert_to_dtype(ltorch.reshape(t, shape), computation_dtype) for t in (a, grad))
    mean, rstd = (
        clang.maybe_convert_to_dtype(ltorch.reshape(t, (N, group, 1, 1)), computation_dtype) for t in (mean, rstd)
    )
    x_hat = elementwise(prims.mul, elementwise(prims.sub, x, mean), rstd)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        gw = g
        if weight is not None:
            w = ltorch.reshape(clang.maybe_convert_to_dtype(weight, computation_dtype), (1, group, C // group, 1))
            gw = elementwise(prims.mul, g, w)
        grad_input = ltorch.reshape(
            clang.maybe_convert_to_dtype(
                _normalization_input_grad(gw, x_hat, rstd, [2, 3], (C // group) * HxW), a.dtype
            ),
            a.shape,
        )
    if output_mask[1]:
        grad_weight = clang.maybe_convert_to_dtype(
            ltorch.reshape(ltorch.sum(elementwise(prims.mul, g, x_hat), [0, 3]), (C,)), a.dtype
        )
    if output_mask[2]:
        grad_bias = clang.maybe_convert_to_dtype(ltorch.reshape(ltorch.sum(g, [0, 3]), (C,)), a.dtype)
    return grad_input, grad_weight, grad_bias


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
    out = elementwise(
        prims.mul, elementwise(prims.sub, x, ltorch.reshape(mean, channel_shape)), ltorch.reshape(rstd, channel_shape)
    )
    if weight is not None:
        out = elementwise(prims.mul, out, ltorch.reshape(weight, channel_shape))
    if bias is not None:
        out = elementwise(prims.add, out, ltorch.reshape(bias, channel_shape))
    return (clang.maybe_convert_to_dtype(out, a.dtype), *saved)


def native_batch_norm_legit(a, weight, bias, running_mean, running_var, training, momentum, eps):
    """Running statistics are not updated in place (thunder has no aliasing); outputs are exact."""
    return _batch_norm(a, weight, bias, running_mean, running_var, training, momentum, eps)


def native_batch_norm_legit_no_stats(a, weight, bias, training, momentum, eps):
    return _batch_norm(a, weight, bias, None, None, training, momentum, eps)


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
    spatial = list(a.shape[a.ndim - nd :])
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
        positions = ltorch.tensor(
            [w * s + j * d for w in range(o) for j in range(k)], device=a.device, dtype=dtypes.int64
        )
        x = clang.take(x, positions, first + i)
        x = ltorch.reshape(x, tuple(x.shape[: first + i]) + (o, k) + tuple(x.shape[first + i + 1 :]))
        x = ltorch.movedim(x, first + i + 1, -1)
    windows = ltorch.reshape(x, tuple(x.shape[: first + nd]) + (-1,))
    where = ltorch.argmax(windows, -1, True)
    values = ltorch.squeeze(clang.take_along_axis(windows, where, windows.ndim - 1), -1)
    where = ltorch.squeeze(where, -1)
    flat, plane = None, 1
    for i in reversed(range(nd)):
        offset = elementwise(
            prims.remainder, ltorch.div(where, math.prod(kernel[i + 1 :]), rounding_mode="floor"), kernel[i]
        )
        origin = ltorch.arange(0, outs[i], 1, device=a.device, dtype=dtypes.int64)
        origin = ltorch.reshape(origin, (outs[i],) + (1,) * (nd - 1 - i))
        position = elementwise(
            prims.add,
            elementwise(prims.mul, offset, dilation[i]),
            elementwise(prims.sub, elementwise(prims.mul, origin, stride[i]), padding[i]),
        )
        term = elementwise(prims.mul, position, plane)
        flat = term if flat is None else elementwise(prims.add, flat, term)
        plane *= spatial[i]
    return values, flat


def max_pool2d_with_indices(a, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool_with_indices(a, 2, kernel_size, stride, padding, dilation, ceil_mode)


def max_pool3d_with_indices(a, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool_with_indices(a, 3, kernel_size, stride, padding, dilation, ceil_mode)


def _avg_pool_geometry(a, nd, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    """Per pooled dim: (kernel, stride, padding, output size, high padding, divisors), with ATen's
    divisor: the window clipped to the padded input (count_include_pad) or to the input itself,
    unless divisor_override; separable, so the divisor of a window is the product over dims."""
    kernel = _per_dim(kernel_size, nd)
    stride = _per_dim(stride, nd) if stride else kernel
    padding = _per_dim(padding, nd)
    dims = []
    for size, k, s, p in zip(a.shape[a.ndim - nd :], kernel, stride, padding):
        out = _pool_output_size(size, k, s, p, 1, ceil_mode)
        high = max((out - 1) * s + k - size - p, 0)
        divisors = []
        for o in range(out):
            start = o * s - p
            end = min(start + k, size + p)
            divisors.append(end - start if count_include_pad else min(end, size) - max(start, 0))
        dims.append((k, s, p, out, high, divisors))
    return dims


def _divisor(a, nd, dims, divisor_override):
    if divisor_override:
        return divisor_override
    result = None
    for i, (_, _, _, out, _, divisors) in enumerate(dims):
        d = ltorch.reshape(ltorch.tensor(divisors, device=a.device, dtype=a.dtype), (out,) + (1,) * (nd - 1 - i))
        result = d if result is None else elementwise(prims.mul, result, d)
    return result


def _as_planes(a, nd):
    """(N*C, 1, *spatial) so that pooling is a single-channel convolution."""
    return ltorch.reshape(a, (-1, 1) + tuple(a.shape[a.ndim - nd :]))


def _avg_pool(a, nd, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override=None):
    """Window sums as a convolution with a ones kernel over the zero-padded input (high padding
    extended for ceil_mode), divided by ATen's divisor."""
    dims = _avg_pool_geometry(a, nd, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    x = prims.pad(_as_planes(a, nd), _zero(a.dtype), [(0, 0, 0)] * 2 + [(p, high, 0) for _, _, p, _, high, _ in dims])
    ones = ltorch.full((1, 1) + tuple(k for k, *_ in dims), 1, device=a.device, dtype=a.dtype)
    sums = ltorch.convolution(x, ones, None, [s for _, s, *_ in dims], [0] * nd, [1] * nd, False, [0] * nd, 1)
    out = elementwise(prims.div, sums, _divisor(a, nd, dims, divisor_override))
    return ltorch.reshape(out, tuple(a.shape[: a.ndim - nd]) + tuple(d[3] for d in dims))


def _avg_pool_backward(grad, a, nd, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override=None):
    """The adjoint of ``_avg_pool``: the divided grad through the transposed ones-kernel convolution,
    then the padding cropped (or zero-extended where no window reaches)."""
    dims = _avg_pool_geometry(a, nd, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    g = elementwise(prims.div, _as_planes(grad, nd), _divisor(a, nd, dims, divisor_override))
    ones = ltorch.full((1, 1) + tuple(k for k, *_ in dims), 1, device=a.device, dtype=a.dtype)
    x = _transposed_convolution(g, ones, None, [s for _, s, *_ in dims], [0] * nd, [1] * nd, [0] * nd, 1)
    spatial = a.shape[a.ndim - nd :]
    config = [(0, 0, 0)] * 2 + [
        (-p, size + p - length, 0) for (_, _, p, *_), size, length in zip(dims, spatial, x.shape[2:])
    ]
    return ltorch.reshape(prims.pad(x, _zero(a.dtype), config), a.shape)


def avg_pool1d(a, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True):
    return _avg_pool(a, 1, kernel_size, stride, padding, ceil_mode, count_include_pad)


def avg_pool2d(a, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(a, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def avg_pool2d_backward(grad, a, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _avg_pool_backward(grad, a, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def avg_pool3d(a, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(a, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def max_pool2d_with_indices_backward(grad, a, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """Each output grad goes to its window's argmax: a scatter-add over each flattened plane."""
    planes = tuple(a.shape[:-2])
    flat = ltorch.full(planes + (a.shape[-2] * a.shape[-1],), 0, device=a.device, dtype=grad.dtype)
    flat = ltorch.scatter_add(flat, -1, ltorch.reshape(indices, planes + (-1,)), ltorch.reshape(grad, planes + (-1,)))
    return ltorch.reshape(flat, a.shape)


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


def adaptive_avg_pool1d(a, output_size):
    return _adaptive_avg_pool(a, _per_dim(output_size, 1))


def adaptive_avg_pool2d(a, output_size):
    return _adaptive_avg_pool(a, _per_dim(output_size, 2))


def adaptive_avg_pool3d(a, output_size):
    return _adaptive_avg_pool(a, _per_dim(output_size, 3))


def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return ltorch.embedding(
        indices, weight, None if padding_idx == -1 else padding_idx, None, 2.0, scale_grad_by_freq, sparse
    )


def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    return ltorch.embedding_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq, False)


def embedding_bag(
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=0,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    """Rows gathered with ``embedding`` (its gradient, with the zero gradient of padding_idx), padding
    rows dropped, then per bag: a scatter-add (sum, mean) or the
    row at the argmax (max; so the gradient goes to ATen's max_indices). The auxiliary outputs
    follow ATen's CPU layouts: offset2bag (bag of each index; empty on the float32 sum fast path),
    bag_size (non-padding count; zeros for sum) and max_indices (row index per bag and column for
    max, bag_size for mean, zeros for sum)."""
    utils.check(
        not sparse, lambda: "_embedding_bag: sparse=True (sparse gradients) is not supported", NotImplementedError
    )
    # thunder's embedding gradient with scale_grad_by_freq disagrees with ATen's embedding_bag backward
    utils.check(
        not scale_grad_by_freq, lambda: "_embedding_bag: scale_grad_by_freq=True is not supported", NotImplementedError
    )
    utils.check(indices.ndim == 1 and offsets.ndim == 1, lambda: "_embedding_bag: expected 1-D indices and offsets")
    n, width = indices.shape[0], weight.shape[1]
    num_bags = offsets.shape[0] - (1 if include_last_offset else 0)
    index_dtype = offsets.dtype
    starts = clang.slice_in_dim(offsets, 0, num_bags) if include_last_offset else offsets
    # offset2bag as ATen builds it: ones at the bag starts, cumulative sum (empty bags are skipped)
    marks = ltorch.scatter_add(
        ltorch.full((n + 1,), 0, device=indices.device, dtype=index_dtype),
        0,
        clang.maybe_convert_to_dtype(starts, dtypes.int64),
        ltorch.full((num_bags,), 1, device=indices.device, dtype=index_dtype),
    )
    bag = elementwise(prims.sub, clang.slice_in_dim(ltorch.cumsum(marks, 0), 0, n), 1)
    bag = clang.maybe_convert_to_dtype(ltorch.clamp(bag, 0, max(num_bags - 1, 0)), dtypes.int64)
    keep = (
        clang.ne(indices, padding_idx)
        if padding_idx >= 0
        else ltorch.full((n,), True, device=indices.device, dtype=dtypes.bool8)
    )
    rows = ltorch.embedding(indices, weight, padding_idx if padding_idx >= 0 else None, None, 2.0, False, False)
    if per_sample_weights is not None:
        rows = elementwise(prims.mul, rows, ltorch.unsqueeze(per_sample_weights, 1))
    rows = ltorch.where(ltorch.unsqueeze(keep, 1), rows, 0)
    bag_size = ltorch.scatter_add(
        ltorch.full((num_bags,), 0, device=indices.device, dtype=index_dtype),
        0,
        bag,
        clang.maybe_convert_to_dtype(keep, index_dtype),
    )
    zeros = ltorch.full((num_bags,), 0, device=indices.device, dtype=index_dtype)
    if mode == 2:
        member = ltorch.logical_and(
            clang.eq(
                ltorch.unsqueeze(bag, 0),
                ltorch.unsqueeze(ltorch.arange(0, num_bags, 1, device=indices.device, dtype=dtypes.int64), 1),
            ),
            ltorch.unsqueeze(keep, 0),
        )  # (bags, n)
        candidates = ltorch.where(ltorch.unsqueeze(member, 2), ltorch.unsqueeze(rows, 0), -math.inf)  # (bags, n, width)
        position = ltorch.argmax(candidates, 1)  # (bags, width): first maximum
        nonempty = ltorch.unsqueeze(clang.gt(bag_size, 0), 1)
        max_indices = ltorch.where(
            nonempty, ltorch.reshape(clang.take(indices, ltorch.reshape(position, (-1,)), 0), (num_bags, width)), 0
        )
        max_indices = clang.maybe_convert_to_dtype(max_indices, index_dtype)
        out = ltorch.where(
            nonempty, ltorch.gather(weight, 0, clang.maybe_convert_to_dtype(max_indices, dtypes.int64)), 0
        )
    else:
        out = ltorch.scatter_add(
            ltorch.full((num_bags, width), 0, device=weight.device, dtype=weight.dtype),
            0,
            ltorch.expand(ltorch.unsqueeze(bag, 1), (n, width)),
            rows,
        )
        if mode == 1:
            count = clang.maybe_convert_to_dtype(ltorch.clamp(bag_size, 1, None), weight.dtype)
            out = elementwise(prims.div, out, ltorch.unsqueeze(count, 1))
        max_indices = bag_size if mode == 1 else zeros
    fast_path_sum = mode == 0 and weight.dtype in (dtypes.float32, dtypes.float16) and padding_idx < 0
    offset2bag = (
        ltorch.full((0,), 0, device=indices.device, dtype=index_dtype)
        if fast_path_sum
        else clang.maybe_convert_to_dtype(bag, index_dtype)
    )
    return out, offset2bag, bag_size if mode != 0 else zeros, max_indices


def upsample_bilinear2d(a, output_size, align_corners, scale_factors):
    return ltorch.interpolate(
        a, size=output_size, scale_factor=scale_factors, mode="bilinear", align_corners=align_corners
    )


def upsample_nearest2d(a, output_size, scale_factors):
    return ltorch.interpolate(a, size=output_size, scale_factor=scale_factors, mode="nearest")


def ops() -> tuple[AtenOp, ...]:
    """This module's overloads and their decompositions."""
    return (
        AtenOp(aten.convolution.default, convolution),
        AtenOp(aten.convolution_backward.default, convolution_backward),
        AtenOp(aten.native_layer_norm.default, native_layer_norm),
        AtenOp(aten.native_group_norm.default, native_group_norm),
        AtenOp(aten.native_layer_norm_backward.default, native_layer_norm_backward),
        AtenOp(aten.native_group_norm_backward.default, native_group_norm_backward),
        AtenOp(aten._native_batch_norm_legit.default, native_batch_norm_legit),
        AtenOp(aten._native_batch_norm_legit.no_stats, native_batch_norm_legit_no_stats),
        AtenOp(aten._native_batch_norm_legit_no_training.default, native_batch_norm_legit_no_training),
        AtenOp(aten.max_pool2d_with_indices.default, max_pool2d_with_indices),
        AtenOp(aten.max_pool3d_with_indices.default, max_pool3d_with_indices),
        AtenOp(aten.avg_pool1d.default, avg_pool1d),
        AtenOp(aten.avg_pool2d.default, avg_pool2d),
        AtenOp(aten.avg_pool2d_backward.default, avg_pool2d_backward),
        AtenOp(aten.avg_pool3d.default, avg_pool3d),
        AtenOp(aten.max_pool2d_with_indices_backward.default, max_pool2d_with_indices_backward),
        AtenOp(aten.adaptive_avg_pool1d.default, adaptive_avg_pool1d),
        AtenOp(aten._adaptive_avg_pool2d.default, adaptive_avg_pool2d),
        AtenOp(aten._adaptive_avg_pool3d.default, adaptive_avg_pool3d),
        AtenOp(aten.embedding.default, embedding),
        AtenOp(aten.embedding_dense_backward.default, embedding_dense_backward),
        AtenOp(aten._embedding_bag.default, embedding_bag),
        AtenOp(aten.upsample_bilinear2d.vec, upsample_bilinear2d),
        AtenOp(aten.upsample_nearest2d.vec, upsample_nearest2d),
    )
