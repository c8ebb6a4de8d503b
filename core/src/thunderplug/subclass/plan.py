"""What one output of an unrolled op is, recorded from the fake run (AOTAutograd's
``PlainTensorMeta`` / ``SubclassCreationMeta`` in spirit): a plain tensor, a subclass rebuilt
from its inner outputs, or a constant that is not a tensor at all."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from thunderplug.subclass.values import SubclassLayout, subclass_unflatten


@dataclass(frozen=True)
class PlainOutput:
    """A plain tensor: the next leaf of the unrolled graph's outputs."""


@dataclass(frozen=True)
class SubclassOutput:
    """A subclass value rebuilt by ``subclass_unflatten`` from the plans of its inner tensors."""

    layout: SubclassLayout
    inner: tuple[OutputPlan, ...]


@dataclass(frozen=True)
class ConstantOutput:
    """A non-tensor output (a shape, a flag): it is the same for every call with these metadata."""

    value: Any


OutputPlan = PlainOutput | SubclassOutput | ConstantOutput


def plan_of(value: Any) -> OutputPlan:
    if isinstance(value, torch.Tensor):
        if is_traceable_wrapper_subclass(value):
            layout = SubclassLayout.of(value)
            return SubclassOutput(layout, tuple(plan_of(getattr(value, name)) for name in layout.attrs))
        return PlainOutput()
    return ConstantOutput(value)


def tensor_leaves(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors a (possibly nested) subclass value is made of, in flatten order."""
    if is_traceable_wrapper_subclass(tensor):
        attrs, _ = tensor.__tensor_flatten__()
        return [leaf for name in attrs for leaf in tensor_leaves(getattr(tensor, name))]
    return [tensor]


def build(plan: OutputPlan, leaves: Iterator[Any]) -> Any:
    """The trace value for one output, taking its plain leaves from ``leaves`` in order."""
    if isinstance(plan, PlainOutput):
        return next(leaves)
    if isinstance(plan, ConstantOutput):
        return plan.value
    return subclass_unflatten(plan.layout, *[build(inner, leaves) for inner in plan.inner])
