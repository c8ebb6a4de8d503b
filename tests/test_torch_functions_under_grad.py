"""A sweep of torch functions and Tensor methods that eager differentiates, under ``thunder.jit(fn,
executors=thunderplug.discover())`` with inputs requiring grad: each program's outputs (values, dtypes, shapes,
``requires_grad``) and every input's gradient for a random cotangent are eager's, bit for bit.

Each program is classified: ``OK``; ``LOUD`` (discover() raises where eager runs); ``SILENT`` (a value, a
``requires_grad`` or a gradient differs). The test asserts ``OK`` except for the programs in :data:`KNOWN`
(docs/known-issues.md), which must still fail as said there (so a fix shows up). Run it as a script for the
table, with stock ``thunder.jit`` beside it: ``.venv/bin/python tests/test_torch_functions_under_grad.py
[--stock] [names...]``.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunderplug

S = (3, 4)  # the default input shape


def _pos(x):
    return x.abs() + 0.5


def _unit(x):  # in (0, 1)
    return x.sigmoid() * 0.9 + 0.05


def _ties(x):  # x rounded (ties and zeros), differentiable as x
    return x.detach().round() + (x - x.detach())


def _idx(*shape, high, seed=7):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


_I34 = _idx(3, 4, high=3)
_I4 = _idx(4, high=3)
_I3 = _idx(3, high=4)
_MASK = torch.randn(3, 4, generator=torch.Generator().manual_seed(5)) > 0
_TARGET = torch.randint(0, 2, (3, 4), generator=torch.Generator().manual_seed(6)).float()
_COUNTS = torch.randint(0, 5, (3, 4), generator=torch.Generator().manual_seed(6)).float()
_BAG_IDX = torch.tensor([0, 2, 1, 3, 4, 2])
_VALUE = torch.tensor(0.7)  # a tensor ``value``, read by eager as a number
_EYE = torch.eye(3)
_TRIL = torch.tril_indices(3, 4)
_UPSAMPLE = torch.nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
_AVG_POOL = torch.nn.AvgPool2d(3, 1, 1, count_include_pad=False)
_BAG_OFF = torch.tensor([0, 2, 5])

#: name -> (function, input shapes); every input is float32 ``randn`` requiring grad
PROGRAMS: dict[str, tuple[Callable, list[tuple[int, ...]]]] = {
    # elementwise, zero or piecewise gradients
    "round": (lambda x: x.round() * x, [S]),
    "torch_round": (lambda x: torch.round(x * 3), [S]),
    "round_decimals": (lambda x: torch.round(x, decimals=2) * x, [S]),
    "round_decimals_method": (lambda x: x.round(decimals=-1) + x.round(decimals=0) * x, [S]),
    "trunc": (lambda x: torch.trunc(x * 3) * x, [S]),
    "fix": (lambda x: torch.fix(x * 3) + x, [S]),
    "frac": (lambda x: torch.frac(x * 3), [S]),
    "sign": (lambda x: torch.sign(x) * x, [S]),
    "sgn": (lambda x: x.sgn() * x, [S]),
    "floor": (lambda x: torch.floor(x * 3) * x, [S]),
    "ceil": (lambda x: x.ceil() * x, [S]),
    "clamp": (lambda x: x.clamp(-0.5, 0.5), [S]),
    "clamp_min": (lambda x: x.clamp_min(0.1), [S]),
    "clamp_max": (lambda x: torch.clamp_max(x, 0.1), [S]),
    "clip": (lambda x: torch.clip(x, min=-0.3), [S]),
    "clamp_tensor": (lambda x, lo: torch.clamp(x, lo, lo + 1), [S, S]),
    "fmod": (lambda x, y: torch.fmod(x * 3, _pos(y)), [S, S]),
    "fmod_scalar": (lambda x: torch.fmod(x * 3, 0.7), [S]),
    "remainder": (lambda x, y: torch.remainder(x * 3, _pos(y)), [S, S]),
    "copysign": (lambda x, y: torch.copysign(x, y), [S, S]),
    "hypot": (lambda x, y: torch.hypot(x, y), [S, S]),
    "logaddexp": (lambda x, y: torch.logaddexp(x, y), [S, S]),
    "logaddexp2": (lambda x, y: torch.logaddexp2(x, y), [S, S]),
    "xlogy": (lambda x, y: torch.xlogy(x, _pos(y)), [S, S]),
    "special_xlog1py": (lambda x, y: torch.special.xlog1py(x, _pos(y)), [S, S]),
    "special_erfcx": (lambda x: torch.special.erfcx(x), [S]),
    "special_ndtr": (lambda x: torch.special.ndtr(x), [S]),
    "special_ndtri": (lambda x: torch.special.ndtri(_unit(x)), [S]),
    "special_log_ndtr": (lambda x: torch.special.log_ndtr(x), [S]),
    "special_i0e": (lambda x: torch.special.i0e(x), [S]),
    "special_i1": (lambda x: torch.special.i1(x), [S]),
    "special_i1e": (lambda x: torch.special.i1e(x), [S]),
    "special_entr": (lambda x: torch.special.entr(_pos(x)), [S]),
    "special_expit": (lambda x: torch.special.expit(x), [S]),
    "special_logit": (lambda x: torch.special.logit(_unit(x)), [S]),
    "logit_eps": (lambda x: torch.logit(x, eps=0.1), [S]),
    "special_sinc": (lambda x: torch.special.sinc(x), [S]),
    "special_log_softmax": (lambda x: torch.special.log_softmax(x, 1), [S]),
    "i0": (lambda x: torch.i0(x), [S]),
    "sinc": (lambda x: torch.sinc(x), [S]),
    "erfinv": (lambda x: torch.erfinv(_unit(x) * 2 - 1), [S]),
    "erf": (lambda x: torch.erf(x), [S]),
    "erfc": (lambda x: torch.erfc(x), [S]),
    "polygamma": (lambda x: torch.polygamma(1, _pos(x)), [S]),
    "digamma": (lambda x: torch.digamma(_pos(x)), [S]),
    "lgamma": (lambda x: torch.lgamma(_pos(x)), [S]),
    "mvlgamma": (lambda x: torch.mvlgamma(_pos(x) + 1, 2), [S]),
    "atan2": (lambda x, y: torch.atan2(x, y), [S, S]),
    "heaviside": (lambda x, y: torch.heaviside(x, y) * x, [S, S]),
    "heaviside_constant_values": (lambda x: torch.heaviside(x, _TARGET), [S]),
    "nan_to_num": (lambda x: torch.nan_to_num(x.log()), [S]),
    "float_power": (lambda x: torch.float_power(_pos(x), 2.5), [S]),
    "ldexp": (lambda x: torch.ldexp(x, torch.tensor(3)), [S]),
    "fmax": (lambda x, y: torch.fmax(x, y), [S, S]),
    "fmin": (lambda x, y: torch.fmin(x, y), [S, S]),
    "maximum": (lambda x, y: torch.maximum(x, y), [S, S]),
    "minimum_ties": (lambda x: torch.minimum(x, x.round()), [S]),
    "expm1": (lambda x: torch.expm1(x), [S]),
    "log1p": (lambda x: torch.log1p(_pos(x)), [S]),
    "exp2": (lambda x: torch.exp2(x), [S]),
    "log2": (lambda x: torch.log2(_pos(x)), [S]),
    "log10": (lambda x: torch.log10(_pos(x)), [S]),
    "rsqrt": (lambda x: torch.rsqrt(_pos(x)), [S]),
    "square": (lambda x: torch.square(x), [S]),
    "true_divide": (lambda x, y: torch.true_divide(x, _pos(y)), [S, S]),
    "div_floor": (lambda x, y: torch.div(x, _pos(y), rounding_mode="floor") * x, [S, S]),
    "div_trunc": (lambda x, y: torch.div(x, _pos(y), rounding_mode="trunc") * x, [S, S]),
    "floor_divide": (lambda x, y: torch.floor_divide(x, _pos(y)) * x, [S, S]),
    "floordiv_operator": (lambda x: (x * 3) // 0.7 + x, [S]),
    "floor_divide_constant": (lambda x: torch.floor_divide(_TARGET, _pos(x)), [S]),
    "floor_divide_detached": (lambda x: (x * 3).detach() // 0.7 + x, [S]),
    "heaviside_detached": (lambda x: torch.heaviside(x.detach(), _TARGET) * x, [S]),
    "div_trunc_scalar": (lambda x: torch.div(x * 3, 0.7, rounding_mode="trunc") * x, [S]),
    "div_floor_broadcast": (lambda x, y: torch.div(x * 3, _pos(y), rounding_mode="floor") + x, [S, (4,)]),
    "div_trunc_broadcast": (lambda x, y: torch.div(x * 3, _pos(y), rounding_mode="trunc") + x, [S, (4,)]),
    "addcmul": (lambda x, y, z: torch.addcmul(x, y, z, value=0.5), [S, S, S]),
    "addcmul_broadcast": (lambda x, y, z: x.addcmul(y, z), [(4,), S, (3, 1)]),
    "addcmul_constant": (lambda x, y: torch.addcmul(x, y, _TARGET, value=-2), [S, S]),
    "addcdiv": (lambda x, y, z: torch.addcdiv(x, y, _pos(z), value=0.5), [S, S, S]),
    "addcdiv_default": (lambda x, y, z: x.addcdiv(y, _pos(z)), [S, S, (4,)]),
    "addcmul_tensor_value": (lambda x, y, z: torch.addcmul(x, y, z, value=_VALUE), [S, S, S]),
    "addcdiv_tensor_value": (lambda x, y, z: torch.addcdiv(x, y, _pos(z), value=_VALUE), [S, S, S]),
    "lerp": (lambda x, y: torch.lerp(x, y, 0.3), [S, S]),
    "rad2deg": (lambda x: torch.rad2deg(x), [S]),
    "deg2rad": (lambda x: torch.deg2rad(x), [S]),
    "angle": (lambda x: torch.angle(x) + x, [S]),
    "asinh": (lambda x: torch.asinh(x), [S]),
    "acosh": (lambda x: torch.acosh(_pos(x) + 1), [S]),
    "atanh": (lambda x: torch.atanh(_unit(x)), [S]),
    "softsign": (lambda x: F.softsign(x), [S]),
    "tanhshrink": (lambda x: F.tanhshrink(x), [S]),
    # reductions
    "amax": (lambda x: torch.amax(x, 1), [S]),
    "amin": (lambda x: x.amin((0, 1)), [S]),
    "aminmax": (lambda x: torch.aminmax(x, dim=1).max, [S]),
    "nansum": (lambda x: torch.nansum(x, 1), [S]),
    "nanmean": (lambda x: torch.nanmean(x, 0), [S]),
    "sum_dtype": (lambda x: x.sum(1, dtype=torch.float64), [S]),
    "std": (lambda x: torch.std(x, 1), [S]),
    "std_correction": (lambda x: torch.std(x, 1, correction=0), [S]),
    "var_correction": (lambda x: x.var(0, correction=2, keepdim=True), [S]),
    "var_all": (lambda x: x.var(), [S]),
    "var_mean": (lambda x: torch.var_mean(x, 1), [S]),
    "var_mean_var_only": (lambda x: torch.var_mean(x, (0, 1), keepdim=True)[0] * x, [S]),
    "var_1d": (lambda x: x.var(0) * x, [(5,)]),
    "std_all_correction": (lambda x: x.std(correction=0), [(2, 3, 2)]),
    "std_mean": (lambda x: torch.std_mean(x, 0, correction=0), [S]),
    "logcumsumexp": (lambda x: torch.logcumsumexp(x, 1), [S]),
    "cumsum": (lambda x: torch.cumsum(x, 0), [S]),
    "cumprod": (lambda x: torch.cumprod(x, 1), [S]),
    "cummax": (lambda x: torch.cummax(x, 1).values, [S]),
    "cummin": (lambda x: torch.cummin(x, 0)[0], [S]),
    "norm": (lambda x: torch.norm(x), [S]),
    "norm_p1_dim": (lambda x: x.norm(1, dim=1), [S]),
    "vector_norm": (lambda x: torch.linalg.vector_norm(x, 3, dim=0), [S]),
    "vector_norm_inf": (lambda x: torch.linalg.vector_norm(x, float("inf"), dim=1), [S]),
    "matrix_norm": (lambda x: torch.linalg.matrix_norm(x), [S]),
    "dist": (lambda x, y: torch.dist(x, y), [S, S]),
    "dist_p3": (lambda x, y: torch.dist(x, y, 3), [S, S]),
    "renorm": (lambda x: torch.renorm(x, 2, 0, 1.0), [S]),
    "logsumexp": (lambda x: torch.logsumexp(x, 1), [S]),
    "median": (lambda x: torch.median(x), [S]),
    "max_dim": (lambda x: x.max(1).values, [S]),
    "prod": (lambda x: x.prod(1), [S]),
    "mean_dims": (lambda x: x.mean((0, 1), keepdim=True), [S]),
    "softmax": (lambda x: torch.softmax(x, 1), [S]),
    "log_softmax": (lambda x: F.log_softmax(x, 0), [S]),
    # linear algebra and matrix builders
    "trace": (lambda x: torch.trace(x), [S]),
    "diag": (lambda x: torch.diag(x), [S]),
    "diag_vector": (lambda x: torch.diag(x, 1), [(4,)]),
    "diag_embed": (lambda x: torch.diag_embed(x), [S]),
    "diagonal": (lambda x: torch.diagonal(x, 1), [S]),
    "tril": (lambda x: torch.tril(x), [S]),
    "triu": (lambda x: x.triu(1), [S]),
    "kron": (lambda x, y: torch.kron(x, y), [(2, 3), (3, 2)]),
    "cross": (lambda x, y: torch.linalg.cross(x, y), [(4, 3), (4, 3)]),
    "outer": (lambda x, y: torch.outer(x, y), [(3,), (4,)]),
    "baddbmm": (lambda x, a, b: torch.baddbmm(x, a, b, beta=0.5, alpha=2), [(2, 3, 4), (2, 3, 5), (2, 5, 4)]),
    "addmm": (lambda x, a, b: torch.addmm(x, a, b), [S, (3, 5), (5, 4)]),
    "addmv": (lambda x, a, b: torch.addmv(x, a, b), [(3,), (3, 4), (4,)]),
    "addr": (lambda x, a, b: torch.addr(x, a, b), [S, (3,), (4,)]),
    "bmm": (lambda a, b: torch.bmm(a, b), [(2, 3, 4), (2, 4, 5)]),
    "einsum": (lambda a, b: torch.einsum("ij,jk->ik", a, b), [(3, 4), (4, 5)]),
    "einsum_batch": (lambda a, b: torch.einsum("bij,bkj->bik", a, b), [(2, 3, 4), (2, 5, 4)]),
    "tensordot": (lambda a, b: torch.tensordot(a, b, dims=([1], [0])), [(3, 4), (4, 5)]),
    "cdist": (lambda a, b: torch.cdist(a, b), [(3, 4), (5, 4)]),
    "cdist_p1": (lambda a, b: torch.cdist(a, b, p=1), [(3, 4), (5, 4)]),
    "det": (lambda x: torch.linalg.det(x), [(3, 3)]),
    "inv": (lambda x: torch.linalg.inv(x + 3 * _EYE), [(3, 3)]),
    # shape and indexing
    "roll": (lambda x: torch.roll(x, 1, 1), [S]),
    "roll_flat": (lambda x: x.roll(2), [S]),
    "rot90": (lambda x: torch.rot90(x, 1, (0, 1)), [S]),
    "flip": (lambda x: torch.flip(x, (0, 1)), [S]),
    "fliplr": (lambda x: torch.fliplr(x), [S]),
    "flipud": (lambda x: torch.flipud(x), [S]),
    "narrow": (lambda x: x.narrow(1, 1, 2), [S]),
    "tensor_unfold": (lambda x: x.unfold(1, 2, 1), [S]),
    "tensor_unfold_rows": (lambda x: x.unfold(0, 2, 1).sum(-1) * x[:2], [S]),
    "take_along_dim": (lambda x: torch.take_along_dim(x, _I34, 0), [S]),
    "gather": (lambda x: torch.gather(x, 0, _I34), [S]),
    "scatter": (lambda x, src: torch.scatter(x, 0, _I34, src), [S, S]),
    "scatter_add": (lambda x, src: x.scatter_add(0, _I34, src), [S, S]),
    "scatter_reduce_sum": (lambda x, src: x.scatter_reduce(0, _I34, src, "sum"), [S, S]),
    "scatter_reduce_amax": (lambda x, src: x.scatter_reduce(0, _I34, src, "amax"), [S, S]),
    "scatter_reduce_mean": (lambda x, src: x.scatter_reduce(0, _I34, src, "mean", include_self=False), [S, S]),
    "index_select": (lambda x: torch.index_select(x, 1, _I3), [S]),
    "index_add": (lambda x, src: x.index_add(0, _I4[:2], src, alpha=2), [S, (2, 4)]),
    "index_add_function": (lambda x, src: torch.index_add(x, 1, _I3[:2], src, alpha=0.3), [S, (3, 2)]),
    "index_add_no_alpha": (lambda x, src: x.index_add(0, _I4[:2], src), [S, (2, 4)]),
    "index_copy": (lambda x, src: x.index_copy(0, torch.tensor([2, 0]), src), [S, (2, 4)]),
    "index_fill": (lambda x: x.index_fill(1, torch.tensor([0, 2]), 1.5), [S]),
    "masked_fill": (lambda x: x.masked_fill(_MASK, 0.5), [S]),
    "masked_fill_tensor": (lambda x, v: x.masked_fill(_MASK, v.sum()), [S, ()]),
    "masked_scatter": (lambda x, s: x.masked_scatter(_MASK, s), [S, S]),
    "where": (lambda x, y: torch.where(_MASK, x, y), [S, S]),
    "where_scalar": (lambda x: torch.where(x > 0, x, 0.0), [S]),
    "clone": (lambda x: x.clone() * 2, [S]),
    "expand_as": (lambda x, y: x.expand_as(y), [(1, 4), S]),
    "repeat": (lambda x: x.repeat(2, 1, 3), [S]),
    "repeat_tuple": (lambda x: x.repeat((3, 2)).exp(), [(4,)]),
    "repeat_interleave": (lambda x: x.repeat_interleave(2, 0), [S]),
    "tile": (lambda x: torch.tile(x, (2,)), [S]),
    "chunk": (lambda x: x.chunk(2, 1)[1] * x.chunk(2, 1)[0], [S]),
    "split": (lambda x: torch.split(x, [1, 3], 1)[1], [S]),
    "unbind": (lambda x: torch.unbind(x, 1)[2] * 2, [S]),
    "cat": (lambda x, y: torch.cat([x, y], 1), [S, (3, 2)]),
    "stack": (lambda x, y: torch.stack([x, y], 2), [S, S]),
    "hstack": (lambda x, y: torch.hstack([x, y]), [S, S]),
    "vstack": (lambda x, y: torch.vstack([x, y]), [S, (4,)]),
    "dstack": (lambda x, y: torch.dstack([x, y]), [S, S]),
    "dstack_1d": (lambda x, y: torch.dstack((x, y)) * 2, [(4,), (1, 4)]),
    "hstack_1d": (lambda x, y: torch.hstack((x, y * 2)), [(4,), (3,)]),
    "hstack_0dim": (lambda x, y: torch.hstack([x, y]).exp(), [(), (3,)]),
    "vstack_0dim": (lambda x, y: torch.vstack([x, y]), [(), (1,)]),
    "row_stack": (lambda x, y: torch.row_stack([x, y]), [(4,), S]),
    "column_stack": (lambda x, y, z: torch.column_stack([x, y, z]), [(3,), (3, 2), (3,)]),
    "column_stack_0dim": (lambda x, y: torch.column_stack((x, y)).exp(), [(), (1,)]),
    "hsplit": (lambda x: torch.hsplit(x, 2)[1] * 3, [S]),
    "broadcast_tensors": (lambda x, y: torch.broadcast_tensors(x, y)[0] * 2, [(1, 4), S]),
    "broadcast_tensors_second": (lambda x, y, z: torch.broadcast_tensors(x, y, z)[1] * 2, [(3, 1), (1, 4), (4,)]),
    "movedim": (lambda x: torch.movedim(x, 0, 2), [(2, 3, 4)]),
    "swapaxes": (lambda x: x.swapaxes(0, 1), [S]),
    "t": (lambda x: x.t() * 2, [S]),
    "flatten": (lambda x: x.flatten(), [(2, 3, 4)]),
    "unflatten": (lambda x: x.unflatten(1, (2, 2)), [S]),
    "take": (lambda x: torch.take(x, torch.tensor([0, 5, 11, 5])), [S]),
    "index_tensor": (lambda x: x[_I3], [(4, 3)]),
    "index_put": (lambda x, v: x.index_put((torch.tensor([0, 2]),), v), [S, (2, 4)]),
    "slice_step": (lambda x: x[:, ::2] * 3, [S]),
    "tensor_split": (lambda x: torch.tensor_split(x, 3, 1)[1], [(3, 6)]),
    "tril_indices_gather": (lambda x: x[_TRIL[0], _TRIL[1]], [S]),
    "atleast_2d": (lambda x: torch.atleast_2d(x), [(4,)]),
    "block_diag": (lambda x, y: torch.block_diag(x, y), [(2, 2), (1, 3)]),
    "cartesian_prod": (lambda x, y: torch.cartesian_prod(x, y), [(2,), (3,)]),
    "meshgrid": (lambda x, y: torch.meshgrid(x, y, indexing="ij")[0] * 2, [(2,), (3,)]),
    "meshgrid_xy": (lambda x, y, z: torch.meshgrid([x, y, z], indexing="xy")[0] * 3, [(2,), (3,), (4,)]),
    # torch.nn.functional: activations
    "relu": (lambda x: F.relu(x), [S]),
    "gelu": (lambda x: F.gelu(x), [S]),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), [S]),
    "silu": (lambda x: F.silu(x), [S]),
    "mish": (lambda x: F.mish(x), [S]),
    "elu": (lambda x: F.elu(x, 0.7), [S]),
    "selu": (lambda x: F.selu(x), [S]),
    "celu": (lambda x: F.celu(x, 0.5), [S]),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), [S]),
    "prelu": (lambda x, w: F.prelu(x, w), [S, (4,)]),
    "rrelu_eval": (lambda x: F.rrelu(x, training=False), [S]),
    "hardtanh": (lambda x: F.hardtanh(x, -0.5, 0.5), [S]),
    "relu6": (lambda x: F.relu6(x * 4), [S]),
    "hardswish": (lambda x: F.hardswish(x * 3), [S]),
    "hardsigmoid": (lambda x: F.hardsigmoid(x * 3), [S]),
    "hardshrink": (lambda x: F.hardshrink(x), [S]),
    "softshrink": (lambda x: F.softshrink(x), [S]),
    "softplus": (lambda x: F.softplus(x, beta=2), [S]),
    "softmin": (lambda x: F.softmin(x, 1), [S]),
    "logsigmoid": (lambda x: F.logsigmoid(x), [S]),
    "threshold": (lambda x: F.threshold(x, 0.1, -1.0), [S]),
    "glu": (lambda x: F.glu(x, 1), [S]),
    # torch.nn.functional: losses
    "mse_loss": (lambda x, y: F.mse_loss(x, y), [S, S]),
    "mse_loss_constant_target": (lambda x: F.mse_loss(x, _TARGET, reduction="sum"), [S]),
    "mse_loss_broadcast": (lambda x, y: F.mse_loss(x, y.expand(3, 4), reduction="none"), [S, (4,)]),
    "l1_loss": (lambda x, y: F.l1_loss(x, y, reduction="sum"), [S, S]),
    "huber_loss": (lambda x, y: F.huber_loss(x, y, delta=0.5), [S, S]),
    "smooth_l1_loss": (lambda x, y: F.smooth_l1_loss(x, y, beta=0.5), [S, S]),
    "smooth_l1_loss_none": (lambda x, y: F.smooth_l1_loss(x, y, reduction="none"), [S, S]),
    "kl_div": (lambda x, y: F.kl_div(F.log_softmax(x, 1), y.softmax(1), reduction="batchmean"), [S, S]),
    "kl_div_log_target": (lambda x, y: F.kl_div(x, y, reduction="sum", log_target=True), [S, S]),
    "binary_cross_entropy": (lambda x: F.binary_cross_entropy(_unit(x), _TARGET), [S]),
    "binary_cross_entropy_weight": (lambda x: F.binary_cross_entropy(_unit(x), _TARGET, _COUNTS), [S]),
    "bce_with_logits": (lambda x: F.binary_cross_entropy_with_logits(x, _TARGET), [S]),
    "bce_with_logits_pos_weight": (
        lambda x: F.binary_cross_entropy_with_logits(x, _TARGET, pos_weight=_COUNTS[0] + 1), [S]),
    "poisson_nll": (lambda x: F.poisson_nll_loss(x, _COUNTS), [S]),
    "poisson_nll_full": (lambda x: F.poisson_nll_loss(_pos(x), _COUNTS, log_input=False, full=True), [S]),
    "gaussian_nll": (lambda x, v: F.gaussian_nll_loss(x, _TARGET, _pos(v)), [S, S]),
    "cross_entropy": (lambda x: F.cross_entropy(x, _I3), [(3, 4)]),
    "cross_entropy_smoothing": (lambda x: F.cross_entropy(x, _I3, label_smoothing=0.1), [(3, 4)]),
    "cross_entropy_probs": (lambda x, y: F.cross_entropy(x, y.softmax(1)), [S, S]),
    "nll_loss": (lambda x: F.nll_loss(F.log_softmax(x, 1), _I3), [(3, 4)]),
    "margin_ranking": (lambda x, y: F.margin_ranking_loss(x, y, _TARGET * 2 - 1, margin=0.1), [S, S]),
    "hinge_embedding": (lambda x: F.hinge_embedding_loss(x, _TARGET * 2 - 1), [S]),
    "soft_margin": (lambda x: F.soft_margin_loss(x, _TARGET * 2 - 1), [S]),
    "soft_margin_none": (lambda x: F.soft_margin_loss(x, _TARGET * 2 - 1, reduction="none"), [S]),
    "multilabel_soft_margin": (lambda x: F.multilabel_soft_margin_loss(x, _TARGET), [S]),
    "multi_margin": (lambda x: F.multi_margin_loss(x, _I3), [(3, 4)]),
    "triplet_margin": (lambda a, p, n: F.triplet_margin_loss(a, p, n), [S, S, S]),
    "cosine_embedding": (lambda x, y: F.cosine_embedding_loss(x, y, torch.tensor([1.0, -1.0, 1.0])), [S, S]),
    # torch.nn.functional: distances, normalization
    "cosine_similarity": (lambda x, y: F.cosine_similarity(x, y), [S, S]),
    "pairwise_distance": (lambda x, y: F.pairwise_distance(x, y), [S, S]),
    "normalize": (lambda x: F.normalize(x, dim=0), [S]),
    "normalize_p1": (lambda x: F.normalize(x, p=1.0), [S]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (4,), w, b), [S, (4,), (4,)]),
    "rms_norm": (lambda x, w: F.rms_norm(x, (4,), w), [S, (4,)]),
    "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b), [(2, 4, 3), (4,), (4,)]),
    "group_norm_no_affine": (lambda x: F.group_norm(x, 4), [(2, 4, 3, 2)]),
    "group_norm_constant_weight": (lambda x: F.group_norm(x, 2, _TARGET[0] + 1), [(2, 4, 3)]),
    "instance_norm": (lambda x: F.instance_norm(x), [(2, 3, 5)]),
    "batch_norm_train": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), [(4, 3), (3,), (3,)]),
    "local_response_norm": (lambda x: F.local_response_norm(x, 2), [(2, 4, 5)]),
    "dropout_eval": (lambda x: F.dropout(x, 0.5, training=False), [S]),
    # torch.nn.functional: shapes, pooling, convolution
    "pad_constant": (lambda x: F.pad(x, (1, 2), value=0.5), [S]),
    "pad_reflect": (lambda x: F.pad(x, (1, 2), mode="reflect"), [(2, 3, 4)]),
    "pad_replicate": (lambda x: F.pad(x, (1, 2), mode="replicate"), [(2, 3, 4)]),
    "pad_circular": (lambda x: F.pad(x, (1, 2), mode="circular"), [(2, 3, 4)]),
    "pad_reflect_2d": (lambda x: F.pad(x, (1, 1, 1, 2), mode="reflect"), [(1, 2, 3, 4)]),
    "pad_replicate_3d": (lambda x: F.pad(x * 2, [1, 0, 2, 1, 0, 1], "replicate").exp(), [(1, 2, 2, 3, 4)]),
    "pad_circular_2d": (lambda x: F.pad(x, (2, 1, 1, 0), mode="circular").sum(1), [(2, 2, 3, 4)]),
    "pad_constant_negative": (lambda x: F.pad(x, (-1, 2), value=-1.5), [S]),
    "pad_constant_negative_only": (lambda x: F.pad(x, (-1, -1, 0, -1)), [S]),
    "conv2d_padding_mode": (
        lambda x, w: F.conv2d(F.pad(x, (1, 1, 1, 1), mode="reflect"), w), [(1, 2, 4, 4), (3, 2, 3, 3)]),
    "interpolate_nearest": (lambda x: F.interpolate(x, scale_factor=2), [(1, 2, 3, 4)]),
    "interpolate_bilinear": (lambda x: F.interpolate(x, size=(5, 7), mode="bilinear"), [(1, 2, 3, 4)]),
    "interpolate_bilinear_corners": (
        lambda x: F.interpolate(x, size=(5, 7), mode="bilinear", align_corners=True), [(1, 2, 3, 4)]),
    "interpolate_bicubic": (lambda x: F.interpolate(x, size=(5, 6), mode="bicubic"), [(1, 2, 3, 4)]),
    "interpolate_linear": (lambda x: F.interpolate(x, size=7, mode="linear"), [(1, 2, 4)]),
    "interpolate_nearest_exact": (lambda x: F.interpolate(x, size=(5, 7), mode="nearest-exact"), [(1, 2, 3, 4)]),
    "interpolate_area": (lambda x: F.interpolate(x, size=(2, 2), mode="area"), [(1, 2, 4, 4)]),
    "interpolate_trilinear": (lambda x: F.interpolate(x, scale_factor=1.5, mode="trilinear"), [(1, 2, 2, 3, 4)]),
    "interpolate_bicubic_corners": (
        lambda x: F.interpolate(x * 2, size=(6, 5), mode="bicubic", align_corners=True).exp(), [(1, 2, 3, 4)]),
    "interpolate_bilinear_antialias": (
        lambda x: F.interpolate(x, size=(2, 3), mode="bilinear", antialias=True), [(1, 2, 5, 7)]),
    "interpolate_recompute_scale": (
        lambda x: F.interpolate(x, scale_factor=1.7, mode="linear", recompute_scale_factor=True), [(2, 3, 4)]),
    "interpolate_nearest_1d_size": (lambda x: F.interpolate(x, 7), [(2, 3, 4)]),
    "upsample_module": (lambda x: _UPSAMPLE(x).sin(), [(1, 2, 3, 4)]),
    "fold": (lambda x: F.fold(x, (3, 3), 2), [(1, 8, 4)]),
    "unfold": (lambda x: F.unfold(x, 2), [(1, 2, 3, 4)]),
    "pixel_shuffle": (lambda x: F.pixel_shuffle(x, 2), [(1, 8, 2, 3)]),
    "pixel_unshuffle": (lambda x: F.pixel_unshuffle(x, 2), [(1, 2, 4, 6)]),
    "embedding": (lambda w: F.embedding(_I34, w), [(4, 3)]),
    "embedding_bag": (lambda w: F.embedding_bag(_BAG_IDX, w, _BAG_OFF), [(5, 3)]),
    "embedding_bag_sum": (lambda w: F.embedding_bag(_BAG_IDX, w, _BAG_OFF, mode="sum"), [(5, 3)]),
    "embedding_bag_max": (lambda w: F.embedding_bag(_BAG_IDX, w, _BAG_OFF, mode="max"), [(5, 3)]),
    "one_hot_matmul": (lambda w: F.one_hot(_I3, 4).float() @ w, [(4, 3)]),
    "linear": (lambda x, w, b: F.linear(x, w, b), [(2, 3, 4), (5, 4), (5,)]),
    "bilinear": (lambda x, y, w, b: F.bilinear(x, y, w, b), [(3, 2), (3, 4), (5, 2, 4), (5,)]),
    "conv1d": (lambda x, w: F.conv1d(x, w, padding=1), [(1, 2, 5), (3, 2, 3)]),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, stride=2), [(1, 2, 5, 5), (3, 2, 3, 3), (3,)]),
    "conv_transpose2d": (lambda x, w: F.conv_transpose2d(x, w), [(1, 2, 3, 3), (2, 3, 2, 2)]),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2), [(1, 2, 4, 4)]),
    "max_pool1d": (lambda x: F.max_pool1d(x, 2, 1), [(1, 2, 5)]),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 2, 1), [(1, 2, 4, 4)]),
    "avg_pool1d_pad": (lambda x: F.avg_pool1d(x, 3, 2, 1, count_include_pad=False), [(1, 2, 6)]),
    "avg_pool2d_pad_ceil": (
        lambda x: F.avg_pool2d(x * 2, 3, 2, 1, ceil_mode=True, count_include_pad=False).exp(), [(1, 2, 5, 6)]),
    "avg_pool2d_divisor": (lambda x: F.avg_pool2d(x, (2, 3), divisor_override=4), [(2, 3, 4, 6)]),
    "avg_pool3d_pad": (lambda x: F.avg_pool3d(x, 2, padding=1, count_include_pad=False), [(1, 2, 3, 4, 4)]),
    "avg_pool_module": (lambda x: _AVG_POOL(x) * x.mean(), [(1, 2, 4, 4)]),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, (2, 3)), [(1, 2, 4, 5)]),
    # output size 1: eager runs ``mean`` (its backward: the gradient expanded, divided by the count)
    "adaptive_avg_pool2d_global": (lambda x: F.adaptive_avg_pool2d(x, 1), [(2, 32, 6, 6)]),
    "adaptive_avg_pool1d_global": (lambda x: F.adaptive_avg_pool1d(x, 1), [(2, 32, 7)]),
    "adaptive_avg_pool3d_global": (lambda x: F.adaptive_avg_pool3d(x, (1, 1, 1)), [(2, 8, 3, 5, 6)]),
    "adaptive_max_pool2d": (lambda x: F.adaptive_max_pool2d(x, 2), [(1, 2, 4, 5)]),
    "lp_pool2d": (lambda x: F.lp_pool2d(_pos(x), 2, 2), [(1, 2, 4, 4)]),
    "scaled_dot_product_attention": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), [(1, 2, 3, 4)] * 3),
    # Tensor methods and operators
    "pow_operator": (lambda x: x ** 3, [S]),
    "rpow": (lambda x: 2 ** x, [S]),
    "rpow_fraction": (lambda x: 0.3 ** x + torch.pow(1.5, x * 2), [S]),
    "rpow_zero_base": (lambda x: 0.0 ** x.abs() + 0 ** (x - 0.5), [S]),
    "rpow_negative_base": (lambda x: (-2) ** x.round(), [S]),
    "rsub": (lambda x: 1 - x, [S]),
    "rdiv": (lambda x: 1 / _pos(x), [S]),
    "rdiv_number": (lambda x: 3 / x + 0.7 / (x * 2), [S]),
    "abs_operator": (lambda x: abs(x), [S]),
    "neg": (lambda x: -x, [S]),
    "matmul_operator": (lambda a, b: a @ b, [(2, 3, 4), (4, 5)]),
    "type_as": (lambda x, y: x.type_as(y) * y, [S, S]),
    "to_double": (lambda x: x.to(torch.float64) * 2, [S]),
    "double": (lambda x: x.double().exp(), [S]),
    "new_tensor_ops": (lambda x: x.new_ones(3, 4) * x + x.new_zeros(4), [S]),
    "sort_values": (lambda x: torch.sort(x, 1).values, [S]),
    "topk": (lambda x: x.topk(2, 1).values, [S]),
    "msort": (lambda x: torch.msort(x), [S]),
    "kthvalue": (lambda x: x.kthvalue(2, 1).values, [S]),
    "nanmedian": (lambda x: x.nanmedian(1).values, [S]),
    "mode": (lambda x: x.round().mode(1).values * 1.0, [S]),
    "count_nonzero_mul": (lambda x: x * torch.count_nonzero(x > 0), [S]),
    "histc_free_mul": (lambda x: x * x.detach().sum(), [S]),
    "polar_abs": (lambda x, y: torch.polar(_pos(x), y).abs(), [S, S]),
    "complex_view": (lambda x: torch.view_as_complex(x).abs(), [(3, 2)]),
    "diff": (lambda x: torch.diff(x, dim=1), [S]),
    "diff_n2": (lambda x: torch.diff(x, n=2, dim=1), [S]),
    "cov": (lambda x: torch.cov(x), [S]),
    "corrcoef": (lambda x: torch.corrcoef(x), [S]),
    "trapezoid": (lambda x: torch.trapezoid(x), [S]),
    "cumulative_trapezoid": (lambda x: torch.cumulative_trapezoid(x), [S]),
    "logdet": (lambda x: torch.logdet(x @ x.mT + _EYE), [(3, 3)]),
    "vander": (lambda x: torch.linalg.vander(x), [(3,)]),
    "clamp_tensor_method": (lambda x, y: x.clamp(max=y), [S, S]),
    "addbmm": (lambda x, a, b: torch.addbmm(x, a, b), [S, (2, 3, 5), (2, 5, 4)]),
    "chain_matmul": (lambda a, b, c: torch.linalg.multi_dot([a, b, c]), [(2, 3), (3, 4), (4, 2)]),
    # edge values (zeros, ties, infinities) and more forms
    "norm_at_zero": (lambda x: torch.norm(x - x), [S]),
    "vector_norm_inf_ties": (lambda x: torch.linalg.vector_norm(_ties(x), float("inf"), dim=1), [S]),
    "dist_same": (lambda x: torch.dist(x, x.detach()), [S]),
    "cdist_same": (lambda x: torch.cdist(x, x), [S]),
    "cosine_similarity_zero": (lambda x: F.cosine_similarity(x * 0, x), [S]),
    "amax_ties": (lambda x: _ties(x).amax(1), [S]),
    "max_ties": (lambda x: _ties(x).max(), [S]),
    "median_ties": (lambda x: _ties(x).median(), [S]),
    "sort_ties": (lambda x: _ties(x).sort(1).values, [S]),
    "maximum_ties": (lambda x, y: torch.maximum(_ties(x), _ties(y)), [S, S]),
    "clamp_at_bounds": (lambda x: _ties(x).clamp(-1, 1), [S]),
    "relu_at_zero": (lambda x: F.relu(_ties(x)), [S]),
    "l1_loss_at_zero": (lambda x: F.l1_loss(_ties(x), _ties(x).detach()), [S]),
    "huber_at_delta": (lambda x: F.huber_loss(_ties(x), torch.zeros(3, 4), delta=1.0), [S]),
    "pow_zero_half": (lambda x: torch.pow(x * 0, 0.5), [S]),
    "pow_tensor_zero": (lambda x, y: torch.pow(x * 0, y), [S, S]),
    "log_softmax_inf": (lambda x: F.log_softmax(x.masked_fill(_MASK, float("-inf")), 1), [S]),
    "logsumexp_inf": (lambda x: torch.logsumexp(x.masked_fill(_MASK, float("-inf")), 1), [S]),
    "xlogy_zero": (lambda x, y: torch.xlogy(x * 0, y.abs()), [S, S]),
    "var_constant": (lambda x: (x * 0).var(1), [S]),
    "std_constant": (lambda x: (x * 0 + 1).std(1), [S]),
    "normalize_zero": (lambda x: F.normalize(x * 0, dim=1), [S]),
    "cumprod_zero": (lambda x: (x * (x > 0)).cumprod(1), [S]),
    "atan2_zero": (lambda x, y: torch.atan2(x * 0, y * 0), [S, S]),
    "hypot_zero": (lambda x, y: torch.hypot(x * 0, y * 0), [S, S]),
    "fmax_nan": (lambda x, y: torch.fmax(x.log(), y), [S, S]),
    "logaddexp_inf": (lambda x, y: torch.logaddexp(x.log(), y.log()), [S, S]),
    "softplus_big": (lambda x: F.softplus(x * 30), [S]),
    "nan_to_num_inf": (lambda x: torch.nan_to_num(x / 0, posinf=1.0, neginf=-1.0), [S]),
    "nan_to_num_method": (lambda x: (x.log() / 0).nan_to_num(nan=0.5, neginf=-2.0) * x, [S]),
    "cross_entropy_ignore": (lambda x: F.cross_entropy(x, torch.tensor([0, -100, 2])), [(3, 4)]),
    "nll_loss_weight": (
        lambda x: F.nll_loss(F.log_softmax(x, 1), _I3, weight=torch.tensor([1.0, 2.0, 0.5, 1.0])), [(3, 4)]),
    "embedding_padding_idx": (lambda w: F.embedding(_I34, w, padding_idx=1), [(4, 3)]),
    "embedding_bag_per_sample_weights": (
        lambda w, p: F.embedding_bag(_BAG_IDX, w, _BAG_OFF, mode="sum", per_sample_weights=p), [(5, 3), (6,)]),
    "cumsum_dtype": (lambda x: x.cumsum(1, dtype=torch.float64), [S]),
    "softmax_dtype": (lambda x: torch.softmax(x, 1, dtype=torch.float64), [S]),
    "where_broadcast": (lambda x, y: torch.where(_MASK, x, y), [(1, 4), (3, 1)]),
    "lgamma_negative": (lambda x: torch.lgamma(-x.abs() - 0.5), [S]),
    "svdvals": (lambda x: torch.linalg.svdvals(x), [S]),
    "qr": (lambda x: torch.linalg.qr(x).R, [(4, 3)]),
    "cholesky": (lambda x: torch.linalg.cholesky(x @ x.mT + _EYE), [(3, 3)]),
    "solve": (lambda a, b: torch.linalg.solve(a + 3 * _EYE, b), [(3, 3), (3, 2)]),
    "eigvalsh": (lambda x: torch.linalg.eigvalsh(x + x.mT), [(3, 3)]),
    "pinv": (lambda x: torch.linalg.pinv(x), [S]),
    "matrix_exp": (lambda x: torch.linalg.matrix_exp(x), [(3, 3)]),
    "diff_prepend": (lambda x, y: torch.diff(x, dim=1, prepend=y), [S, (3, 1)]),
    "diff_append_constant": (lambda x: torch.diff(x, append=_TARGET[:, :1]), [S]),
    "ctc_loss": (
        lambda x: F.ctc_loss(F.log_softmax(x, 2), torch.tensor([[1, 2]]), torch.tensor([5]), torch.tensor([2])),
        [(5, 1, 4)]),
}


def _inputs(shapes: list[tuple[int, ...]], seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator).requires_grad_() for shape in shapes]


def _flat(out) -> list:
    if isinstance(out, (tuple, list)):
        return [leaf for item in out for leaf in _flat(item)]
    return [out]


def _run(fn, shapes, call) -> tuple[list, list]:
    """``call(fn)(*inputs)``'s outputs and every input's gradient for a seeded random cotangent of each
    output that requires grad (an exception raised by the backward is returned in place of the gradients)."""
    inputs = [t.detach().clone().requires_grad_() for t in _inputs(shapes)]
    outs = _flat(call(fn)(*inputs))
    generator = torch.Generator().manual_seed(1)
    diff = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    cotangents = [torch.randn(o.shape, generator=generator).to(o.dtype) for o in diff]
    try:
        grads = list(torch.autograd.grad(diff, inputs, cotangents, allow_unused=True)) if diff else []
    except Exception as error:  # noqa: BLE001 - compared with eager's
        grads = [type(error)]
    return outs, grads


def _same(actual, expected) -> str | None:
    """Why ``actual`` is not ``expected`` (a tensor: dtype, shape, bits, ``requires_grad``), or None."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return f"{type(actual).__name__} where eager has a tensor"
        if (actual.dtype, actual.shape) != (expected.dtype, expected.shape):
            return f"{actual.dtype}{list(actual.shape)} where eager has {expected.dtype}{list(expected.shape)}"
        if actual.requires_grad != expected.requires_grad:
            return f"requires_grad={actual.requires_grad} where eager has {expected.requires_grad}"
        if not torch.equal(actual.detach(), expected.detach()) and not (
                actual.is_floating_point() and torch.allclose(actual, expected, 0, 0, equal_nan=True)):
            diff = (actual.detach() - expected.detach()).abs().max().item()
            return f"values differ (max abs {diff:.3g})"
        return None
    if actual != expected:
        return f"{actual!r} where eager has {expected!r}"
    return None


