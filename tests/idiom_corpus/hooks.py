"""Hooks: module backward hooks, tensor hooks registered inside forward, forward (pre-)hooks."""

from __future__ import annotations

import torch
from torch import nn

from .program import Program, idiom


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


@idiom("register_full_backward_hook")
def _full_backward_hook() -> Program:
    model = _mlp()
    model.idiom_record = []

    def hook(module, grad_input, grad_output):
        model.idiom_record.append(grad_output[0].detach().clone())
        return (grad_input[0] * 0.5,)

    model[2].register_full_backward_hook(hook)
    return Program(model, (torch.randn(4, 6),))


class _TensorHookInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 3)
        self.idiom_record = []

    def forward(self, x):
        h = torch.relu(self.a(x))
        if h.requires_grad:
            h.register_hook(lambda g: self.idiom_record.append(g.detach().clone()))
            h.register_hook(lambda g: g.clamp(-0.1, 0.1))
        return self.b(h)


@idiom("tensor.register_hook-in-forward")
def _tensor_hook() -> Program:
    return Program(_TensorHookInForward(), (torch.randn(4, 6),))


@idiom("parameter.register_hook-outside")
def _parameter_hook() -> Program:
    model = _mlp()
    model[0].weight.register_hook(lambda g: g * 2)
    return Program(model, (torch.randn(4, 6),))


@idiom("register_forward_hook-modifies-output")
def _forward_hook() -> Program:
    model = _mlp()
    model.idiom_record = []

    def hook(module, args, output):
        model.idiom_record.append(output.detach().clone())
        return output * 2

    model[1].register_forward_hook(hook)
    return Program(model, (torch.randn(4, 6),))


@idiom("register_forward_pre_hook")
def _forward_pre_hook() -> Program:
    model = _mlp()
    model[0].register_forward_pre_hook(lambda module, args: (args[0] - args[0].mean(0),))
    return Program(model, (torch.randn(4, 6),))
