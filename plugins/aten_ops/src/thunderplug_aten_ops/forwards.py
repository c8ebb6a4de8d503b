"""Overloads whose decomposition is a thunder.torch function taking the same arguments.

One table row each instead of a function that only forwards its arguments: the overload's
arguments are passed on positionally, then its keyword-only ones by name, with ATen's own
defaults filled in for the ones the call leaves out (ltorch's defaults can differ, e.g.
``sort``'s ``dim``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import thunder.torch as ltorch
import torch

from thunderplug import AtenOp

aten = torch.ops.aten

_UNARY = (
    "abs acos acosh asin asinh atan atanh ceil cos cosh erf exp expm1 floor log log10 log1p log2 neg "
    "reciprocal rsqrt sigmoid sin sinh sqrt tan tanh relu sign"
).split()
_UNARY_NOT_DIFFERENTIABLE = ("bitwise_not", "logical_not", "isnan", "isinf")
_ACTIVATIONS = "mish silu hardswish hardsigmoid softplus celu selu relu6 hardshrink softshrink glu threshold".split()

#: (overload, thunder.torch function)
_FORWARDS = (
    *((getattr(aten, name).default, getattr(ltorch, name)) for name in _UNARY),
    (aten.gelu.default, ltorch.gelu),
    # activations: the ltorch symbols are what the eager_backward_kernels executor differentiates with eager's
    # backward kernels (as unregistered fallbacks their gradients were torch's decompositions: ulps off)
    *((getattr(aten, name).default, getattr(ltorch, name)) for name in _ACTIVATIONS),
    (aten.log_sigmoid.default, ltorch.logsigmoid),
    (aten.linear.default, ltorch.linear),
    (aten.matmul.default, ltorch.matmul),
    (aten._pdist_forward.default, ltorch.pdist),
    (aten._adaptive_avg_pool2d_backward.default, ltorch.adaptive_avg_pool2d_backward),
    (aten.grid_sampler_2d.default, ltorch.grid_sampler_2d),
    (aten.col2im.default, ltorch.fold),
    (aten.cumsum.default, ltorch.cumsum),
    (aten.sort.default, ltorch.sort),
    (aten.topk.default, ltorch.topk),
    (aten.detach.default, ltorch.detach),
    (aten.unsqueeze.default, ltorch.unsqueeze),
    (aten.select.int, ltorch.select),
    (aten.diagonal.default, ltorch.diagonal),
    (aten.scatter.src, ltorch.scatter),
    (aten.scatter.value, ltorch.scatter),
    (aten.scatter_add.default, ltorch.scatter_add),
    (aten.masked_scatter.default, ltorch.masked_scatter),
)
#: the same, for overloads without a derivative (integer or bool results)
_FORWARDS_NOT_DIFFERENTIABLE = (
    *((getattr(aten, name).default, getattr(ltorch, name)) for name in _UNARY_NOT_DIFFERENTIABLE),
    (aten.argmax.default, ltorch.argmax),
    (aten.argmin.default, ltorch.argmin),
)


def forward_to(overload: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A decomposition of ``overload`` that calls ``fn`` with the overload's arguments in schema
    order (ATen's defaults filled in), keyword-only arguments by name."""
    positional = [a for a in overload._schema.arguments if not a.kwarg_only]
    keyword_only = [a for a in overload._schema.arguments if a.kwarg_only]

    def default(argument: Any, kwargs: dict) -> Any:
        if argument.name in kwargs:
            return kwargs.pop(argument.name)
        if not argument.has_default_value():
            raise TypeError(f"{overload}: missing argument {argument.name!r}")
        return argument.default_value

    def decomposition(*args: Any, **kwargs: Any) -> Any:
        kwargs = dict(kwargs)
        full = list(args) + [default(a, kwargs) for a in positional[len(args) :]]
        by_name = {a.name: default(a, kwargs) for a in keyword_only}
        if kwargs:
            raise TypeError(f"{overload}: unexpected arguments {sorted(kwargs)}")
        return fn(*full, **by_name)

    decomposition.__name__ = f"forward_to_{getattr(fn, 'name', getattr(fn, '__name__', 'fn'))}"
    decomposition.forwards_to = fn  # for docs/aten_coverage.md
    return decomposition


def ops() -> tuple[AtenOp, ...]:
    """The table's overloads as AtenOps."""
    return (
        *(AtenOp(overload, forward_to(overload, fn)) for overload, fn in _FORWARDS),
        *(
            AtenOp(overload, forward_to(overload, fn), differentiable=False)
            for overload, fn in _FORWARDS_NOT_DIFFERENTIABLE
        ),
    )
