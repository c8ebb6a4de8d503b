"""Elementwise helpers that broadcast explicitly.

thunder's clang treats 0-dim CPU tensors like numbers and leaves them implicitly broadcast, and
thunder 0.2.6's prim grad rules then never reduce their cotangents (wrong gradients for
``x + x.sum()``). Every ATen decomposition here expands operands to the common shape first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from thunder import clang
from thunder.core import utils

DEFAULT = utils.ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
INT_TO_FLOAT = utils.ELEMENTWISE_TYPE_PROMOTION_KIND.INT_TO_FLOAT
ALWAYS_BOOL = utils.ELEMENTWISE_TYPE_PROMOTION_KIND.ALWAYS_BOOL
BOOL_TO_LONG = utils.ELEMENTWISE_TYPE_PROMOTION_KIND.BOOL_TO_LONG


def elementwise(prim: Callable[..., Any], *args: Any, kind: utils.ELEMENTWISE_TYPE_PROMOTION_KIND = DEFAULT) -> Any:
    """Apply ``prim`` with torch's type promotion and explicit broadcasting of every tensor."""
    computation_dtype, result_dtype = utils.elementwise_type_promotion(*args, type_promotion_kind=kind)
    args = clang.maybe_broadcast(*args, treat_cpu_scalar_tensors_as_numbers=False)
    args = [clang.maybe_convert_to_dtype(a, computation_dtype) for a in args]
    return clang.maybe_convert_to_dtype(prim(*args), result_dtype)
