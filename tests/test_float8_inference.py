"""torchao Float8TrainingTensor under thunder.jit(executors=discover()), inference (CPU _scaled_mm)."""

import pytest
import thunder
import torch

import thunderplug

float8 = pytest.importorskip("torchao.float8")
from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic  # noqa: E402
from torchao.float8.float8_training_tensor import (  # noqa: E402
    Float8TrainingTensor,
    GemmInputRole,
    LinearMMConfig,
    hp_tensor_and_scale_to_float8,
)


def to_float8(hp: torch.Tensor, role: GemmInputRole) -> Float8TrainingTensor:
    scale = torch.finfo(torch.float8_e4m3fn).max / hp.abs().max().clamp(min=1e-12)
    return hp_tensor_and_scale_to_float8(hp, scale.float(), torch.float8_e4m3fn, LinearMMConfig(), role)


@pytest.fixture
def operands():
    torch.manual_seed(0)
    return to_float8(torch.randn(16, 32), GemmInputRole.INPUT), to_float8(torch.randn(8, 32), GemmInputRole.WEIGHT)


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda a, b, bias: torch.mm(a, b.t()), id="mm"),
        pytest.param(lambda a, b, bias: torch.addmm(bias, a, b.t()), id="addmm"),
        pytest.param(lambda a, b, bias: torch.nn.functional.linear(a, b), id="linear"),
        pytest.param(lambda a, b, bias: b.t(), id="t"),
    ],
)
def test_float8_inputs_match_eager(operands, fn):
    a, b = operands
    bias = torch.randn(8)
    jitted = thunder.jit(fn, executors=thunderplug.discover())
    actual, expected = jitted(a, b, bias), fn(a, b, bias)
    assert type(actual) is type(expected)
    if isinstance(expected, Float8TrainingTensor):
        assert actual._data.dtype == torch.float8_e4m3fn and actual._gemm_input_role == expected._gemm_input_role
        torch.testing.assert_close(actual._data.float(), expected._data.float())
        torch.testing.assert_close(actual._scale, expected._scale)
    else:
        torch.testing.assert_close(actual, expected)
    assert '"Float8TrainingTensor[cpu f32[16, 32]]"' in str(thunder.last_traces(jitted)[0])


def test_float8_built_inside_the_function(operands):
    _, weight = operands

    def fn(x, w8):
        x8 = hp_tensor_to_float8_dynamic(x, torch.float8_e4m3fn, LinearMMConfig(), gemm_input_role=GemmInputRole.INPUT)
        return torch.mm(x8, w8.t()), x8

    x = torch.randn(16, 32)
    jitted = thunder.jit(fn, executors=thunderplug.discover())
    (out, x8), (ref, ref8) = jitted(x, weight), fn(x, weight)
    torch.testing.assert_close(out, ref)
    assert type(x8) is Float8TrainingTensor
    torch.testing.assert_close(x8._data.float(), ref8._data.float())
    torch.testing.assert_close(x8._scale, ref8._scale)


def test_convert_to_float8_training_model_inference():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    fp8_model = float8.convert_to_float8_training(model)
    x = torch.randn(16, 32)
    jitted = thunder.jit(fp8_model, executors=thunderplug.discover())
    with torch.no_grad():
        torch.testing.assert_close(jitted(x), fp8_model(x))
    final = str(thunder.last_traces(jitted)[-1])
    assert "aten__scaled_mm_default(" in final or "_scaled_mm" in final
