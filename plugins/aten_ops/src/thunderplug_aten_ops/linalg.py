"""Matrix products (mm/bmm/addmm/linear/matmul, fp8 ``_scaled_mm``), distances and FFTs."""

from __future__ import annotations

import thunder.torch as ltorch
import torch
from thunder import clang
from thunder.core import dtypes, prims, utils

from thunderplug import AtenOp
from thunderplug_aten_ops._broadcast import elementwise

aten = torch.ops.aten


def mm(a, b):
    utils.check(a.ndim == 2 and b.ndim == 2, lambda: "mm: both arguments must be 2D")
    return prims.matmul(a, b)


def bmm(a, b):
    utils.check(a.ndim == 3 and b.ndim == 3, lambda: "bmm: both arguments must be 3D")
    return prims.matmul(a, b)


def addmm(a, mat1, mat2, *, beta=1, alpha=1):
    product = mm(mat1, mat2)
    if alpha != 1:
        product = elementwise(prims.mul, product, alpha)
    if beta == 0:  # ATen ignores ``a`` entirely (NaNs included) when beta is 0
        return product
    return elementwise(prims.add, product, a if beta == 1 else elementwise(prims.mul, a, beta))


_FP8_OUT = (dtypes.float8_e4m3fn, dtypes.float8_e5m2, dtypes.float8_e4m3fnuz, dtypes.float8_e5m2fnuz)


def scaled_mm(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
    """ATen's CPU path: fp32 upcast, matmul, times the scales, + bias, / scale_result (fp8 outputs only).
    Per-tensor scales are one element each; rowwise scales (``[M, 1]`` and ``[1, N]``) broadcast. Which
    scales the CPU kernel accepts is ATen's to say when the op runs (torch 2.9 only per-tensor ones)."""
    utils.check(
        a.ndim == 2 and b.ndim == 2, lambda: f"Inputs must be 2D but got self.dim()={a.ndim} and mat2.dim()={b.ndim}"
    )
    out_dtype = a.dtype if out_dtype is None else dtypes.to_dtype(out_dtype)

    def scalar(scale):
        scale = ltorch.reshape(scale, [1, 1]) if scale.numel == 1 else scale
        return clang.maybe_convert_to_dtype(scale, dtypes.float32)

    result = prims.matmul(
        clang.maybe_convert_to_dtype(a, dtypes.float32), clang.maybe_convert_to_dtype(b, dtypes.float32)
    )
    result = elementwise(prims.mul, elementwise(prims.mul, result, scalar(scale_a)), scalar(scale_b))
    if bias is not None:
        result = elementwise(prims.add, result, clang.maybe_convert_to_dtype(bias, dtypes.float32))
    if scale_result is not None and out_dtype in _FP8_OUT:
        inverse = prims.div(1.0, clang.maybe_convert_to_dtype(ltorch.reshape(scale_result, [1, 1]), dtypes.float32))
        result = prims.mul(result, clang.expand(inverse, result.shape))
    return clang.maybe_convert_to_dtype(result, out_dtype)


_CDIST_MODES = {
    None: "use_mm_for_euclid_dist_if_necessary",
    0: "use_mm_for_euclid_dist_if_necessary",
    1: "use_mm_for_euclid_dist",
    2: "donot_use_mm_for_euclid_dist",
}


def cdist(x1, x2, p, compute_mode=None):
    return ltorch.cdist(x1, x2, p, _CDIST_MODES[compute_mode])


_FFT_NORMS = {0: "backward", 1: "ortho", 2: "forward"}


def fft_r2c(a, dim, normalization, onesided):
    fft = ltorch.rfftn if onesided else ltorch.fftn
    return fft(a, dim=list(dim), norm=_FFT_NORMS[normalization])


def ops() -> tuple[AtenOp, ...]:
    """This module's overloads and their decompositions."""
    return (
        AtenOp(aten.mm.default, mm),
        AtenOp(aten.bmm.default, bmm),
        AtenOp(aten.addmm.default, addmm),
        AtenOp(aten._scaled_mm.default, scaled_mm, differentiable=False),
        AtenOp(aten._cdist_forward.default, cdist),
        AtenOp(aten._fft_r2c.default, fft_r2c),
    )
