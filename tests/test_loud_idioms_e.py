"""Issue 42, loud idioms part E: the two-tensor ``torch.max(a, b)`` (torchvision's box losses) trained under
discover() against eager, bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from train_like_eager import train_like_eager


class _PairwiseMax(nn.Module):
    """``torch.max(a, b)`` and ``Tensor.max(b)`` of two layers' outputs, as generalized_box_iou_loss's enclosing
    box (``torch.max(x2, x2g)``); ties (from the clamp) split the gradient between both."""

    def __init__(self, method: bool):
        super().__init__()
        self.method = method
        self.a, self.b = nn.Linear(5, 4), nn.Linear(5, 4)

    def forward(self, x):
        a, b = self.a(x).clamp(max=0.1), self.b(x).clamp(max=0.1)
        out = a.max(b) if self.method else torch.max(a, b)
        return (out * torch.arange(4.0)).sum() + torch.max(a, b.detach()).mean()


@pytest.mark.parametrize("method", [False, True], ids=["torch.max", "Tensor.max"])
def test_two_tensor_max_trains_as_eager(method):
    """Failed on main: aten::max() Expected a value of type 'int' for argument 'dim' (the reduction's rule ran)."""
    torch.manual_seed(0)
    train_like_eager(_PairwiseMax(method), [(torch.randn(6, 5),) for _ in range(3)])
