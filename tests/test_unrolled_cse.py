"""Common subexpressions of unrolled subclass ops are computed once; random ops never merge."""

from __future__ import annotations

import thunder
import torch
from torch.testing._internal.two_tensor import TwoTensor

import thunderplug


def _count(jitted, name: str) -> int:
    return sum(name in bsym.sym.name for bsym in thunder.last_traces(jitted)[-1].bound_symbols)


def test_the_same_op_on_the_same_subclass_value_is_computed_once():
    def f(x):
        return (x * 2) + (x * 2)

    x = TwoTensor(torch.randn(3), torch.randn(3))
    jitted = thunder.jit(f, executors=thunderplug.discover(quiet=True))
    out = jitted(x)
    expected = f(x)
    torch.testing.assert_close(out.a, expected.a)
    torch.testing.assert_close(out.b, expected.b)
    assert _count(jitted, "mul") == 2  # one per inner tensor, not one per use


def test_random_ops_are_not_merged():
    def f(x):
        return x.bernoulli(0.5) + x.bernoulli(0.5)

    x = TwoTensor(torch.full((4096,), 0.5), torch.full((4096,), 0.5))
    jitted = thunder.jit(f, executors=thunderplug.discover(quiet=True))
    out = jitted(x)
    assert _count(jitted, "bernoulli") == 4
    assert (out.a == 1).any()  # two independent draws disagree somewhere; one draw doubled never gives 1
