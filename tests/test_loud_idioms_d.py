"""Issue 42, loud idioms part D: user autograd.Functions calling ``ctx.mark_non_differentiable`` or returning
several outputs, ``torch.func.functional_call``, ``torch.distributions``, torchvision's focal and GIoU losses and
``Tensor.tolist()`` in forward, each trained 3 AdamW steps under discover() against eager, bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from train_like_eager import train_like_eager


def _batches(*shape: int) -> list[tuple[torch.Tensor]]:
    return [(torch.randn(*shape),) for _ in range(3)]


class _SortWithIndices(torch.autograd.Function):
    """Two outputs: the sorted values (differentiable) and their indices, marked non-differentiable."""

    @staticmethod
    def forward(ctx, x):
        values, indices = x.sort(-1)
        ctx.mark_non_differentiable(indices)
        ctx.save_for_backward(indices)
        return values, indices

    @staticmethod
    def backward(ctx, grad_values, grad_indices):
        (indices,) = ctx.saved_tensors
        return torch.zeros_like(grad_values).scatter(-1, indices, grad_values)


class _SplitScale(torch.autograd.Function):
    """Two differentiable outputs, a scale as a non-tensor argument, both outputs' gradients used."""

    @staticmethod
    def forward(ctx, x, w, scale: float):
        ctx.save_for_backward(x, w)
        ctx.scale = scale
        return x * w * scale, (x + w).tanh()

    @staticmethod
    def backward(ctx, ga, gb):
        x, w = ctx.saved_tensors
        t = (x + w).tanh()
        common = gb * (1 - t * t)
        return ga * w * ctx.scale + common, (ga * x * ctx.scale + common).sum(0), None


class _Clamp(torch.autograd.Function):
    """One output marked non-differentiable: it does not require grad and carries no gradient (eager never calls
    this backward; if it were used, the gradients would be 1000 times others)."""

    @staticmethod
    def forward(ctx, x):
        out = x.clamp(-0.5, 0.5)
        ctx.mark_non_differentiable(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad * 1000


class _FunctionsModel(nn.Module):
    def __init__(self, which: str):
        super().__init__()
        self.which = which
        self.lin = nn.Linear(6, 6)
        self.w = nn.Parameter(torch.rand(6) + 0.5)

    def forward(self, x):
        h = self.lin(x)
        if self.which == "sort":
            values, indices = _SortWithIndices.apply(h)
            return values * self.w, indices
        if self.which == "two_outputs":
            a, b = _SplitScale.apply(h, self.w, 0.5)
            return a * b + a, b
        if self.which == "only_b":
            _, b = _SplitScale.apply(h, self.w, 2.0)
            return b
        clamped = _Clamp.apply(h)
        return h * clamped, clamped


@pytest.mark.parametrize("which", ["sort", "two_outputs", "only_b", "non_differentiable_output"])
def test_autograd_function_variants_train_as_eager(which):
    torch.manual_seed(0)
    train_like_eager(_FunctionsModel(which), _batches(4, 6))


class _MetaLearner(nn.Module):
    """An inner module run with its parameters scaled through functional_call (a MAML-style inner step)."""

    def __init__(self, call):
        super().__init__()
        self.call = call
        self.inner = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
        self.scale = nn.Parameter(torch.tensor(0.9))

    def forward(self, x):
        params = {name: p * self.scale for name, p in self.inner.named_parameters()}
        return self.call(self.inner, params, (x,)) + self.inner(x)


@pytest.mark.parametrize("call", [torch.func.functional_call, torch.nn.utils.stateless.functional_call],
                         ids=["torch.func", "stateless"])
def test_functional_call_trains_as_eager(call):
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="functional_call"):
        train_like_eager(_MetaLearner(call), _batches(4, 6))