def classify(name: str, executors=None) -> tuple[str, str]:
    """``("OK" | "LOUD" | "SILENT" | "EAGER_FAILS", detail)`` for one program, compiled with ``executors``
    (``None``: stock ``thunder.jit``)."""
    fn, shapes = PROGRAMS[name]
    try:
        expected_outs, expected_grads = _run(fn, shapes, lambda f: f)
    except Exception as error:  # noqa: BLE001
        return "EAGER_FAILS", f"{type(error).__name__}: {error}"
    jit = (lambda f: thunder.jit(f)) if executors is None else (lambda f: thunder.jit(f, executors=executors))
    try:
        outs, grads = _run(fn, shapes, jit)
    except Exception as error:  # noqa: BLE001
        return "LOUD", f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
    if len(outs) != len(expected_outs):
        return "SILENT", f"{len(outs)} outputs where eager has {len(expected_outs)}"
    for i, (actual, expected) in enumerate(zip(outs, expected_outs)):
        if (why := _same(actual, expected)) is not None:
            return "SILENT", f"output {i}: {why}"
    if grads and isinstance(grads[0], type):
        if not (expected_grads and expected_grads[0] is grads[0]):
            return "LOUD", f"the backward raised {grads[0].__name__}"
        return "OK", ""
    if expected_grads and isinstance(expected_grads[0], type):
        return "SILENT", f"the backward ran where eager's raises {expected_grads[0].__name__}"
    for i, (actual, expected) in enumerate(zip(grads, expected_grads, strict=True)):
        if (actual is None) != (expected is None):
            return "SILENT", f"gradient {i}: {actual is None and 'None' or 'a tensor'} where eager's is the other"
        if expected is not None and (why := _same(actual, expected)) is not None:
            return "SILENT", f"gradient {i}: {why}"
    return "OK", ""


