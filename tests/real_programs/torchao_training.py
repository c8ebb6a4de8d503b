"""torchao's training subclasses on CPU: NF4 (inference and QLoRA over a frozen NF4 base weight),
the float8 training recipes, and MX formats with emulated gemms (training and inference)."""

from __future__ import annotations

import torch

from real_programs.case import Case, Program, case

# -- NF4 / QLoRA --------------------------------------------------------------------------------


class _QLoRALinear(torch.nn.Module):
    """A frozen NF4 base weight (``linear_nf4``) plus a trainable low-rank adapter, as QLoRA does."""

    def __init__(self, in_features: int, out_features: int, rank: int = 4):
        super().__init__()
        from torchao.dtypes.nf4tensor import to_nf4

        base = torch.randn(out_features, in_features) / in_features**0.5
        self.weight = torch.nn.Parameter(to_nf4(base, block_size=32, scaler_block_size=8), requires_grad=False)
        self.lora_a = torch.nn.Parameter(torch.randn(rank, in_features) * 0.1)
        self.lora_b = torch.nn.Parameter(torch.randn(out_features, rank) * 0.1)

    def forward(self, x):
        from torchao.dtypes.nf4tensor import linear_nf4

        return linear_nf4(x, self.weight) + (x @ self.lora_a.t()) @ self.lora_b.t()


@case("NF4/linear_nf4/inference")
def _nf4_inference() -> Program:
    from torchao.dtypes.nf4tensor import linear_nf4, to_nf4

    weight = to_nf4(torch.randn(64, 32), block_size=32, scaler_block_size=8)
    return Program(lambda x, w: torch.relu(linear_nf4(x, w)), (torch.randn(4, 32), weight))


@case("NF4/linear_nf4/input-grad")
def _nf4_input_grad() -> Program:
    from torchao.dtypes.nf4tensor import linear_nf4, to_nf4

    weight = to_nf4(torch.randn(64, 32), block_size=32, scaler_block_size=8)
    return Program(lambda x, w: linear_nf4(x, w).tanh(), (torch.randn(4, 32, requires_grad=True), weight))


@case("NF4/QLoRA-adapter/adamw", trains="adamw")
def _qlora() -> Program:
    model = torch.nn.Sequential(_QLoRALinear(32, 64), torch.nn.SiLU(), _QLoRALinear(64, 16))
    return Program(model, (torch.randn(8, 32),))


# -- float8 training recipes --------------------------------------------------------------------


def _float8_recipe(make_config, dtype: torch.dtype = torch.float32, bias: bool = True):
    def build() -> Program:
        from torchao.float8 import convert_to_float8_training

        # 48 is not a multiple of 16: pad_inner_dim pads it, the others run it as is
        model = torch.nn.Sequential(
            torch.nn.Linear(48, 64, bias=bias), torch.nn.GELU(), torch.nn.Linear(64, 32, bias=bias)
        ).to(dtype)
        model = convert_to_float8_training(model, config=make_config())
        return Program(model, (torch.randn(16, 48, dtype=dtype),))

    return build


def _config(**kwargs):
    def make():
        from torchao.float8 import Float8LinearConfig

        return Float8LinearConfig(**kwargs)

    return make


def _recipe(name: str, **overrides):
    def make():
        import dataclasses

        from torchao.float8 import Float8LinearConfig

        return dataclasses.replace(Float8LinearConfig.from_recipe_name(name), **overrides)

    return make


# -- MX formats (emulated gemms) ------------------------------------------------------------------


def _mx_model(elem_dtype, train: bool):
    def build() -> Program:
        from torchao.prototype.mx_formats import MXLinearConfig
        from torchao.quantization import quantize_

        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
        quantize_(model, MXLinearConfig(elem_dtype=elem_dtype, block_size=32))
        if not train:
            model.requires_grad_(False)
        # MX scales blocks of 32 along every contraction, the batch too in the weight gradient
        return Program(model, (torch.randn(32, 64),))

    return build


def _mean_square(output: torch.Tensor) -> torch.Tensor:
    return (output * output).mean()


@case("MX/MXTensor-direct/dequantize-matmul")
def _mx_tensor_direct() -> Program:
    def fn(x, w):
        from torchao.prototype.mx_formats.mx_tensor import MXTensor

        wq = MXTensor.to_mx(w, torch.float8_e4m3fn, 32)
        return (x @ wq.to_dtype(torch.float32).t()).relu()

    return Program(fn, (torch.randn(4, 64, requires_grad=True), torch.randn(16, 64)))


CASES: list[Case] = [
    _nf4_inference,
    _nf4_input_grad,
    _qlora,
    Case("float8-training/tensorwise-default", _float8_recipe(_recipe("tensorwise")), trains="sgd"),
    Case("float8-training/emulate", _float8_recipe(_config(emulate=True)), trains="sgd"),
    Case("float8-training/pad_inner_dim", _float8_recipe(_config(pad_inner_dim=True)), trains="sgd"),
    Case("float8-training/bf16-params", _float8_recipe(_config(), torch.bfloat16), trains="adamw"),
    Case("float8-training/no-bias/emulate", _float8_recipe(_config(emulate=True), bias=False), trains="adamw"),
    Case(
        "float8-training/rowwise/emulate",
        _float8_recipe(_recipe("rowwise", emulate=True), torch.bfloat16),
        trains="sgd",
    ),
    Case("float8-training/rowwise", _float8_recipe(_recipe("rowwise"), torch.bfloat16), trains="sgd"),
    Case("MX/mxfp8-e4m3/training", _mx_model(torch.float8_e4m3fn, True), trains="sgd", loss=_mean_square),
    Case("MX/mxfp8-e5m2/training", _mx_model(torch.float8_e5m2, True), trains="sgd", loss=_mean_square),
    Case("MX/mxfp8-e4m3/inference", _mx_model(torch.float8_e4m3fn, False)),
    Case("MX/mxfp4/training", _mx_model(torch.float4_e2m1fn_x2, True), trains="sgd", loss=_mean_square),
    _mx_tensor_direct,
]
