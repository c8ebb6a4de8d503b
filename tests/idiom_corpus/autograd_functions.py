"""User torch.autograd.Function subclasses, the way people write their first custom op."""

from __future__ import annotations

import torch
from torch import nn

from .program import Program, idiom


class _ScaledClamp(torch.autograd.Function):
    """A straight-through clamp with a non-tensor scale and mode, using ctx.needs_input_grad."""

    @staticmethod
    def forward(ctx, x, weight, scale: float, mode: str):
        ctx.save_for_backward(x, weight)
        ctx.scale, ctx.mode = scale, mode
        return (x * weight).clamp(-1, 1) * scale

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        gx = gw = None
        if ctx.needs_input_grad[0]:
            gx = grad * weight * ctx.scale
        if ctx.needs_input_grad[1]:
            gw = (grad * x * ctx.scale).sum(0) if ctx.mode == "sum" else (grad * x).mean(0)
        return gx, gw, None, None


class _UsesFunction(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 6)
        self.weight = nn.Parameter(torch.rand(6) + 0.5)

    def forward(self, x):
        return _ScaledClamp.apply(self.proj(x), self.weight, 0.5, "sum")


@idiom("needs_input_grad-non-tensor-args")
def _needs_input_grad() -> Program:
    return Program(_UsesFunction(), (torch.randn(4, 6),))


class _Swish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        s = torch.sigmoid(x)
        ctx.save_for_backward(x, s)
        return x * s

    @staticmethod
    def backward(ctx, grad):
        x, s = ctx.saved_tensors
        return grad * (s * (1 + x * (1 - s)))


class _SwishMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 12), nn.Linear(12, 3)

    def forward(self, x):
        return self.b(_Swish.apply(self.a(x)))


@idiom("save_for_backward-swish")
def _swish() -> Program:
    return Program(_SwishMLP(), (torch.randn(4, 6),))


class _RoundSTE(torch.autograd.Function):
    """Round in forward, identity gradient (quantization-aware training's straight-through estimator)."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx, grad):
        return grad


class _STE(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        return self.lin(_RoundSTE.apply(x) + _RoundSTE.apply(self.lin.weight).sum(0))


@idiom("straight-through-estimator")
def _ste() -> Program:
    return Program(_STE(), (torch.randn(4, 6),))
