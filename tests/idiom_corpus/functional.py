"""Functional and structured idioms: torch.func.functional_call, dataclass / NamedTuple / dict outputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn
from torch.func import functional_call

from .program import Program, idiom


class _FunctionalCall(nn.Module):
    """Runs an inner module with its parameters scaled, through functional_call (meta-learning style)."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
        self.scale = nn.Parameter(torch.tensor(0.9))

    def forward(self, x):
        params = {name: p * self.scale for name, p in self.inner.named_parameters()}
        return functional_call(self.inner, params, (x,))


@idiom("torch.func.functional_call")
def _functional_call() -> Program:
    return Program(_FunctionalCall(), (torch.randn(3, 4),))


@dataclass
class _Output:
    logits: torch.Tensor
    hidden: torch.Tensor
    aux: float


class _DataclassOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        return _Output(self.b(h), h, 0.5)


@idiom("dataclass-output")
def _dataclass() -> Program:
    loss = lambda out: out.logits.sum() + out.aux * out.hidden.sum()  # noqa: E731
    return Program(_DataclassOut(), (torch.randn(3, 4),), loss=loss)


class _Pair(NamedTuple):
    logits: torch.Tensor
    features: torch.Tensor


class _NamedTupleOut(_DataclassOut):
    def forward(self, x):
        h = torch.tanh(self.a(x))
        return _Pair(self.b(h), h)


@idiom("NamedTuple-output")
def _namedtuple() -> Program:
    return Program(_NamedTupleOut(), (torch.randn(3, 4),), loss=lambda out: out.logits.sum() - out.features.mean())


class _DictOut(_DataclassOut):
    def forward(self, batch):
        h = torch.tanh(self.a(batch["x"]))
        return {"loss": ((self.b(h) - batch["y"]) ** 2).mean(), "hidden": h}


@idiom("dict-input-and-output")
def _dict() -> Program:
    return Program(_DictOut(), ({"x": torch.randn(3, 4), "y": torch.randn(3, 2)},), loss=lambda out: out["loss"])
