"""Dedicated eager comparisons (outputs and input gradients, float64) for the nn kernels OpInfo
graphs do not reach: transposed convolution, the backward kernels AOTAutograd graphs contain, and
every mode of ``_embedding_bag`` including its auxiliary outputs."""

from __future__ import annotations

import pytest
import thunder
import torch

import thunderplug

aten = torch.ops.aten
D = torch.float64


def _check(fn, *args, grads=True):
    """Outputs equal eager's; gradients of the floating outputs w.r.t. ``args`` too (unless eager has none)."""
    expected_in = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    actual_in = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    expected = fn(*expected_in)
    actual = thunder.jit(fn, executors=thunderplug.discover())(*actual_in)
    torch.testing.assert_close(actual, expected)
    if not grads:
        return

    def flat(out):
        values = out if isinstance(out, (tuple, list)) else [out]
        return [x for x in values if x is not None and x.is_floating_point()]

    e_out, a_out = flat(expected), flat(actual)
    generator = torch.Generator().manual_seed(0)
    cotangents = [torch.randn(x.shape, dtype=x.dtype, generator=generator) for x in e_out]
    e_grads = torch.autograd.grad(e_out, expected_in, cotangents, allow_unused=True)
    a_grads = torch.autograd.grad(a_out, actual_in, cotangents, allow_unused=True)
    zero = lambda gs: [torch.zeros_like(a) if g is None else g for a, g in zip(args, gs)]  # noqa: E731
    torch.testing.assert_close(zero(a_grads), zero(e_grads))


