"""The decomposition table ``make_fx`` unrolls subclass dispatch with (``AtenTable.decompositions``)
leaves CompositeImplicitAutograd ops out, since make_fx decomposes them with their own kernel
anyway: the graphs are those ``torch._decomp.core_aten_decompositions()`` gives, with and without
autograd (under ``inference_mode`` such ops reach the tracer), and a subclass program through
such ops matches eager forward and backward."""

from __future__ import annotations

import pytest
import thunder
import torch
import torch.nn.functional as F
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing._internal.two_tensor import TwoTensor

import thunderplug


def _table():
    executor = next(ex for ex in thunderplug.discover(quiet=True) if hasattr(ex, "aten"))
    return executor.aten


def _programs():
    w = torch.randn(6, 5)
    return {
        "linear": lambda x: F.linear(x, w).relu().sum(),
        "einsum": lambda x: torch.einsum("ij,kj->ik", x, w).flatten(),
        "addr": lambda x: torch.addr(torch.zeros(4, 6), x[:, 0], w[:, 0]).std(),
        "matmul_norm": lambda x: torch.matmul(x, w.t()).norm(dim=1),
        "gelu_backward": lambda x: torch.ops.aten.gelu_backward(x, x * 2),
    }


def test_the_table_holds_no_composite_implicit_op_and_skips_registered_ones():
    table = _table()
    assert table.decompositions, "the table lost torch's post-autograd decompositions"
    assert not [op for op in table.decompositions if op._can_decompose()]
    assert not set(table.decompositions) & set(table.symbols)


@pytest.mark.parametrize("inference", [False, True], ids=["autograd", "inference_mode"])
@pytest.mark.parametrize("name", list(_programs()))
def test_graphs_equal_those_of_torch_core_aten_table(name, inference):
    table = _table()
    reference = {op: fn for op, fn in core_aten_decompositions().items() if op not in table.symbols}
    program = _programs()[name]
    x = torch.randn(4, 5)
    with torch.inference_mode(inference):
        ours = make_fx(program, decomposition_table=table.decompositions)(x)
        torchs = make_fx(program, decomposition_table=reference)(x)
    assert ours.code == torchs.code


def test_a_subclass_program_through_composite_implicit_ops_matches_eager():
    def program(x, w):
        return (F.linear(x, w).flatten(0, 1) * torch.einsum("bij->b", x).sum()).sum()

    def inputs():
        torch.manual_seed(0)
        x = TwoTensor(torch.randn(2, 3, 4, dtype=torch.float64), torch.randn(2, 3, 4, dtype=torch.float64))
        return x.requires_grad_(True), torch.randn(5, 4, dtype=torch.float64, requires_grad=True)

    x, w = inputs()
    expected = program(x, w)
    expected.backward()
    xj, wj = inputs()
    actual = thunder.jit(program, executors=thunderplug.discover(quiet=True))(xj, wj)
    actual.backward()
    torch.testing.assert_close(actual, expected)
    assert type(xj.grad) is type(x.grad)
    torch.testing.assert_close(xj.grad, x.grad)
    torch.testing.assert_close(wj.grad, w.grad)
