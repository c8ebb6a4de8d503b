"""One real program: how to build it, whether it trains, and what eager cannot run on CPU."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class Program:
    """What a case builds: a module or function and its inputs, fresh for every run.

    A module that ``trains`` runs ``steps`` optimizer steps on the sum of its outputs; any other
    program runs once, and gradients are taken for every input (and parameter) that requires grad.
    """

    fn: Callable[..., Any]
    inputs: tuple[Any, ...]


@dataclass(frozen=True)
class Case:
    """A named real program.

    ``build`` is called under ``torch.manual_seed(0)`` for each mode, so every mode starts from
    the same values. ``trains`` names the optimizer (``"sgd"`` or ``"adamw"``) or is ``None``.
    ``xfail`` is the root cause of a known discover() failure (the test still runs it, strictly).
    ``loss`` replaces the default training loss (the sum of the outputs) where the program needs a
    dense gradient (torchao's MX backward asserts a contiguous one; ``sum`` gives a broadcast one).
    """

    name: str
    build: Callable[[], Program]
    trains: str | None = None
    steps: int = 3
    tolerance: dict[str, float] = field(default_factory=dict)
    xfail: str | None = None
    cotangent: Callable[[torch.Tensor], torch.Tensor] | None = None
    #: the training loss of one output (default: its sum)
    loss: Callable[[torch.Tensor], torch.Tensor] | None = None


def case(name: str, *, trains: str | None = None, steps: int = 3, xfail: str | None = None, **tolerance: float):
    """Decorator: a function returning a Program becomes a Case of that name."""

    def wrap(build: Callable[[], Program]) -> Case:
        return Case(name, build, trains=trains, steps=steps, tolerance=tolerance, xfail=xfail)

    return wrap
