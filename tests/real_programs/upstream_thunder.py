"""The programs of upstream thunder's unmerged subclass PRs (``thunder/tests/test_tensor_subclass.py``,
its versions), re-created: a subclass holding a tensor and a one-element scale tensor, either
closed under its ops or returning plain tensors, built directly, through ``autograd.Function``s,
and a float8 MLP trained with AdamW. Upstream expected several of these to raise (conversion
inside the function, the float8 MLP); eager runs them all, so they must pass."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from real_programs.case import Case, Program, case


class _ScaleBase(torch.Tensor):
    """``x`` and a one-element ``scale``, both inner tensors; floating ops see ``x * scale``."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, x: torch.Tensor, scale: torch.Tensor):
        if scale.numel() != 1:
            raise ValueError(f"scale must have one element, got {tuple(scale.shape)}")
        return torch.Tensor._make_wrapper_subclass(
            cls, x.size(), dtype=x.dtype, device=x.device, requires_grad=x.requires_grad
        )

    def __init__(self, x: torch.Tensor, scale: torch.Tensor):
        self._x, self._scale = x, scale

    def __tensor_flatten__(self) -> tuple[list[str], dict[str, Any]]:
        return ["_x", "_scale"], {}

    @classmethod
    def __tensor_unflatten__(cls, inner, ctx, outer_size, outer_stride):
        return cls(inner["_x"], inner["_scale"])

    @classmethod
    def from_tensor(cls, x: torch.Tensor):
        return cls(x, x.abs().max())

    @classmethod
    def _run(cls, func, args, kwargs):
        def value(t):
            if isinstance(t, _ScaleBase):
                return t._x * t._scale if t.is_floating_point() else t._x
            return t

        scales = [t._scale for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, _ScaleBase)]
        plain_args, plain_kwargs = pytree.tree_map(value, (args, kwargs or {}))
        return func(*plain_args, **plain_kwargs), scales[0]


class ClosedScale(_ScaleBase):
    """Every tensor result is wrapped again with the first argument's scale."""

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        out, scale = cls._run(func, args, kwargs)
        return ClosedScale(out, scale) if isinstance(out, torch.Tensor) else out


class PlainOutScale(_ScaleBase):
    """Every result is a plain tensor."""

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return cls._run(func, args, kwargs)[0]


class _FromTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return ClosedScale.from_tensor(x)

    @staticmethod
    def backward(ctx, g):
        return g


class _Encapsulate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        return PlainOutScale(x, scale)

    @staticmethod
    def backward(ctx, g):
        return g, None


def _closed(*shape, requires_grad=False):
    return ClosedScale.from_tensor(torch.randn(*shape, requires_grad=requires_grad))


def _add(a, b):
    return a + b


@case("upstream/closed-scale/one-subclass-input")
def _one_input() -> Program:
    return Program(_add, (_closed(2, 2), torch.randn(2, 2)))


@case("upstream/closed-scale/two-subclass-inputs")
def _two_inputs() -> Program:
    return Program(_add, (_closed(2, 2), _closed(2, 2)))


@case("upstream/closed-scale/conversion-inside-function(upstream: raises)")
def _conversion() -> Program:
    def fn(a, b, c):
        return _FromTensor.apply(a + b) - c

    return Program(fn, (torch.randn(2, 2, requires_grad=True), torch.randn(2, 2, requires_grad=True), _closed(2, 2)))


@case("upstream/constructor-inside-function")
def _constructor() -> Program:
    def fn(x, scale):
        y = PlainOutScale(x, scale)
        return PlainOutScale(y._x, y._scale), y

    return Program(fn, (torch.randn(2, 2), torch.randn(())))


@case("upstream/Function-builds-subclass")
def _function_builds() -> Program:
    def fn(x, scale, z):
        return _Encapsulate.apply(x, scale), _FromTensor.apply(z)

    return Program(fn, (torch.randn(2, 2), torch.randn(()), torch.randn(2, 2)))


def _plain_out(*shape):
    # as upstream: the inner tensor itself requires grad, so the subclass does too
    return PlainOutScale(torch.randn(*shape, requires_grad=True), torch.randn(()))


@case("upstream/plain-out-scale/add/fwd+bwd")
def _simple_math() -> Program:
    return Program(lambda x, y: (x + y).mean(), (_plain_out(2, 2), _plain_out(2, 2)))


@case("upstream/plain-out-scale/Function+add/fwd+bwd")
def _function_math() -> Program:
    def fn(x, data, scale):
        return (x + _Encapsulate.apply(data, scale)).mean()

    return Program(fn, (_plain_out(2, 2), torch.randn(2, 2, requires_grad=True), torch.randn(())))


def _float8_mlp(dtype: torch.dtype):
    def build() -> Program:
        from torchao.float8 import convert_to_float8_training

        model = torch.nn.Sequential(
            torch.nn.Linear(64, 32), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(32, 16)
        ).to(dtype)
        return Program(convert_to_float8_training(model), (torch.randn(16, 64, dtype=dtype, requires_grad=True),))

    return build


CASES: list[Case] = [
    _one_input,
    _two_inputs,
    _conversion,
    _constructor,
    _function_builds,
    _simple_math,
    _function_math,
    Case("upstream/float8-mlp/fp32/adamw(upstream: raises)", _float8_mlp(torch.float32), trains="adamw", steps=2),
    Case("upstream/float8-mlp/bf16/adamw(upstream: raises)", _float8_mlp(torch.bfloat16), trains="adamw", steps=2),
]
