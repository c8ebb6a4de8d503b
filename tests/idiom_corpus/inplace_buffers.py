"""In-place ops and buffers updated in forward: BatchNorm running statistics, a step counter, an EMA
buffer written under no_grad, in-place activations."""

from __future__ import annotations

import torch
from torch import nn

from .program import Program, idiom


@idiom("BatchNorm2d-running-stats")
def _batchnorm() -> Program:
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 2))
    return Program(model, (torch.randn(3, 2, 4, 4),))


@idiom("BatchNorm1d-eval", train=False)
def _batchnorm_eval() -> Program:
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 2))
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
    return Program(model, (torch.randn(3, 4),))


class _Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("ema", torch.zeros(4))

    def forward(self, x):
        h = self.lin(x)
        self.steps += 1
        with torch.no_grad():
            self.ema.mul_(0.9).add_(h.mean(0), alpha=0.1)
        return h * (1 + self.steps.float() / 10) - self.ema


@idiom("buffers-updated-in-forward")
def _counter() -> Program:
    return Program(_Counter(), (torch.randn(3, 4),))


class _InplaceActivations(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        h = self.a(x)
        h.mul_(2).add_(1)
        h[:, 0] = 0.0
        return self.b(self.act(h))


@idiom("inplace-activations-and-setitem")
def _inplace() -> Program:
    return Program(_InplaceActivations(), (torch.randn(3, 4),))


class _Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        h += self.b(torch.sigmoid(h))
        h.clamp_(min=-0.5)
        return h


@idiom("inplace-residual-add_")
def _residual() -> Program:
    return Program(_Residual(), (torch.randn(3, 4),))
