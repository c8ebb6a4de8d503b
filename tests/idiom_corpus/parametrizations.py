"""torch.nn.utils.parametrizations and a user parametrization."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrizations, parametrize

from .program import Program, idiom


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 3))


@idiom("weight_norm")
def _weight_norm() -> Program:
    model = _mlp()
    parametrizations.weight_norm(model[0])
    return Program(model, (torch.randn(4, 6),))


@idiom("spectral_norm")
def _spectral_norm() -> Program:
    model = _mlp()
    parametrizations.spectral_norm(model[0])
    return Program(model, (torch.randn(4, 6),))


@idiom("orthogonal")
def _orthogonal() -> Program:
    model = _mlp()
    parametrizations.orthogonal(model[0])
    return Program(model, (torch.randn(4, 6),))


class _Symmetric(nn.Module):
    def forward(self, w):
        return w.triu() + w.triu(1).transpose(0, 1)


@idiom("register_parametrization-symmetric")
def _symmetric() -> Program:
    model = _mlp()
    parametrize.register_parametrization(model[0], "weight", _Symmetric())
    return Program(model, (torch.randn(4, 6),))