#: programs that do not give eager's results under discover() (docs/known-issues.md; stock thunder fails on each
#: in the same way): name -> (status, KI)
KNOWN: dict[str, tuple[str, str]] = {}


@pytest.fixture(scope="module")
def plug():
    return thunderplug.discover(quiet=True)


@pytest.mark.parametrize("name", PROGRAMS)
def test_outputs_and_gradients_are_eagers(name, plug):
    status, detail = classify(name, plug)
    expected, issue = KNOWN.get(name, ("OK", ""))
    assert status == expected, f"{name}: {status} {detail} (expected {expected} {issue})"


#: programs whose values thunder computed otherwise than eager (not only their gradients)
FORWARD_DIFFERED = ("addcmul", "addcmul_broadcast", "group_norm", "group_norm_no_affine", "interpolate_bilinear",
                    "rdiv_number", "pad_reflect", "pad_circular_2d", "pad_replicate_3d", "interpolate_bicubic",
                    "interpolate_area", "interpolate_trilinear", "upsample_module", "avg_pool1d_pad",
                    "avg_pool2d_pad_ceil")


@pytest.mark.parametrize("name", FORWARD_DIFFERED)
def test_values_without_grad_are_eagers(name, plug):
    fn, shapes = PROGRAMS[name]
    inputs = [t.detach() for t in _inputs(shapes)]
    with torch.no_grad():
        assert torch.equal(thunder.jit(fn, executors=plug)(*inputs), fn(*inputs))


