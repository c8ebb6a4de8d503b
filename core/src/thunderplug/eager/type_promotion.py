"""The result dtype of elementwise ops mixing tensors with dimensions, 0-dim tensors and Python numbers,
as eager's ``torch.result_type`` gives it (wired in by the patch "elementwise type promotion", in
``discover()`` compilations only).

Eager's rule sorts dtypes into categories, bool < integer < floating < complex, and the arguments into
three groups: tensors with a dimension, 0-dim tensors, Python numbers. Within a group the dtypes are
promoted (``torch.promote_types``; a number counts as bool, int64, float32 or complex64). A group
further down the list (0-dim tensors below dimensioned ones, numbers below both) changes the result only
where its category is higher: then its dtype wins, except that a complex one above a floating one gives
the complex dtype of that floating precision (a float16 tensor times a 0-dim complex128 one is
complex32).

thunder 0.2.6 reads that grouping from a tensor proxy's ``true_dtype``: "weak" stands for 0-dim. But
the weak flag is copied, not recomputed, into proxies of other shapes (``flatten`` of a 0-dim tensor,
the result of an int tensor times ``2.5``), which then lose to 0-dim tensors (a float32 ``(1,)`` tensor
times a 0-dim float64 one was float64 in the trace; under grad the cast ran, so the value was float64
too: KI-8). Its lattice also departs from eager's on its own: a bool tensor plus ``2`` is int8, uint8
with a 0-dim int8 tensor is int16, two 0-dim tensors float64 and complex64 give complex64. Here the
groups come from the proxies' shapes and the rule is eager's.

What thunder's type promotion kinds do with the promoted dtype is kept (its computation dtypes, the
``INT_TO_FLOAT`` ... variants), and so is its answer when every argument is a number, and its Python
number types where a number decides the result (thunder turns those into the dtype eager gives).
"""

from __future__ import annotations

from collections.abc import Callable
from numbers import Number
from typing import Any

import torch
from thunder.core import dtypes, utils
from thunder.core.proxies import NumberProxy, TensorProxy

_KIND = utils.ELEMENTWISE_TYPE_PROMOTION_KIND
_PYTHON_TYPES = (bool, int, float, complex)  # by category
_NUMBER_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float32, complex: torch.complex64}
_COMPLEX_OF = {
    torch.float16: torch.complex32,
    torch.bfloat16: torch.complex64,
    torch.float32: torch.complex64,
    torch.float64: torch.complex128,
}


def category(dtype: torch.dtype) -> int:
    """0 bool, 1 integer, 2 floating, 3 complex."""
    if dtype.is_complex:
        return 3
    if dtype.is_floating_point:
        return 2
    return 0 if dtype is torch.bool else 1


def _promoted(dtypes_: list[torch.dtype]) -> torch.dtype | None:
    result = None
    for dtype in dtypes_:
        result = dtype if result is None else torch.promote_types(result, dtype)
    return result


def _below(upper: torch.dtype | None, lower: torch.dtype | None) -> torch.dtype | None:
    """The result of a group (``upper``) and the groups below it (``lower``, already combined)."""
    if upper is None or lower is None:
        return lower if upper is None else upper
    if category(lower) <= category(upper):
        return upper
    if category(upper) == 2:  # and lower is complex
        return _COMPLEX_OF[upper]
    return lower


def eager_result_dtype(args: tuple) -> Any:
    """The promotion dtype of ``args`` (tensor proxies and numbers, at least one tensor) by eager's rule, as
    thunder states it: a thunder dtype, weak if no argument has a dimension, or the Python type of the
    numbers when they decide it."""
    with_dims, zero_dim, numbers = [], [], []
    for a in args:
        if isinstance(a, TensorProxy):
            strong = dtypes.to_torch_dtype(dtypes.to_strong_dtype(a.dtype))
            (with_dims if a.ndim else zero_dim).append(strong)
        else:
            numbers.append(dtypes.to_dtype(a))
    number_type = max(numbers, key=_PYTHON_TYPES.index) if numbers else None
    tensors = _below(_promoted(with_dims), _promoted(zero_dim))
    if number_type is not None and _PYTHON_TYPES.index(number_type) > category(tensors):
        if category(tensors) != 2 or number_type is not complex:
            return number_type
    result = dtypes.to_dtype(_below(tensors, None if number_type is None else _NUMBER_DTYPES[number_type]))
    return result if with_dims else dtypes.to_weak_dtype(result)


def _by_kind(promoted: Any, kind: Any) -> tuple[Any, Any]:
    """thunder's (computation dtype, result dtype) for a promotion dtype and a type promotion kind, for
    arguments that are not all numbers (``NUMBER_TO_INT`` changes only those)."""
    if kind is _KIND.PRESERVE:
        return promoted, promoted
    if kind is _KIND.ALWAYS_BOOL:
        return promoted, bool
    if kind is _KIND.INT_TO_FLOAT and dtypes.is_integer_dtype(promoted):
        return float, float
    if kind is _KIND.BOOL_TO_LONG and dtypes.is_boolean_dtype(promoted):
        return int, int
    computation = utils.get_computation_dtype(promoted)
    if kind is _KIND.COMPLEX_TO_FLOAT and dtypes.is_complex_dtype(promoted):
        return computation, dtypes.corresponding_real_dtype(promoted)
    return computation, promoted


def eager_elementwise_type_promotion(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """``utils.elementwise_type_promotion`` with eager's promotion dtype (:func:`eager_result_dtype`) where
    ``active()`` and a tensor is among the arguments; thunder's own otherwise."""

    def elementwise_type_promotion(*args: Any, type_promotion_kind: Any) -> tuple[Any, Any]:
        if not active() or not any(isinstance(a, TensorProxy) for a in args):
            return original(*args, type_promotion_kind=type_promotion_kind)
        if not all(isinstance(a, TensorProxy | Number | NumberProxy) for a in args):
            return original(*args, type_promotion_kind=type_promotion_kind)  # thunder's own error
        return _by_kind(eager_result_dtype(args), type_promotion_kind)

    elementwise_type_promotion.__wrapped__ = original
    return elementwise_type_promotion

