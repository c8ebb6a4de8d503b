"""A backward reuses what its forward computed (``subclass.residuals``), and the float8 plugin's
row-wise matmul lets CSE keep one float8 cast of each input and weight: checked on the traces,
the saved tensors, and against eager."""

from __future__ import annotations

import copy

import pytest
import thunder
import torch
from torch.testing._internal.custom_tensor import CustomTensorPlainOut

import thunderplug


def _ops(trace) -> list[str]:
    return [bsym.sym.name for bsym in trace.bound_symbols]


def _saved(jitted) -> list:
    """The tensors the forward trace returns for the backward."""
    ret = thunder.last_traces(jitted)[-1].bound_symbols[-1]
    _, (saved_tensors, _) = ret.args
    return list(saved_tensors)


def test_a_backward_reuses_the_forward_value_it_would_recompute():
    def f(x):
        return torch.exp(x)  # CustomTensorPlainOut: exp of both inner tensors, summed into a plain tensor

    def make():
        torch.manual_seed(0)
        return CustomTensorPlainOut(torch.randn(4, 5), torch.randn(4, 5)).requires_grad_(True)

    x, x_eager = make(), make()
    jitted = thunder.jit(f, executors=thunderplug.discover(quiet=True))
    out, expected = jitted(x), f(x_eager)
    grad = torch.randn(4, 5)
    out.backward(grad)
    expected.backward(grad)
    assert type(out) is type(expected) and type(x.grad) is type(x_eager.grad)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x.grad, x_eager.grad)
    # the derivative reads exp(x), which the forward computed: the backward reads it, not recomputes it
    assert sum("exp" in name for name in _ops(thunder.last_traces(jitted)[-1])) == 2  # one per inner tensor
    assert not any("exp" in name for name in _ops(thunder.last_backward_traces(jitted)[-1]))


torchao = pytest.importorskip("torchao")


def _float8_model():
    from torchao.float8 import convert_to_float8_training

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
    return convert_to_float8_training(model)


def test_float8_linear_casts_each_input_and_weight_once_and_saves_the_float8_copy():
    eager = _float8_model()
    compiled = copy.deepcopy(eager)
    jitted = thunder.jit(compiled, executors=thunderplug.discover(quiet=True))
    x = torch.randn(4, 16, 64)
    x_eager = x.clone().requires_grad_()
    x.requires_grad_()
    for _ in range(2):  # the second call runs the cached program
        out, expected = jitted(x), eager(x_eager)
        grad = torch.randn_like(expected)
        out.backward(grad)
        expected.backward(grad)
        assert torch.equal(out, expected)
    assert torch.equal(x.grad, x_eager.grad)
    for p, q in zip(compiled.parameters(), eager.parameters()):
        assert torch.equal(p.grad, q.grad)

    def casts(trace, dtype: str) -> int:
        return str(trace).count(f"dtype=torch.{dtype})")

    forward, backward = thunder.last_traces(jitted)[-1], thunder.last_backward_traces(jitted)[-1]
    # 2 Linears: the forward casts 2 inputs and 2 weights, the backward only the 2 gradients (e5m2)
    assert casts(forward, "float8_e4m3fn") == 4
    assert casts(backward, "float8_e4m3fn") == 0
    assert casts(backward, "float8_e5m2") == 2
    saved = _saved(jitted)
    assert sum(t.dtype == thunder.dtypes.float8_e4m3fn for t in saved) == 4
    # no float32 copy of a Linear's input is kept: GELU's input is (its backward needs it), the inputs are not
    inputs_f32 = [t for t in saved if t.dtype == thunder.dtypes.float32 and tuple(t.shape) in ((4, 16, 64), (64, 64))]
    assert not inputs_f32


def test_the_float8_rows_rule_equals_torchao_forward_and_backward():
    from torchao.float8.config import Float8LinearConfig
    from torchao.float8.float8_linear import matmul_with_hp_or_float8_args
    from torchao.float8.float8_training_tensor import LinearMMConfig

    from thunderplug_float8.rules import matmul_on_rows

    config, mm_config = Float8LinearConfig(), LinearMMConfig()
    x = torch.randn(3, 8, 32, requires_grad=True)
    w = torch.randn(16, 32, requires_grad=True)
    grad = torch.randn(3, 8, 16)
    out = matmul_on_rows(x, w.t(), mm_config, config)
    (gx, gw) = torch.autograd.grad(out, (x, w), grad)
    expected = matmul_with_hp_or_float8_args.apply(x, w.t(), mm_config, config)
    (ex, ew) = torch.autograd.grad(expected, (x, w), grad)
    assert torch.equal(out, expected) and torch.equal(gx, ex) and torch.equal(gw, ew)


def test_a_larger_value_is_not_saved_in_place_of_what_the_backward_read():
    from torchao.dtypes.nf4tensor import linear_nf4, to_nf4

    torch.manual_seed(0)
    weight = to_nf4(torch.randn(256, 128))
    x = torch.randn(2048, 128, requires_grad=True)  # larger than the dequantized weight
    x_eager = x.detach().clone().requires_grad_()
    jitted = thunder.jit(lambda x, w: linear_nf4(x, w), executors=thunderplug.discover(quiet=True))
    out, expected = jitted(x, weight), linear_nf4(x_eager, weight)
    grad = torch.randn_like(expected)
    out.backward(grad)
    expected.backward(grad)
    assert torch.equal(out, expected) and torch.equal(x.grad, x_eager.grad)
    # the backward dequantizes the 4-bit weight again rather than keeping a float32 copy alive
    weight_shaped = ((256, 128), (128, 256))
    assert not [t for t in _saved(jitted) if thunder.dtypes.is_float_dtype(t.dtype) and tuple(t.shape) in weight_shaped]


def test_a_float8_weight_copy_larger_than_the_activation_is_not_saved():
    from torchao.float8 import convert_to_float8_training

    torch.manual_seed(0)
    eager = convert_to_float8_training(torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.GELU(),
                                                           torch.nn.Linear(512, 64)))
    compiled = copy.deepcopy(eager)
    jitted = thunder.jit(compiled, executors=thunderplug.discover(quiet=True))
    x = torch.randn(4, 64, requires_grad=True)  # 4 rows: each weight's float8 copy is larger than its input
    x_eager = x.detach().clone().requires_grad_()
    out, expected = jitted(x), eager(x_eager)
    grad = torch.randn_like(expected)
    out.backward(grad)
    expected.backward(grad)
    assert torch.equal(out, expected) and torch.equal(x.grad, x_eager.grad)
    for p, q in zip(compiled.parameters(), eager.parameters()):
        assert torch.equal(p.grad, q.grad)
    weight_shapes = {(512, 64), (64, 512)}
    fp8 = [t for t in _saved(jitted) if t.dtype == thunder.dtypes.float8_e4m3fn]
    assert fp8 and not [t for t in fp8 if tuple(t.shape) in weight_shapes]  # activations' copies only
    # the backward casts each weight again (its float8 copy is not saved) but reads the amax and
    # scale the forward computed: its only reductions are the two gradients' amaxes (e5m2 casts),
    # run as ATen's max (``aten``) or as eager's kernel (``eager_backward_kernels``)
    backward = thunder.last_backward_traces(jitted)[-1]
    assert sum(op in ("aten_max_default", "eager_max") for op in _ops(backward)) == 2
    assert len([t for t in _saved(jitted) if t.numel == 1]) >= 2