def test_traces_run_eagers_functions(plug):
    """The forward runs the torch function, the backward eager's autograd through it, each one operator."""
    jitted = thunder.jit(lambda x, y: torch.var(x, 1) * F.group_norm(y, 2).sum((1, 2)), executors=plug)
    x, y = _inputs([(2, 5), (2, 4, 3)])
    jitted(x, y).sum().backward()
    forward = {b.sym.name for b in thunder.last_traces(jitted)[-1].bound_symbols}
    backward = {b.sym.name for b in thunder.last_backward_traces(jitted)[-1].bound_symbols}
    assert {"eager_var", "eager_group_norm"} <= forward
    assert {"eager_var_backward", "eager_group_norm_backward"} <= backward


def test_constant_pads_stay_thunders(plug):
    """``F.pad`` becomes ``eager_pad`` in discover() compilations; its constant mode is thunder's ``pad`` (fusible)."""
    jitted = thunder.jit(lambda x: F.pad(x, (1, 2)) + F.pad(x, (0, 3), mode="reflect"), executors=plug)
    (x,) = _inputs([(2, 4)])
    jitted(x).sum().backward()
    forward = [b.sym.name for b in thunder.last_traces(jitted)[-1].bound_symbols]
    assert forward.count("eager_pad") == 1 and "pad" in forward
    assert "eager_pad_backward" in {b.sym.name for b in thunder.last_backward_traces(jitted)[-1].bound_symbols}


def main(argv: list[str]) -> None:
    stock = "--stock" in argv
    names = [a for a in argv if not a.startswith("--")] or list(PROGRAMS)
    plug = thunderplug.discover(quiet=True)
    counts: dict[str, int] = {}
    for name in names:
        try:
            status, detail = classify(name, plug)
        except Exception:  # noqa: BLE001
            status, detail = "ERROR", traceback.format_exc().splitlines()[-1]
        counts[status] = counts.get(status, 0) + 1
        line = f"{name:32} {status:7} {detail}"
        if stock:
            stock_status, stock_detail = classify(name)
            line += f"   | stock: {stock_status} {stock_detail[:100]}"
        print(line, flush=True)
    print(counts)


if __name__ == "__main__":
    main(sys.argv[1:])
