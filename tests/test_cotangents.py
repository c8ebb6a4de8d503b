"""Gradients that arrive with other metadata than a trace guessed: non-contiguous, or plain where
the output was a subclass; and eager's ``x.dtype`` inside jitted code. Each checked against eager."""

from __future__ import annotations

import copy

import pytest
import thunder
import torch
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._pytree import tree_map

import thunderplug


def _discover():
    return thunderplug.discover(quiet=True)


def test_a_transposed_gradient_reaches_a_view_of_a_subclass():
    def f(x):
        return (x.view(2, 6).t() * 2).sum()

    a, b = torch.randn(12), torch.randn(12)
    eager_x = TwoTensor(a.clone(), b.clone()).requires_grad_()
    f(eager_x).backward()
    x = TwoTensor(a.clone(), b.clone()).requires_grad_()
    thunder.jit(f, executors=_discover())(x).backward()
    assert type(x.grad) is TwoTensor
    torch.testing.assert_close(x.grad.a, eager_x.grad.a)
    torch.testing.assert_close(x.grad.b, eager_x.grad.b)


def test_float8_linear_with_a_transposed_output_gradient():
    float8 = pytest.importorskip("torchao.float8")
    torch.manual_seed(0)
    eager = float8.convert_to_float8_training(torch.nn.Sequential(torch.nn.Linear(64, 64)))
    compiled = copy.deepcopy(eager)
    x, w = torch.randn(4, 16, 64), torch.randn(64, 32)
    expected = (eager(x).transpose(0, 1) @ w).sum()
    expected.backward()
    jitted = thunder.jit(compiled, executors=_discover())
    actual = (jitted(x).transpose(0, 1) @ w).sum()
    actual.backward()
    torch.testing.assert_close(actual, expected)
    for mine, theirs in zip(compiled.parameters(), eager.parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad)


class ScaledTensor(torch.Tensor):
    """A wrapper subclass that materializes itself for every op (plain outputs)."""

    @staticmethod
    def __new__(cls, data, scale):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device)

    def __init__(self, data, scale):
        self._data, self._scale = data, scale

    def __tensor_flatten__(self):
        return ["_data", "_scale"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, size, stride):
        return ScaledTensor(inner["_data"], inner["_scale"])

    def materialize(self):
        return self._data * self._scale

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def plain(t):
            return t.materialize() if isinstance(t, ScaledTensor) else t

        return func(*tree_map(plain, args), **tree_map(plain, kwargs or {}))


class Scale(torch.autograd.Function):
    """Builds a subclass in forward; its backward branches on the cotangent's type."""

    @staticmethod
    def forward(ctx, x, s):
        return ScaledTensor(x / s, s)

    @staticmethod
    def backward(ctx, grad):
        return (grad.materialize() if isinstance(grad, ScaledTensor) else grad * 3), None


def test_an_autograd_function_that_builds_a_subclass_sees_eager_cotangents():
    def f(x, s):
        return (Scale.apply(x, s) * torch.arange(12.0).view(3, 4)).sum()

    x, s = torch.randn(3, 4, requires_grad=True), torch.tensor(2.0)
    expected = f(x, s)
    (expected_grad,) = torch.autograd.grad(expected, (x,))
    actual = thunder.jit(f, executors=_discover())(x, s)
    (actual_grad,) = torch.autograd.grad(actual, (x,))
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(actual_grad, expected_grad)  # eager's cotangent is plain: grad * 3


def test_dtype_inside_jitted_code_is_a_torch_dtype():
    def f(x):
        low_precision = x.dtype in (torch.bfloat16, torch.float16)
        return (x * 2 if low_precision else x * 3), x.dtype == torch.float32, x.dtype.is_floating_point

    x = torch.randn(3)
    expected = f(x)
    actual = thunder.jit(f, executors=_discover())(x)
    torch.testing.assert_close(actual[0], expected[0])
    assert actual[1:] == expected[1:] == (True, True)
    bf16 = x.to(torch.bfloat16)
    torch.testing.assert_close(thunder.jit(f, executors=_discover())(bf16)[0], f(bf16)[0])


class Nest(torch.autograd.Function):
    """Forward: a TwoTensor of TwoTensors; backward: whatever nesting the gradient has, as eager passes it."""

    @staticmethod
    def forward(ctx, x):
        return TwoTensor(x.clone(), x * 2)

    @staticmethod
    def backward(ctx, grad):
        return grad.a + grad.b * 2 if isinstance(grad.a, TwoTensor) else grad * 5


class Unnest(torch.autograd.Function):
    """Forward: the sum of the two inner TwoTensors; backward: a gradient one level less nested
    than its input (autograd checks only shape, dtype and device)."""

    @staticmethod
    def forward(ctx, y):
        return y.a + y.b

    @staticmethod
    def backward(ctx, grad):
        return TwoTensor(grad.a * 2, grad.b * 3)


def _leaves(t):
    return [leaf for inner in (t.a, t.b) for leaf in _leaves(inner)] if isinstance(t, TwoTensor) else [t]


def test_a_gradient_with_another_nesting_of_subclasses_than_assumed():
    """``y * 3`` on a TwoTensor of TwoTensors gets a gradient whose inner tensors are plain (as a
    DTensor of Float8TrainingTensor gets a DTensor gradient with a plain local tensor): its
    backward is traced again for that nesting instead of reading plain tensors as TwoTensors."""

    def f(x):
        return Unnest.apply(Nest.apply(x) * 3)

    a, b = torch.randn(3, 4), torch.randn(3, 4)
    runs = []
    for fn in (f, thunder.jit(f, executors=_discover())):
        x = TwoTensor(a.clone(), b.clone()).requires_grad_()
        out = fn(x)
        (grad,) = torch.autograd.grad(out, (x,), TwoTensor(torch.ones(3, 4), torch.full((3, 4), 2.0)))
        runs.append((out, grad))
    (expected, expected_grad), (actual, actual_grad) = runs
    assert [type(t) for t in (actual.a, actual_grad.a)] == [type(t) for t in (expected.a, expected_grad.a)]
    for mine, theirs in zip(_leaves(actual) + _leaves(actual_grad), _leaves(expected) + _leaves(expected_grad)):
        torch.testing.assert_close(mine, theirs, atol=0, rtol=0)
