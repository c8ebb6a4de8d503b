"""Models nobody here wrote, under eager, stock thunder.jit and discover(): fp32 and torchao float8 training
(3 AdamW steps: the loss of every step, every gradient, the final weights) and inference after torchao's
``quantize_``. Eager is the reference. The default run takes the cases in DEFAULT; THUNDERPLUG_REAL_MODELS=1
runs every case (about 20 minutes on 2 CPU cores)."""

from __future__ import annotations

import os

import pytest
import torch

from tests.real_models.cases import BY_NAME, CASES
from tests.real_models.harness import compare, compiler, fresh, train

pytest.importorskip("transformers")
pytest.importorskip("litgpt")

ALL = os.environ.get("THUNDERPLUG_REAL_MODELS", "").lower() in ("1", "true", "yes", "on")
DEFAULT = ("hf_llama", "hf_bert", "litgpt_pythia", "thunder_nanogpt")
FP32_TOLERANCE, LOW_PRECISION_TOLERANCE = 1e-5, 1e-3

#: fp32 training under discover() bit-identical to eager on this branch
BIT_IDENTICAL = {"litgpt_pythia", "thunder_nanogpt"}
#: fp32 training under discover() further from eager than 1e-5 on this branch: thunder's backward formulas
#: of tanh / silu / gelu differ from ATen's kernels by ulps, AdamW amplifies them (aot_eager's distance in
#: parentheses where it is not bit-identical)
DRIFTS = {
    "hf_llama": "silu's backward (7.8e-5; aot_eager 1.0e-4)",
    "hf_qwen2": "silu's backward (aot_eager 6.2e-5)",
    "hf_mistral": "silu's backward (aot_eager 1.0e-4)",
    "hf_gpt2": "gelu_new's tanh backward (2.9e-4; aot_eager bit-identical)",
    "hf_bert": "gelu's backward (1.6e-5; aot_eager bit-identical)",
    "hf_vit": "gelu's backward (3.5e-4; aot_eager bit-identical)",
}
#: stock thunder.jit on these models, as measured
STOCK_FAILS = {
    name: "transformers' output capturing sets a global (`AssertionError: trying to set .global_var`)"
    for name in ("hf_llama", "hf_qwen2", "hf_mistral", "hf_gpt2", "hf_bert", "hf_vit")
}


def _cases(selected: tuple[str, ...] = DEFAULT) -> list:
    return [pytest.param(case.name, id=case.name) for case in CASES if ALL or case.name in selected]


@pytest.fixture(scope="module")
def eager_runs():
    return {}


def _eager(eager_runs, name: str, prepare=lambda model: model):
    key = (name, prepare)
    if key not in eager_runs:
        case = BY_NAME[name]
        model = prepare(case.build())
        eager_runs[key] = (model, train(fresh(model), case.batch(), "eager"))
    return eager_runs[key]


@pytest.mark.parametrize("name", _cases())
def test_fp32_training_under_discover(name, eager_runs):
    model, expected = _eager(eager_runs, name)
    agreement = compare(train(fresh(model), BY_NAME[name].batch(), "discover"), expected)
    if name in BIT_IDENTICAL:
        assert agreement.bit_identical, agreement
    elif name in DRIFTS and agreement.worst > FP32_TOLERANCE:
        pytest.xfail(f"{DRIFTS[name]}: {agreement.worst:.1e} at {agreement.where}")
    assert agreement.worst <= FP32_TOLERANCE, agreement


@pytest.mark.parametrize("name", _cases(("thunder_nanogpt", "hf_llama")))
def test_fp32_training_under_stock_thunder(name, eager_runs):
    model, expected = _eager(eager_runs, name)
    if name in STOCK_FAILS:
        with pytest.raises(Exception):  # noqa: B017 - recorded below with its reason
            train(fresh(model), BY_NAME[name].batch(), "stock", steps=1)
        pytest.xfail(f"stock thunder: {STOCK_FAILS[name]}")
    agreement = compare(train(fresh(model), BY_NAME[name].batch(), "stock"), expected)
    if agreement.worst > FP32_TOLERANCE:
        pytest.xfail(f"stock thunder drifts from eager: {agreement.worst:.1e} at {agreement.where}")


def _float8(model: torch.nn.Module) -> torch.nn.Module:
    from torchao.float8 import convert_to_float8_training

    def dims_of_16(module: torch.nn.Module, fqn: str) -> bool:
        return (isinstance(module, torch.nn.Linear) and module.in_features % 16 == 0
                and module.out_features % 16 == 0)

    return convert_to_float8_training(model, module_filter_fn=dims_of_16)


@pytest.mark.parametrize("name", _cases(("thunder_nanogpt", "hf_llama")))
def test_float8_training_under_discover(name, eager_runs):
    pytest.importorskip("torchao")
    model, expected = _eager(eager_runs, name, _float8)
    agreement = compare(train(fresh(model), BY_NAME[name].batch(), "discover"), expected)
    assert agreement.worst <= LOW_PRECISION_TOLERANCE, agreement


def _quantized(config_name: str):
    def quantize(model: torch.nn.Module) -> torch.nn.Module:
        import torchao.quantization as quantization

        model.inference = True
        quantization.quantize_(model, getattr(quantization, config_name)())
        return model.eval()

    return quantize


QUANTIZATIONS = ("Int8WeightOnlyConfig", "Int8DynamicActivationInt8WeightConfig", "Float8WeightOnlyConfig")


@pytest.mark.parametrize("config_name", QUANTIZATIONS)
@pytest.mark.parametrize("name", _cases(("hf_llama",)))
def test_quantized_inference_under_discover(name, config_name):
    pytest.importorskip("torchao")
    case = BY_NAME[name]
    model = _quantized(config_name)(case.build())
    batch = case.batch()
    with torch.no_grad():
        expected = model(batch)
        actual = compiler("discover")(model)(batch)
    scale = float(expected.abs().max())
    difference = float((actual - expected).abs().max()) / scale
    assert difference <= LOW_PRECISION_TOLERANCE, difference