MASKS = ([True, True, True], [True, False, False], [False, True, True])
CONV = [
    (1, 0, 1, 0, 1),
    (2, 1, 1, 1, 1),
    (3, 2, 2, 0, 2),
    (2, 0, 1, 1, 2),
    (1, 3, 1, 0, 1),
]  # stride, pad, dil, out_pad, groups


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("stride,padding,dilation,output_padding,groups", CONV)
def test_transposed_convolution(nd, stride, padding, dilation, output_padding, groups):
    torch.manual_seed(0)
    x = torch.randn((2, 4) + (5,) * nd, dtype=D)
    w = torch.randn((4, 6 // groups) + (3,) * nd, dtype=D)
    b = torch.randn(6, dtype=D)
    S, P, DL, OP = [stride] * nd, [padding] * nd, [dilation] * nd, [output_padding] * nd
    _check(lambda x, w, b: aten.convolution.default(x, w, b, S, P, DL, True, OP, groups), x, w, b)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("stride,padding,dilation,output_padding,groups", CONV)
def test_convolution_backward(transposed, nd, stride, padding, dilation, output_padding, groups):
    """Values and gradients (double backward) against eager; the output masks rotate over the cases."""
    torch.manual_seed(0)
    x = torch.randn((2, 4) + (5,) * nd, dtype=D)
    S, P, DL = [stride] * nd, [padding] * nd, [dilation] * nd
    OP = [output_padding] * nd if transposed else [0] * nd
    w = torch.randn(((4, 6 // groups) if transposed else (6, 4 // groups)) + (3,) * nd, dtype=D)
    gy = torch.randn_like(aten.convolution.default(x, w, None, S, P, DL, transposed, OP, groups))
    mask = MASKS[
        (nd + CONV.index((stride, padding, dilation, output_padding, groups))) % len(MASKS)
    ]  # all masks, rotated
    _check(
        lambda gy, x, w: aten.convolution_backward.default(gy, x, w, [6], S, P, DL, transposed, OP, groups, mask),
        gy,
        x,
        w,
    )


POOL = [
    (3, 2, 1, True, False, None),
    (3, 1, 1, False, False, 2),
    ((3, 2), (2, 3), (1, 0), True, True, None),
    (4, 3, 2, True, False, None),
]


@pytest.mark.parametrize("kernel,stride,padding,ceil_mode,count_include_pad,divisor", POOL)
def test_pooling_and_backward_kernels(kernel, stride, padding, ceil_mode, count_include_pad, divisor):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 8, dtype=D)
    args = (kernel, stride, padding, ceil_mode, count_include_pad, divisor)
    _check(lambda x: aten.avg_pool2d.default(x, *args), x)
    _check(lambda x: aten.avg_pool2d.default(x[0], *args), x)
    g = torch.randn_like(aten.avg_pool2d.default(x, *args))
    _check(lambda g, x: aten.avg_pool2d_backward.default(g, x, *args), g, x)
    if isinstance(kernel, int) and kernel < 4:
        _check(lambda x: aten.avg_pool3d.default(x, *args), x)
        _check(lambda x: aten.avg_pool1d.default(x[0], *args[:-1]), x)
    y, indices = aten.max_pool2d_with_indices.default(x, kernel, stride, padding, 1, ceil_mode)
    g = torch.randn_like(y)
    _check(
        lambda g, x: aten.max_pool2d_with_indices_backward.default(
            g, x, kernel, stride, padding, 1, ceil_mode, indices
        ),
        g,
        x,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("affine", [True, False])
def test_norm_backward_kernels(dtype, affine):
    """native_layer_norm_backward / native_group_norm_backward: values, and gradients w.r.t. the
    output grad and weight for layer norm (eager has no derivative for native_group_norm_backward:
    values only). (Eager's double backward w.r.t. the input treats the saved mean/rstd as
    functions of the input; the kernels take them as inputs, so that one is not compared.)"""
    torch.manual_seed(0)
    x = torch.randn(2, 6, 4, 5, dtype=dtype)
    w, b = (torch.randn(4, 5, dtype=dtype), torch.randn(4, 5, dtype=dtype)) if affine else (None, None)
    y, mean, rstd = aten.native_layer_norm.default(x, [4, 5], w, b, 1e-5)
    g = torch.randn_like(y)
    for mask in MASKS if affine else MASKS[1:2]:  # eager needs a weight for grad_weight/grad_bias
        _check(
            lambda g, *wb: aten.native_layer_norm_backward.default(
                g,
                x,
                [4, 5],
                mean,
                rstd,
                *(wb or (None, None)),
                mask,  # noqa: B023 - called right here
            ),
            g,
            *([w, b] if affine else []),
        )
    wc, bc = (torch.randn(6, dtype=dtype), torch.randn(6, dtype=dtype)) if affine else (None, None)
    y, mean, rstd = aten.native_group_norm.default(x, wc, bc, 2, 6, 20, 3, 1e-5)
    g = torch.randn_like(y)
    for mask in MASKS if affine else MASKS[1:2]:
        _check(
            lambda g, *w_: aten.native_group_norm_backward.default(
                g,
                x,
                mean,
                rstd,
                w_[0] if w_ else None,
                2,
                6,
                20,
                3,
                mask,  # noqa: B023 - called right here
            ),
            g,
            *([wc] if affine else []),
            grads=False,
        )  # eager has no derivative for native_group_norm_backward


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("padding_idx", [-1, 4])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag(dtype, mode, padding_idx, include_last_offset):
    """All four outputs (incl. offset2bag/bag_size/max_indices layouts) and the weight gradient;
    an empty bag and repeated indices included."""
    torch.manual_seed(0)
    w = torch.randn(10, 3, dtype=dtype)
    indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 0])
    offsets = torch.tensor([0, 4, 4, 7, 10] if include_last_offset else [0, 4, 4, 7])
    _check(
        lambda w: aten._embedding_bag.default(
            w, indices, offsets, False, mode, False, None, include_last_offset, padding_idx
        ),
        w,
    )
    if mode == 0:
        psw = torch.randn(10, dtype=dtype)
        _check(
            lambda w, p: aten._embedding_bag.default(
                w, indices, offsets, False, 0, False, p, include_last_offset, padding_idx
            ),
            w,
            psw,
        )
