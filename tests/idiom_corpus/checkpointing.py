"""Activation checkpointing: torch.utils.checkpoint in both forms, checkpoint_sequential."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from .program import Program, idiom


class _Checkpointed(nn.Module):
    def __init__(self, reentrant: bool):
        super().__init__()
        self.reentrant = reentrant
        self.inner = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = checkpoint(self.inner, x, use_reentrant=self.reentrant)
        return self.head(torch.tanh(h))


@idiom("checkpoint-use_reentrant-True")
def _reentrant() -> Program:
    return Program(_Checkpointed(True), (torch.randn(5, 8, requires_grad=True),))


@idiom("checkpoint-use_reentrant-False")
def _non_reentrant() -> Program:
    return Program(_Checkpointed(False), (torch.randn(5, 8),))


class _Sequential(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.SiLU()) for _ in range(4)])

    def forward(self, x):
        return checkpoint_sequential(self.layers, 2, x, use_reentrant=False)


@idiom("checkpoint_sequential")
def _sequential() -> Program:
    return Program(_Sequential(), (torch.randn(3, 8),))
