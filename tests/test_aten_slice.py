"""The first ATen overloads, in both call forms, forward and backward against eager."""

import pytest
import thunder
import torch
from thunder.core.transform_common import Transform

import thunderplug
from thunderplug.tracing.aten import DataDependentShapeError

aten = torch.ops.aten


def overload_form(x, y):
    return aten.mul.Tensor(aten.add.Tensor(x, y), x)


def packet_form(x, y):
    return aten.sum(aten.mm(x, aten.t(y)), [1], True)


def scalar_and_zero_dim(x, y):
    return aten.mul.Tensor(aten.add.Tensor(x, aten.sum.dim_IntList(y, [0, 1])), 0.5)


@pytest.mark.parametrize("fn", [overload_form, packet_form, scalar_and_zero_dim])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_eager_forward_and_backward(fn, dtype):
    x = torch.randn(3, 4, dtype=dtype, requires_grad=True)
    y = torch.randn(3, 4, dtype=dtype, requires_grad=True)
    jitted = thunder.jit(fn, executors=thunderplug.discover())

    actual, expected = jitted(x, y), fn(x, y)
    torch.testing.assert_close(actual, expected)
    cotangent = torch.randn_like(expected)
    torch.testing.assert_close(
        torch.autograd.grad(actual, (x, y), cotangent), torch.autograd.grad(expected, (x, y), cotangent)
    )


def test_trace_names_the_overloads():
    x = torch.randn(3, 4)
    jitted = thunder.jit(overload_form, executors=thunderplug.discover())
    jitted(x, x)
    initial = str(thunder.last_traces(jitted)[0])
    assert "torch.ops.aten.add.Tensor(x, y)" in initial
    assert "torch.ops.aten.mul.Tensor(" in initial
    ids = [bsym.sym.id for bsym in thunder.last_traces(jitted)[0].bound_symbols]
    assert "torch.ops.aten.add.Tensor" in ids


def test_inference_runs_each_overload_as_itself():
    x = torch.randn(3, 4)
    jitted = thunder.jit(packet_form, executors=thunderplug.discover())
    torch.testing.assert_close(jitted(x, x), packet_form(x, x))
    final = str(thunder.last_traces(jitted)[-1])
    assert "aten_mm_default(" in final and "aten_sum_dim_IntList(" in final


def test_data_dependent_shape_error_says_why_and_what_to_do():
    """nonzero (and argwhere, which make_fx and dispatch turn into it) cannot have a static shape. With thunder
    transforms the function cannot be broken there (tests/test_graph_breaks.py), and the error stands."""

    def uses_nonzero(x):
        return aten.nonzero.default(x)

    jitted = thunder.jit(uses_nonzero, executors=thunderplug.discover(), transforms=[Transform()])
    with pytest.raises(DataDependentShapeError) as error:
        jitted(torch.randn(3))
    message = str(error.value)
    assert "torch.ops.aten.nonzero.default" in message and "data-dependent output shape" in message
    assert "static shapes" in message and "outside the jitted function" in message and "mask" in message
    assert "test_aten_slice.py" in message
