"""Facts about one compilation belong to that compilation: explain() and error messages of one
function are never about another function compiled later."""

from __future__ import annotations

import inspect

import pytest
import thunder
import torch
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._pytree import tree_map

import thunderplug
from thunderplug import SubclassOpClaim, hookimpl
from thunderplug.commands.explain import explain
from thunderplug.tracing.compilation import record_of


class DeclinesShapeThree:
    """Claims ``TwoTensor.torch.mul`` except for tensors of 3 elements."""

    @hookimpl
    def register_claims(self, register):
        register(
            SubclassOpClaim(
                executor="mul_claim",
                target="TwoTensor.torch.mul",
                checker=lambda a, b: "3 elements" if a.shape[0] == 3 else None,
                forward=lambda a, b: torch.mul(a, b),
                backward=lambda a, b, grad: (grad * b, None),
            )
        )


def test_explain_shows_each_function_its_own_decisions(register_plugin):
    register_plugin(DeclinesShapeThree(), "mul_claim")
    executors = thunderplug.discover(quiet=True)

    def f(x):
        return x * 2

    def g(x):
        return x * 2

    jf, jg = thunder.jit(f, executors=executors), thunder.jit(g, executors=executors)
    jf(TwoTensor(torch.randn(3), torch.randn(3)))
    jg(TwoTensor(torch.randn(4), torch.randn(4)))
    f_rows = [row for row in explain(jf) if row.op == "TwoTensor.torch.mul"]
    g_rows = [row for row in explain(jg) if row.op == "TwoTensor.torch.mul"]
    assert f_rows and g_rows
    assert f_rows[0].executor.startswith("thunderplug") and f_rows[0].declined == ("mul_claim: 3 elements",)
    assert g_rows[0].executor == "mul_claim" and g_rows[0].declined == ()
    assert {d.reason for d in record_of(jf).decisions} == {"3 elements"}
    assert {d.reason for d in record_of(jg).decisions} == {None}


class NoCosTensor(TwoTensor):
    """A TwoTensor whose dispatch refuses ``cos``: ``sin`` works forward, its gradient cannot."""

    @staticmethod
    def __new__(cls, a, b):
        return TwoTensor.__new__(cls, a, b)

    @staticmethod
    def __tensor_unflatten__(inner, meta, size, stride):
        return NoCosTensor(inner["a"], inner["b"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs):
        if func is torch.ops.aten.cos.default:
            raise RuntimeError("NoCosTensor has no cos")
        a_args = tree_map(lambda t: t.a if isinstance(t, NoCosTensor) else t, args)
        b_args = tree_map(lambda t: t.b if isinstance(t, NoCosTensor) else t, args)
        out_a, out_b = func(*a_args, **(kwargs or {})), func(*b_args, **(kwargs or {}))
        if isinstance(out_a, torch.Tensor):
            return NoCosTensor(out_a, out_b)
        return out_a


def test_an_autodiff_error_cites_the_line_of_its_own_function():
    executors = thunderplug.discover(quiet=True)

    def g(x):
        return x.sin()  # compiled first, fine without gradients

    def f(x):
        return x.sin()

    thunder.jit(g, executors=executors)(NoCosTensor(torch.randn(3), torch.randn(3)))
    f_line, g_line = inspect.getsourcelines(f)[1] + 1, inspect.getsourcelines(g)[1] + 1
    x = NoCosTensor(torch.randn(3), torch.randn(3)).requires_grad_()
    with pytest.raises(Exception, match=rf"NoCosTensor.torch.sin.*test_compilation_record.py:{f_line}\b") as raised:
        thunder.jit(f, executors=executors)(x)
    assert f"test_compilation_record.py:{g_line}" not in str(raised.value)
