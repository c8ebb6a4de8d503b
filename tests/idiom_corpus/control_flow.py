"""Python control flow on tensor values: ``.item()`` branches, a tensor cast to bool, ``.tolist()``.

The batches are chosen so that the branch taken changes between steps (the parameters move, or the
batch does): a compiler that bakes in the first call's branch computes other values."""

from __future__ import annotations

import torch
from torch import nn

from .program import Program, idiom


class _ItemBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.bias = nn.Parameter(torch.tensor(0.05))

    def forward(self, x):
        h = self.lin(x) + self.bias
        if h.sum().item() > 0:
            return h * 2
        return -h


@idiom("item-branch")
def _item() -> Program:
    # h.sum() starts at +0.08; each AdamW step moves it across 0, so the branch alternates
    model = _ItemBranch()
    with torch.no_grad():
        model.bias.fill_(-(model.lin(torch.ones(2, 4)).sum() / 8).item() + 0.01)
    return Program(model, (torch.ones(2, 4),))


class _BoolBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = self.lin(x * (-1) ** self.calls)
        if (h > 0).any() and h.mean() > 0:
            return h.relu()
        return h.abs()


@idiom("tensor-bool-cast-branch")
def _bool() -> Program:
    return Program(_BoolBranch(), (torch.randn(3, 4),))


class _ToList(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, counts):
        parts = torch.split(self.lin(x), counts.tolist())
        return torch.stack([p.mean(0) for p in parts])


@idiom("tolist-split-sizes")
def _tolist() -> Program:
    return Program(_ToList(), (torch.randn(6, 4), torch.tensor([1, 3, 2])))


class _WhileLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        steps = 0
        while h.norm() > 1.0 and steps < 10:
            h = h / 2
            steps += 1
        return h


@idiom("while-norm-loop")
def _while() -> Program:
    return Program(_WhileLoop(), (torch.randn(3, 4) * 3,))
