"""Issue 42: recurrent layers and parametrizations under discover() as in eager, bit for bit, over 3 AdamW steps
(losses, outputs, gradients, final parameters and buffers), in train and in eval mode.

``nn.LSTMCell`` in a Python loop: thunder's autodiff put no gradient to the tensors of a tuple argument (the
previous step's ``(h, c)`` of ``torch.lstm_cell``), so the earlier steps got none, silently
(``wiring.fixes.nested_argument_grads``).
"""

from __future__ import annotations

import pytest
import thunder
import torch
from torch import nn
from train_like_eager import random_inputs, train_like_eager

import thunderplug


class _LSTMCellLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(4, 6)
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        h = c = x.new_zeros(x.shape[0], 6)
        for t in range(x.shape[1]):
            h, c = self.cell(x[:, t], (h, c))
        return self.head(h)


PROGRAMS = {
    "LSTMCell-loop": (_LSTMCellLoop, (3, 5, 4)),
}


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_equals_eager(name: str, mode: str) -> None:
    build, shape = PROGRAMS[name]
    torch.manual_seed(0)
    model = build()
    model.train(mode == "train")
    train_like_eager(model, random_inputs(*shape), check_rng=True)


def test_lstm_cell_steps_get_gradients() -> None:
    """Each step's share of the weights' gradient arrives: a gradient reaches the first step's input."""
    torch.manual_seed(0)
    cell = nn.LSTMCell(4, 6)
    x = torch.randn(3, 4, 4, requires_grad=True)

    def steps(x):
        h = c = x.new_zeros(3, 6)
        for t in range(x.shape[1]):
            h, c = cell(x[:, t], (h, c))
        return h

    steps(x).sum().backward()
    expected = x.grad.clone()
    x.grad = None
    thunder.jit(steps, executors=thunderplug.discover())(x).sum().backward()
    assert expected[:, 0].abs().sum() > 0
    torch.testing.assert_close(x.grad, expected, rtol=0, atol=0)
