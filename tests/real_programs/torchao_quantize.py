"""torchao ``quantize_`` on a small Linear model, every config torchao offers for CPU, and a
``Float8Tensor`` built directly (what ``quantize_`` would give with CUDA kernels). Quantized
weights are frozen ``nn.Parameter``s of torchao's subclasses; the biases still train."""

from __future__ import annotations

import torch

from real_programs.case import Case, Program, case

torchao_quant = __import__("torchao.quantization", fromlist=["quantize_"])


def _model(dtype: torch.dtype) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32)).to(dtype)


def _quantized(config_factory, dtype: torch.dtype = torch.float32):
    def build() -> Program:
        model = _model(dtype)
        torchao_quant.quantize_(model, config_factory())
        return Program(model, (torch.randn(4, 64, dtype=dtype),))

    return build


def _int4_opaque():
    from torchao.quantization.quantize_.workflows.int4.int4_packing_format import Int4PackingFormat

    return torchao_quant.Int4WeightOnlyConfig(group_size=32, int4_packing_format=Int4PackingFormat.OPAQUE)


def _int4_v1_cpu_layout():
    from torchao.dtypes import Int4CPULayout

    return torchao_quant.Int4WeightOnlyConfig(group_size=32, layout=Int4CPULayout(), version=1)


def _int4_plain():
    return torchao_quant.Int4WeightOnlyConfig(group_size=32)


q = torchao_quant
CASES: list[Case] = [
    Case("quantize_/int8-weight-only/fp32", _quantized(q.Int8WeightOnlyConfig), trains="sgd"),
    Case("quantize_/int8-weight-only/bf16", _quantized(q.Int8WeightOnlyConfig, torch.bfloat16), trains="sgd"),
    Case("quantize_/int8-dynamic-act-int8-weight", _quantized(q.Int8DynamicActivationInt8WeightConfig), trains="sgd"),
    Case("quantize_/float8-weight-only/fp32", _quantized(q.Float8WeightOnlyConfig), trains="sgd"),
    Case("quantize_/float8-weight-only/bf16", _quantized(q.Float8WeightOnlyConfig, torch.bfloat16), trains="sgd"),
    Case("quantize_/intx-weight-only/int8", _quantized(q.IntxWeightOnlyConfig), trains="sgd"),
    Case(
        "quantize_/intx-weight-only/int4-group32",
        _quantized(lambda: q.IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=q.PerGroup(32))),
        trains="sgd",
    ),
    Case("quantize_/int4-weight-only/opaque-cpu", _quantized(_int4_opaque, torch.bfloat16), trains="sgd"),
    Case("quantize_/int4-weight-only/v1-Int4CPULayout", _quantized(_int4_v1_cpu_layout, torch.bfloat16), trains="sgd"),
    # torchao's default int4 packing needs fbgemm-gpu-genai: eager's own error is the skip reason
    Case("quantize_/int4-weight-only/plain", _quantized(_int4_plain, torch.bfloat16), trains="sgd"),
]


def _float8_tensor_direct(granularity: str, dtype: torch.dtype):
    """torchao's Float8Tensor for the weight, with dynamic float8 quantization of the activation
    (what ``quantize_`` builds for Float8DynamicActivationFloat8WeightConfig, which wants CUDA)."""

    def build() -> Program:
        from torchao.float8.inference import Float8MMConfig
        from torchao.quantization.granularity import PerRow, PerTensor
        from torchao.quantization.quantize_.workflows.float8.float8_tensor import (
            Float8Tensor,
            QuantizeTensorToFloat8Kwargs,
        )

        kind = {"per-tensor": PerTensor, "per-row": PerRow}[granularity]
        weight = Float8Tensor.from_hp(
            torch.randn(32, 64, dtype=dtype),
            granularity=kind(),
            act_quant_kwargs=QuantizeTensorToFloat8Kwargs(granularity=kind()),
            mm_config=Float8MMConfig(),
        )
        bias = torch.randn(32, dtype=dtype)  # _scaled_mm has no derivative: eager cannot train here

        def fn(x, weight, bias):
            return torch.nn.functional.linear(x, weight, bias).relu()

        return Program(fn, (torch.randn(8, 64, dtype=dtype), weight, bias))

    return build


def _frozen(build):
    """The same model for inference: every parameter frozen (int4 kernels have no derivative,
    so eager itself cannot train even the bias through them)."""

    def inference() -> Program:
        program = build()
        program.fn.requires_grad_(False)
        return program

    return inference


@case("Float8Tensor/frozen-parameter-in-Linear", trains="sgd")
def _float8_tensor_param() -> Program:
    from torchao.quantization.quantize_.workflows.float8.float8_tensor import Float8Tensor

    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
    model[0].weight = torch.nn.Parameter(Float8Tensor.from_hp(model[0].weight.detach()), requires_grad=False)
    return Program(model, (torch.randn(8, 64),))


CASES += [
    Case("Float8Tensor/act+weight/per-tensor/fp32", _float8_tensor_direct("per-tensor", torch.float32)),
    Case("Float8Tensor/act+weight/per-tensor/bf16", _float8_tensor_direct("per-tensor", torch.bfloat16)),
    Case("Float8Tensor/act+weight/per-row/fp32", _float8_tensor_direct("per-row", torch.float32)),
    Case("quantize_/int4-weight-only/opaque-cpu/inference", _frozen(_quantized(_int4_opaque, torch.bfloat16))),
    Case(
        "quantize_/int4-weight-only/v1-Int4CPULayout/inference",
        _frozen(_quantized(_int4_v1_cpu_layout, torch.bfloat16)),
    ),
    _float8_tensor_param,
]
