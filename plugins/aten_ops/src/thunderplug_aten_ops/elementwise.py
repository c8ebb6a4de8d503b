"""Elementwise overloads (math, comparisons, bitwise, activations), all broadcast explicitly."""

from __future__ import annotations

import thunder.torch as ltorch
import torch
from thunder import clang
from thunder.core import dtypes, prims, utils

from thunderplug import AtenOp
from thunderplug_aten_ops._broadcast import ALWAYS_BOOL, BOOL_TO_LONG, DEFAULT, INT_TO_FLOAT, elementwise

aten = torch.ops.aten


def _scaled(b, alpha):
    return b if alpha == 1 else elementwise(prims.mul, b, alpha)


def add(a, b, *, alpha=1):
    return elementwise(prims.add, a, _scaled(b, alpha))


def sub(a, b, *, alpha=1):
    return elementwise(prims.sub, a, _scaled(b, alpha))


def mul(a, b):
    return elementwise(prims.mul, a, b)


def div(a, b):
    return elementwise(prims.div, a, b, kind=INT_TO_FLOAT)


def div_mode(a, b, *, rounding_mode=None):
    if rounding_mode is None:
        return div(a, b)
    if rounding_mode == "trunc":
        return elementwise(
            lambda x, y: (
                trunc(prims.div(x, y)) if dtypes.is_inexact_dtype(x.dtype) else ltorch.div(x, y, rounding_mode="trunc")
            ),
            a,
            b,
        )
    return elementwise(lambda x, y: ltorch.div(x, y, rounding_mode=rounding_mode), a, b)


# thunder 0.2.6 has no gradient for prims.trunc/round/remainder/minimum: these are built from
# prims that have one (floor, ceil, fmod, maximum), with ATen's exact values.


def trunc(a):
    if not dtypes.is_inexact_dtype(a.dtype):
        return prims.clone(a)
    return prims.where(clang.ge(a, 0), clang.floor(a), clang.ceil(a))


def round(a):
    """Half to even, like ATen."""
    if not dtypes.is_inexact_dtype(a.dtype):
        return prims.clone(a)
    nearest = clang.floor(clang.add(a, 0.5))
    is_tie = clang.eq(clang.sub(nearest, a), 0.5)
    is_odd = clang.ne(prims.fmod(nearest, clang.full_like(nearest, 2.0)), 0)
    return prims.where(clang.logical_and(is_tie, is_odd), clang.sub(nearest, 1.0), nearest)


def _remainder(a, b):
    """ATen's remainder: fmod, shifted by ``b`` when the signs differ."""
    mod = prims.fmod(a, b)
    shift = clang.logical_and(clang.ne(mod, 0), clang.ne(clang.lt(mod, 0), clang.lt(b, 0)))
    return prims.where(shift, prims.add(mod, b), mod)


def _minimum(a, b):
    if not dtypes.is_inexact_dtype(a.dtype):
        return prims.minimum(a, b)
    return prims.neg(prims.maximum(prims.neg(a), prims.neg(b)))


def pow(a, b):
    return elementwise(prims.pow, a, b, kind=BOOL_TO_LONG)


def atan2(a, b):
    return elementwise(prims.atan2, a, b, kind=INT_TO_FLOAT)


def atan2_out(a, b, *, out):
    """Functional: returns the result in ``out``'s dtype; ``out`` itself is not written."""
    return clang.maybe_convert_to_dtype(atan2(a, b), out.dtype)


def _binary(prim, kind=DEFAULT):
    """``(a, b)`` broadcast and promoted, then ``prim``."""

    def decomposition(a, b):
        return elementwise(prim, a, b, kind=kind)

    decomposition.__name__ = getattr(prim, "name", getattr(prim, "__name__", "binary"))
    return decomposition


#: binary overloads that are one prim (or clang op) after broadcasting:
#: (packet name, overloads, prim, kind, differentiable)
_BINARY = (
    ("fmod", ("Tensor", "Scalar"), prims.fmod, DEFAULT, True),
    ("remainder", ("Tensor", "Scalar"), _remainder, DEFAULT, True),
    ("maximum", ("default",), prims.maximum, DEFAULT, True),
    ("minimum", ("default",), _minimum, DEFAULT, True),
    *(
        (name, ("Tensor", "Scalar"), getattr(prims, name), DEFAULT, False)
        for name in ("bitwise_and", "bitwise_or", "bitwise_xor")
    ),
    *(
        (name, ("Tensor", "Scalar"), getattr(prims, name), ALWAYS_BOOL, False)
        for name in ("eq", "ne", "lt", "le", "gt", "ge")
    ),
    *(
        (name, ("default",), getattr(clang, name), ALWAYS_BOOL, False)
        for name in ("logical_and", "logical_or", "logical_xor")
    ),
)


