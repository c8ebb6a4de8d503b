"""Random ops in forward, which must draw eager's numbers from eager's stream: dropout in train
mode, stochastic depth (bernoulli_), Gaussian noise, randperm token shuffling."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .program import Program, idiom


@idiom("nn.Dropout-train")
def _dropout() -> Program:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 4))
    return Program(model, (torch.randn(6, 8),))


class _FunctionalDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        return self.b(F.dropout(torch.relu(self.a(x)), p=0.25, training=self.training))


@idiom("F.dropout-training")
def _functional_dropout() -> Program:
    return Program(_FunctionalDropout(), (torch.randn(6, 8),))


class _StochasticDepth(nn.Module):
    """A residual block dropped per sample with bernoulli_ (timm's/torchvision's drop_path)."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        self.p = p
        self.block = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))

    def forward(self, x):
        keep = 1 - self.p
        mask = x.new_empty(x.shape[0], 1).bernoulli_(keep)
        return x + self.block(x) * mask / keep


@idiom("stochastic-depth-bernoulli_")
def _stochastic_depth() -> Program:
    return Program(_StochasticDepth(), (torch.randn(6, 8),))


class _Noise(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        return self.lin(x + 0.1 * torch.randn_like(x))


@idiom("randn_like-noise")
def _noise() -> Program:
    return Program(_Noise(), (torch.randn(6, 8),))


class _Shuffle(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        return self.lin(x[torch.randperm(x.shape[0])][:3])


@idiom("randperm-subsample")
def _shuffle() -> Program:
    return Program(_Shuffle(), (torch.randn(6, 8),))
