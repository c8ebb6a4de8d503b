"""Mixed precision written inside forward: torch.autocast("cpu", bfloat16), and its disabled region."""

from __future__ import annotations

import torch
from torch import nn

from .program import Program, idiom


class _AutocastInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = torch.relu(self.a(x))
            out = self.b(h)
        return out.float()


@idiom("autocast-cpu-bfloat16-in-forward")
def _autocast() -> Program:
    return Program(_AutocastInForward(), (torch.randn(4, 8),))


class _AutocastDisabled(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = self.a(x)
            with torch.autocast("cpu", enabled=False):
                h = torch.softmax(h.float(), -1)
            return self.b(h).float()


@idiom("autocast-nested-disabled-region")
def _autocast_disabled() -> Program:
    return Program(_AutocastDisabled(), (torch.randn(4, 8),))