def where(condition, a, b):
    computation_dtype, result_dtype = utils.elementwise_type_promotion(a, b, type_promotion_kind=DEFAULT)
    condition, a, b = clang.maybe_broadcast(condition, a, b, treat_cpu_scalar_tensors_as_numbers=False)
    a, b = (clang.maybe_convert_to_dtype(x, result_dtype) for x in (a, b))
    return prims.where(condition, a, b)


def _clamp_between(a, low, high):
    """Clamp with torch's promotion; a NaN input stays NaN, and low > high gives high, as in torch."""
    args = [x for x in (a, low, high) if x is not None]
    _, result_dtype = utils.elementwise_type_promotion(*args, type_promotion_kind=DEFAULT)
    args = clang.maybe_broadcast(*args, treat_cpu_scalar_tensors_as_numbers=False)
    args = [clang.maybe_convert_to_dtype(x, result_dtype) for x in args]
    result, rest = args[0], args[1:]
    if low is not None:
        low_, rest = rest[0], rest[1:]
        result = prims.where(clang.lt(result, low_), low_, result)
    if high is not None:
        result = prims.where(clang.gt(result, rest[0]), rest[0], result)
    return result


def clamp(a, min=None, max=None):
    utils.check(min is not None or max is not None, lambda: "clamp: at least one of 'min' or 'max' must not be None")
    return _clamp_between(a, min, max)


def hardtanh(a, min_val=-1, max_val=1):
    return _clamp_between(a, min_val, max_val)


def leaky_relu(a, negative_slope=0.01):
    return prims.where(clang.gt(a, 0), a, prims.mul(a, negative_slope) if negative_slope != 1 else a)


def elu(a, alpha=1, scale=1, input_scale=1):
    negative = clang.mul(clang.expm1(clang.mul(a, input_scale)), alpha * scale)
    return prims.where(clang.gt(a, 0), clang.mul(a, scale), negative)


def fill(a, value):
    if isinstance(value, (int, float, bool, complex)) or not hasattr(value, "shape"):
        return ltorch.full_like(a, value)
    utils.check(
        value.ndim == 0,
        lambda: f"fill only supports 0-dimension value tensor but got tensor with {value.ndim} dimensions.",
    )
    return clang.expand(clang.maybe_convert_to_dtype(value, a.dtype), a.shape)


def ops() -> tuple[AtenOp, ...]:
    """This module's overloads and their decompositions."""
    return (
        AtenOp(aten.add.Tensor, add),
        AtenOp(aten.add.Scalar, add),
        AtenOp(aten.sub.Tensor, sub),
        AtenOp(aten.sub.Scalar, sub),
        AtenOp(aten.mul.Tensor, mul),
        AtenOp(aten.mul.Scalar, mul),
        AtenOp(aten.div.Tensor, div),
        AtenOp(aten.div.Scalar, div),
        AtenOp(aten.div.Tensor_mode, div_mode),
        AtenOp(aten.div.Scalar_mode, div_mode),
        AtenOp(aten.trunc.default, trunc),
        AtenOp(aten.round.default, round),
        AtenOp(aten.pow.Tensor_Tensor, pow),
        AtenOp(aten.pow.Tensor_Scalar, pow),
        AtenOp(aten.pow.Scalar, pow),
        AtenOp(aten.atan2.default, atan2),
        AtenOp(aten.atan2.out, atan2_out),
        AtenOp(aten.where.self, where),
        AtenOp(aten.clamp.default, clamp),
        AtenOp(aten.clamp.Tensor, clamp),
        AtenOp(aten.hardtanh.default, hardtanh),
        AtenOp(aten.leaky_relu.default, leaky_relu),
        AtenOp(aten.elu.default, elu),
        AtenOp(aten.fill.Scalar, fill),
        AtenOp(aten.fill.Tensor, fill),
        *(
            AtenOp(getattr(getattr(aten, name), overload), _binary(prim, kind), differentiable)
            for name, overloads, prim, kind, differentiable in _BINARY
            for overload in overloads
        ),
    )
