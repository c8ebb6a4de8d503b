"""The float8 plugin's CPU ``_scaled_mm`` kernel gives torch's bits, and the float8 Linear uses it."""

import copy
import itertools

import pytest
import thunder
import torch

import thunderplug

float8 = pytest.importorskip("torchao.float8")
from thunderplug_float8 import cpu_scaled_mm  # noqa: E402  (after the torchao skip)

FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _same_bits(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def _float8(shape, dtype, column_major: bool, scale: float = 50.0) -> torch.Tensor:
    limit = torch.finfo(dtype).max
    value = (torch.randn(shape) * scale).clamp(-limit, limit).to(dtype)
    return value.t().contiguous().t() if column_major else value


@pytest.fixture(autouse=True)
def _emulated_scaled_mm():
    """torch emulates ``_scaled_mm`` unless oneDNN may take it; the reference must be the emulation."""
    # flags(), not assignment: torch.testing._internal (imported by other tests of the same run) calls
    # torch.backends.disable_global_flags(), after which assigning raises
    with torch.backends.mkldnn.flags(enabled=False):
        yield


@pytest.mark.parametrize("dtype_a,dtype_b", list(itertools.product(FLOAT8, FLOAT8)))
def test_every_float8_bit_pattern_widens_as_torch_does(dtype_a, dtype_b):
    """All 256 encodings of each operand (subnormals, zeros of both signs, NaN, e5m2's infinities)."""
    every = torch.arange(256, dtype=torch.uint8)
    a = every.view(dtype_a).reshape(16, 16)
    b = every.view(dtype_b).reshape(16, 16).t()  # column-major, as torchao passes weights
    scale_a, scale_b = torch.tensor(0.75), torch.tensor(3.0)
    for left, right in ((a, torch.eye(16).to(dtype_b)), (torch.eye(16).to(dtype_a), b), (a, b)):
        expected = torch._scaled_mm(left, right, scale_a, scale_b, out_dtype=torch.float32)
        _same_bits(cpu_scaled_mm.scaled_mm(left, right, scale_a, scale_b, out_dtype=torch.float32), expected)


@pytest.mark.parametrize("shape", [(64, 128, 96), (33, 80, 17), (256, 64, 512), (4, 512, 64), (4, 64, 512)])
@pytest.mark.parametrize("dtype_a,dtype_b", [(torch.float8_e4m3fn,) * 2, (torch.float8_e5m2, torch.float8_e4m3fn)])
@pytest.mark.parametrize("layouts", list(itertools.product([False, True], repeat=2)), ids=str)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_random_operands_layouts_and_scales_match_torch(shape, dtype_a, dtype_b, layouts, out_dtype):
    torch.manual_seed(sum(shape))
    m, k, n = shape
    a, b = _float8((m, k), dtype_a, layouts[0]), _float8((k, n), dtype_b, layouts[1])
    bias = torch.randn(n).to(out_dtype)
    for scale_a, scale_b in [(0.0123, 3.7), (1e-30, 2e30), (3e36, 1e-38), (1.0, 1.0)]:
        scales = torch.tensor(scale_a), torch.tensor(scale_b)
        for with_bias in (None, bias):
            expected = torch._scaled_mm(a, b, *scales, bias=with_bias, out_dtype=out_dtype)
            _same_bits(cpu_scaled_mm.scaled_mm(a, b, *scales, with_bias, None, out_dtype), expected)


def test_checker_declines_what_torch_would_not_emulate_the_same_way():
    from thunder.core import devices, dtypes
    from thunder.core.proxies import TensorProxy
    from thunder.core.trace import TraceCtx, tracectx

    def proxy(shape, dtype):
        return TensorProxy(shape=shape, dtype=dtype, device=devices.cpu)

    with tracectx(TraceCtx()):
        a, b = proxy((8, 16), dtypes.float8_e4m3fn), proxy((16, 4), dtypes.float8_e4m3fn)
        scale, rowwise = proxy((), dtypes.float32), proxy((8, 1), dtypes.float32)
        check = cpu_scaled_mm.scaled_mm_checker
        assert check(a, b, scale, scale, None, None, dtypes.float32) is None
        assert "tensorwise" in check(a, b, rowwise, scale, None, None, dtypes.float32)
        assert "result scale" in check(a, b, scale, scale, None, scale, dtypes.float32)
        assert "result" in check(a, b, scale, scale, None, None, dtypes.float8_e4m3fn)
        assert "float8" in check(proxy((8, 16), dtypes.float32), b, scale, scale, None, None, dtypes.float32)


def test_float8_linear_runs_the_kernel_and_trains_bit_identical_to_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
    eager = float8.convert_to_float8_training(copy.deepcopy(model))
    compiled = thunder.jit(float8.convert_to_float8_training(copy.deepcopy(model)), executors=thunderplug.discover())
    x = torch.randn(4, 8, 64)
    outs = [m(x) for m in (eager, compiled)]
    _same_bits(outs[1], outs[0])
    grad = torch.randn_like(outs[0]).transpose(0, 1).contiguous().transpose(0, 1)  # a non-contiguous gradient
    for out in outs:
        out.backward(grad)
    for p, q in zip(eager.parameters(), compiled.parameters()):
        _same_bits(q.grad, p.grad)
    traces = thunder.last_traces(compiled)[-1].python() + thunder.last_backward_traces(compiled)[-1].python()
    assert traces.count("float8__scaled_mm_default(") == 5  # 2 forward; 3 backward (x needs no gradient)
    assert "aten__scaled_mm_default(" not in traces
