"""Both call forms inside jit and inside make_fx graphs, the fp8 ``_scaled_mm`` emulation, and the
error for gradients through non-differentiable overloads."""

from __future__ import annotations

import pytest
import thunder
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import thunderplug
from thunderplug.tracing.aten import NotDifferentiableError

aten = torch.ops.aten


def packet_form(x, y):
    return aten.clamp(aten.div(aten.sub(x, y, alpha=2), aten.exp(y)), -1.0, 1.0), aten.max(x, 1)


def overload_form(x, y):
    return aten.clamp.default(
        aten.div.Tensor(aten.sub.Tensor(x, y, alpha=2), aten.exp.default(y)), -1.0, 1.0
    ), aten.max.dim(x, 1)


def _check(fn, *args):
    inputs = [a.detach().clone().requires_grad_() for a in args]
    actual = thunder.jit(fn, executors=thunderplug.discover())(*inputs)
    expected = fn(*args)
    torch.testing.assert_close(actual, expected)
    grads = torch.autograd.grad(actual[0].sum() + actual[1][0].sum(), inputs)
    torch.testing.assert_close(grads, torch.autograd.grad(expected[0].sum() + expected[1][0].sum(), args))


@pytest.mark.parametrize("fn", [packet_form, overload_form])
def test_both_call_forms_match_eager(fn):
    x, y = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True)
    _check(fn, x, y)


@pytest.mark.parametrize("fn", [packet_form, overload_form])
def test_call_forms_inside_make_fx_graph_forward(fn):
    x, y = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True)
    gm = make_fx(fn)(x.detach(), y.detach())
    assert any(isinstance(n.target, torch._ops.OpOverload) for n in gm.graph.nodes)
    _check(gm.forward, x, y)


def _fp8(*shape):
    return (torch.randn(*shape) * 4).to(torch.float8_e4m3fn)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("with_bias", [False, True])
def test_scaled_mm_matches_eager_cpu(out_dtype, with_bias):
    a, b = _fp8(16, 32), _fp8(16, 32).t()
    scale_a, scale_b, scale_result = torch.tensor(0.5), torch.tensor(3.0), torch.tensor(2.0)
    bias = (
        torch.randn(16, dtype=torch.bfloat16 if out_dtype == torch.bfloat16 else torch.float32) if with_bias else None
    )
    if out_dtype == torch.float8_e4m3fn and with_bias:
        bias = bias.to(torch.bfloat16)

    def fn(a, b, scale_a, scale_b, bias, scale_result):
        return aten._scaled_mm.default(a, b, scale_a, scale_b, bias, scale_result, out_dtype)

    expected = fn(a, b, scale_a, scale_b, bias, scale_result)
    # without the aten executor, so the decomposition itself runs
    decomposed = [e for e in thunderplug.discover() if e.name != "aten"]
    jitted = thunder.jit(fn, executors=decomposed, disable_torch_autograd=True)
    actual = jitted(a, b, scale_a, scale_b, bias, scale_result)
    assert "aten__scaled_mm_default(" not in str(thunder.last_traces(jitted)[-1])
    assert actual.dtype == expected.dtype
    # fp8 results: eager's CPU kernel (oneDNN) rounds its fp32 accumulation into fp8 its own way; the
    # decomposition is within one fp8 ulp (2**-3 relative for e4m3), and bit-identical otherwise
    rtol = 2**-3 if out_dtype == torch.float8_e4m3fn else 0
    torch.testing.assert_close(actual.float(), expected.float(), rtol=rtol, atol=0)


def test_gradient_through_non_differentiable_op_names_it():
    def fn(a, b, scale_a):
        return aten._scaled_mm.default(a, b, scale_a, torch.tensor(1.0), out_dtype=torch.float32)

    scale_a = torch.tensor(0.5, requires_grad=True)
    jitted = thunder.jit(fn, executors=thunderplug.discover())
    with pytest.raises(
        NotDifferentiableError, match=r"torch\.ops\.aten\._scaled_mm\.default has no derivative.*test_call_forms\.py"
    ):
        jitted(_fp8(8, 16), _fp8(8, 16).t(), scale_a).sum().backward()
