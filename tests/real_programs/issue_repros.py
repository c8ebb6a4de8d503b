"""The repros of issue 12 items 3 and 4: cotangents with other metadata than guessed, and an
``autograd.Function`` whose forward builds a subclass and whose backward materializes it."""

from __future__ import annotations

import torch
from torch.testing._internal.two_tensor import TwoTensor

from real_programs.case import Case, Program, case


@case("item3/TwoTensor-view-t-backward")
def _view_t() -> Program:
    def fn(x):
        return (x.view(2, 6).t() * 2).sum()

    return Program(fn, (TwoTensor(torch.randn(12), torch.randn(12)).requires_grad_(True),))


@case("item3/float8-linear-transposed-output-backward", trains="sgd")
def _float8_transposed() -> Program:
    from torchao.float8 import convert_to_float8_training

    class Transposed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = convert_to_float8_training(torch.nn.Sequential(torch.nn.Linear(64, 64)))
            self.w = torch.nn.Parameter(torch.randn(64, 32))

        def forward(self, x):
            return self.inner(x).transpose(0, 1) @ self.w

    return Program(Transposed(), (torch.randn(4, 16, 64),))


class Scaled(torch.Tensor):
    """``data * scale`` with a plain-float scale in the flatten context (the issue's ScaledTensor)."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, scale: float):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device)

    def __init__(self, data: torch.Tensor, scale: float):
        self.data_, self.scale = data, scale

    def __tensor_flatten__(self):
        return ["data_"], {"scale": self.scale}

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return Scaled(inner["data_"], ctx["scale"])

    def materialize(self) -> torch.Tensor:
        return self.data_ * self.scale

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda a: a.materialize() if isinstance(a, Scaled) else a  # noqa: E731
        return func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})


class _MakeScaled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, s):
        return Scaled(x / s, s)

    @staticmethod
    def backward(ctx, g):
        return (g.materialize() if isinstance(g, Scaled) else g), None


@case("item4/Function-builds-subclass-backward-materializes")
def _function_builds_subclass() -> Program:
    def fn(x):
        return _MakeScaled.apply(x, 4.0).sum()

    return Program(fn, (torch.randn(3, 5, requires_grad=True),))


@case("item4/Function-builds-subclass-then-matmul")
def _function_builds_subclass_matmul() -> Program:
    def fn(x, w):
        return (_MakeScaled.apply(x, 2.0) @ w).tanh()

    return Program(fn, (torch.randn(3, 5, requires_grad=True), torch.randn(5, 2, requires_grad=True)))


CASES: list[Case] = [_view_t, _float8_transposed, _function_builds_subclass, _function_builds_subclass_matmul]
