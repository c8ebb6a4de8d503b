"""One idiom program: a tiny model, its batch and loss, trained a few AdamW steps (or run in eval).

``build`` is called under ``torch.manual_seed(0)`` for every compiler, so each starts from the same
parameters, batch and random stream. The runner compares with eager every loss, gradient, final
parameter and buffer, what the program's hooks record (``model.idiom_record``, a list the runner
empties after each step) and the next number the global random stream gives after training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

#: registry filled by the family modules' ``@idiom`` decorators, in definition order
REGISTRY: list[Idiom] = []


@dataclass(frozen=True)
class Program:
    """A module and its inputs; ``loss`` maps the module's output to the training loss (default:
    the sum of every floating tensor of the output); ``after_backward`` runs between backward and
    the optimizer step (gradient clipping)."""

    model: torch.nn.Module
    inputs: tuple[Any, ...]
    loss: Callable[[Any], torch.Tensor] | None = None
    after_backward: Callable[[torch.nn.Module], None] | None = None


@dataclass(frozen=True)
class Idiom:
    """A named program of one family. ``train=False`` runs it ``steps`` times under ``no_grad`` in
    eval mode (inference fast paths). ``tolerance`` (``atol``/``rtol``) is allowed only with a
    ``why``; ``heavy`` programs run only with ``THUNDERPLUG_IDIOMS_HEAVY=1``."""

    name: str
    family: str
    build: Callable[[], Program]
    train: bool = True
    steps: int = 3
    tolerance: dict[str, float] = field(default_factory=dict)
    why: str = ""
    heavy: bool = False


def idiom(name: str, *, train: bool = True, steps: int = 3, heavy: bool = False, why: str = "", **tolerance: float):
    """Decorator: a function returning a Program becomes a registered Idiom named ``family/name``."""
    if tolerance and not why:
        raise ValueError(f"idiom {name!r}: a tolerance needs a reason (why=...)")

    def wrap(build: Callable[[], Program]) -> Idiom:
        family = build.__module__.rsplit(".", 1)[-1]
        entry = Idiom(f"{family}/{name}", family, build, train, steps, tolerance, why, heavy)
        REGISTRY.append(entry)
        return entry

    return wrap
