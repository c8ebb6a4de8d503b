"""Models nobody here wrote, under eager, stock thunder.jit and discover(): fp32 and torchao float8 training
(3 AdamW steps: the loss of every step, every gradient, the final weights), inference after torchao's
``quantize_`` and greedy ``generate()`` with a static KV cache. Eager is the reference. The default run takes
the cases in DEFAULT (float8 and quantized on fewer); THUNDERPLUG_REAL_MODELS=1 runs every case in every test
(about 25 minutes on 2 CPU cores)."""

from __future__ import annotations

import inspect
import os

import pytest
import thunder
import torch

from tests.real_models.cases import BY_NAME, CASES, FAMILIES, GENERATORS, HF_MODELS, generator, hf_model
from tests.real_models.harness import assert_same_output, compare, compiler, fresh, output_and_grads, train
from thunderplug.eager.functorch_transforms import leave_levels_above

transformers = pytest.importorskip("transformers")
pytest.importorskip("litgpt")

ALL = os.environ.get("THUNDERPLUG_REAL_MODELS", "").lower() in ("1", "true", "yes", "on")
DEFAULT = ("hf_llama", "hf_bert", "litgpt_pythia", "thunder_nanogpt")
FP32_TOLERANCE = 1e-5

#: Every case trains bit-identically to eager under discover(), fp32 and float8 (measured on this branch: hf_llama,
#: hf_qwen2, hf_mistral, hf_gpt2, hf_bert, hf_vit, litgpt_pythia, litgpt_llama, thunder_nanogpt, thunder_llama2,
#: thunder_litgpt; aot_eager is not bit-identical on hf_llama 1.0e-4, hf_qwen2 6.3e-5, hf_mistral 1.0e-4,
#: litgpt_llama 1.1e-6, thunder_llama2 5.0e-6, thunder_litgpt 1.1e-6). What it took: SDPA with the boolean mask
#: transformers builds under compilation runs eager's kernel, a no-op ``Tensor.to`` is the tensor itself (RMSNorm's
#: gradients summed in eager's order) and convolutions run ATen's backward (ViT).
#: stock thunder.jit on these models, as measured
STOCK_FAILS = {
    name: "transformers' output capturing sets a global (`AssertionError: trying to set .global_var`)"
    for name in ("hf_llama", "hf_qwen2", "hf_mistral", "hf_gpt2", "hf_bert", "hf_vit")
}
STOCK_FAILS.update({  # issue 36's families, measured with transformers 5.25
    **{name: "transformers' output capturing sets a global (`AssertionError: trying to set .global_var`)"
       for name in ("hf_gemma", "hf_gemma2", "hf_phi3", "hf_gpt_neox", "hf_opt", "hf_t5", "hf_bart", "hf_roberta",
                    "hf_distilbert")},
    "hf_deberta_v2": "an `AssertionError` without a message while tracing",
    "hf_swin": "its loss's `binary_cross_entropy_with_logits` is auto-registered and fails on the target's shape",
    "hf_mixtral": "`transformers.grouped_mm_fallback` is a custom op thunder has not registered (`InterpreterError`)",
    # the families added after them (transformers 5.25, torchvision 0.24.1, timm 1.0.31, peft 0.18.1); stock
    # thunder.jit also drifts far from eager on tv_resnet18 (1.0 relative) and tv_mobilenet_v2 (1.2: BatchNorm's
    # decomposition over two values per channel) and timm_vit (8.0e-4), which the test reports as drifts
    **{name: "transformers' output capturing sets a global (`AssertionError: trying to set .global_var`)"
       for name in ("hf_clip", "hf_whisper", "peft_lora_llama")},
    "hf_convnext": "its loss's `binary_cross_entropy_with_logits` is auto-registered and fails on the target's "
                   "shape (as Swin's)",
    "tv_mobilenet_v3": "its classifier's `Dropout(inplace=True)` (p=0): `NotImplementedError: Only inplace=False "
                       "is currently supported in dropout`",
})
if transformers.__version__.startswith("4."):  # measured with transformers 4.57.6 (README, "Torch versions")
    STOCK_FAILS = {
        **{name: "transformers 4's attention masks use torch.vmap, which stock thunder cannot trace "
           "(`_add_batch_dim(): incompatible function arguments`)" for name in ("hf_llama", "hf_qwen2", "hf_mistral",
                                                                              "hf_gpt2")},
        "hf_bert": STOCK_FAILS["hf_bert"],
    }


def _cases(selected: tuple[str, ...] = DEFAULT, families: bool = False) -> list:
    """The cases a test runs: all of them with THUNDERPLUG_REAL_MODELS=1 (issue 36's families only where
    ``families``), else ``selected``."""
    families = families and not transformers.__version__.startswith("4.")  # measured under transformers 5
    return [pytest.param(case.name, id=case.name) for case in CASES
            if (ALL and (families or case.name not in FAMILIES)) or case.name in selected]


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


@pytest.mark.parametrize("name", _cases(families=True))
def test_fp32_training_under_discover(name, eager_runs):
    """Every case, issue 36's families included, bit for bit: losses, gradients, final weights and buffers."""
    model, expected = _eager(eager_runs, name)
    agreement = compare(train(fresh(model), BY_NAME[name].batch(), "discover"), expected)
    assert agreement.bit_identical, agreement


@pytest.mark.skipif(not ALL, reason="THUNDERPLUG_REAL_MODELS=1 runs it (issue 36's families, about 3 minutes)")
@pytest.mark.parametrize("name", [name for name in FAMILIES if not transformers.__version__.startswith("4.")])
def test_fp32_training_under_aot_eager(name, eager_runs):
    """torch.compile's aot_eager, for comparison with discover(): bit-identical to eager on every family but
    Phi-3, Mixtral and the PEFT LoRA Llama, which drift (measured: 6.6e-06 at the final qkv_proj of layer 0;
    1.3e-05 at its experts' gate_up_proj; 1.3e-06 at layer 1's k_proj lora_A)."""
    model, expected = _eager(eager_runs, name)
    agreement = compare(train(fresh(model), BY_NAME[name].batch(), "aot_eager"), expected)
    if name in ("hf_phi3", "hf_mixtral", "peft_lora_llama"):
        assert not agreement.bit_identical and agreement.worst <= 2 * FP32_TOLERANCE, agreement
        pytest.xfail(f"aot_eager drifts from eager: {agreement.worst:.1e} at {agreement.where}")
    assert agreement.bit_identical, agreement


@pytest.mark.parametrize("name", _cases(("thunder_nanogpt",), families=True))  # hf_llama's: 3 minutes; full run
def test_fp32_training_under_stock_thunder(name, eager_runs):
    model, expected = _eager(eager_runs, name)
    if name in STOCK_FAILS:
        with pytest.raises(Exception):  # noqa: B017 - recorded below with its reason
            train(fresh(model), BY_NAME[name].batch(), "stock", steps=1)
        leave_levels_above(0)  # stock thunder leaves transformers 4's vmap level entered: later tests would fail
        pytest.xfail(f"stock thunder: {STOCK_FAILS[name]}")
    agreement = compare(train(fresh(model), BY_NAME[name].batch(), "stock"), expected)
    if agreement.worst > FP32_TOLERANCE:
        pytest.xfail(f"stock thunder drifts from eager: {agreement.worst:.1e} at {agreement.where}")


#: how a user calls a model whose config keeps the library's defaults (``use_cache=True``: causal LMs return a
#: ``DynamicCache``, in training too) -> (call options, training mode, attention implementation)
DEFAULT_CONFIG_CALLS = {
    "training": ({}, True, "sdpa"),
    "inference": ({}, False, "sdpa"),
    "tuples": ({"return_dict": False}, True, "sdpa"),
    "attentions": ({"output_attentions": True}, True, "eager"),  # sdpa computes no attention weights
}


#: the default run's share (the full run: every HF case in every call, issue 36's families too under transformers 5,
#: about 25 minutes on 2 CPU cores)
DEFAULT_CONFIG_SELECTED = (("hf_llama", "training"), ("hf_llama", "inference"), ("hf_bert", "attentions"))

def _default_config_cases() -> list:
    families = not transformers.__version__.startswith("4.")  # the families are measured under transformers 5
    return [pytest.param(name, call, id=f"{name}-{call}") for name in HF_MODELS for call in DEFAULT_CONFIG_CALLS
            if (ALL and (families or name not in FAMILIES)) or (name, call) in DEFAULT_CONFIG_SELECTED]


@pytest.mark.parametrize(("name", "call"), _default_config_cases())
def test_default_config_under_discover(name, call):
    """The bare model (no loss wrapper), its config's defaults kept but sizes and dropout, called with its
    labels: every leaf of its output (the loss, the logits, the cache's classes, keys and values, the
    attention weights) and every parameter's gradient from all of them, as eager's. Bit for bit, but the
    attention weights' gradients (their sums in the softmax's backward differ by ulps: 6.5e-9 on hf_bert): within
    FP32_TOLERANCE."""
    options, training, attention = DEFAULT_CONFIG_CALLS[call]
    model = hf_model(name, attention=attention).train(training)
    batch = BY_NAME[name].batch()
    expected = output_and_grads(fresh(model), "eager", batch, **options)
    actual = output_and_grads(fresh(model), "discover", batch, **options)
    assert_same_output(actual, expected, tolerance=FP32_TOLERANCE if call == "attentions" else 0.0)


def _float8(model: torch.nn.Module) -> torch.nn.Module:
    from torchao.float8 import convert_to_float8_training

    def dims_of_16(module: torch.nn.Module, fqn: str) -> bool:
        return (isinstance(module, torch.nn.Linear) and module.in_features % 16 == 0
                and module.out_features % 16 == 0)

    return convert_to_float8_training(model, module_filter_fn=dims_of_16)


#: the families also trained in float8 in the full run (their Linears' dims are multiples of 16)
FLOAT8_FAMILIES = ("timm_vit",)


@pytest.mark.parametrize("name", _cases(("thunder_nanogpt", "hf_llama"))
                         + [pytest.param(name, id=name) for name in FLOAT8_FAMILIES if ALL])
def test_float8_training_under_discover(name, eager_runs):
    pytest.importorskip("torchao")
    model, expected = _eager(eager_runs, name, _float8)
    agreement = compare(train(fresh(model), BY_NAME[name].batch(), "discover"), expected)
    assert agreement.bit_identical, agreement  # eager's float8 casts and scaled matmuls, bit for bit


@pytest.mark.skipif(not ALL, reason="THUNDERPLUG_REAL_MODELS=1 runs it (with the PEFT case's training)")
def test_lora_trains_only_its_adapters_under_discover(eager_runs):
    """PEFT's LoRA on HF Llama: the adapters get gradients and change, the frozen base weights get none and keep
    their values, under discover() as in eager (compare() also checks that the gradients' names are eager's)."""
    model, expected = _eager(eager_runs, "peft_lora_llama")
    actual = train(fresh(model), BY_NAME["peft_lora_llama"].batch(), "discover")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    for run in (expected, actual):
        assert all(grads.keys() == trainable for grads in run.grads)
        for name, weight in model.named_parameters():
            assert torch.equal(run.weights[name], weight) == (name not in trainable), name
    assert compare(actual, expected).bit_identical


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
    # bit for bit on every case and config, NaNs included: eager's own logits of hf_bert under
    # Float8WeightOnlyConfig hold 32 NaNs (torchao's), and so do discover()'s, in the same places
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def _static_cache(model: torch.nn.Module, batch: int, length: int):
    """A ``StaticCache`` allocated before the first call (see test_generate_with_a_static_cache_it_allocates)."""
    from transformers import StaticCache

    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    cache = StaticCache(config=config, max_cache_len=length)
    head_dim = config.hidden_size // config.num_attention_heads
    cache.early_initialization(batch_size=batch, num_heads=heads, head_dim=head_dim, dtype=torch.float32, device="cpu")
    return cache


PROMPT, NEW_TOKENS = 8, 16
#: generate()'s argument for a cache the caller made
_CACHE_ARGUMENT = ("cache" if "cache" in inspect.signature(transformers.LlamaForCausalLM.forward).parameters
                   else "past_key_values")  # 5.24 renamed it


def _generate(model: torch.nn.Module, compile_with: str, preallocated: bool) -> tuple[torch.Tensor, int]:
    """Greedy ``generate()`` of NEW_TOKENS tokens with a static KV cache, the model's forward jitted
    (``model.forward = thunder.jit(model.forward, ...)``; ``thunder.jit(model).generate``:
    test_generate_on_the_thunder_module). Returns the tokens and the number of compilations."""
    ids = torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    options = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None)
    if preallocated:
        options[_CACHE_ARGUMENT] = _static_cache(model, 1, PROMPT + NEW_TOKENS)
    else:
        options["cache_implementation"] = "static"
    jitted = None
    if compile_with != "eager":
        jitted = compiler(compile_with)(model.forward)
        model.forward = jitted
    with torch.no_grad():
        tokens = model.generate(ids, **options)
    return tokens, (thunder.cache_misses(jitted) if jitted is not None else 0)


@pytest.mark.parametrize("name", [n for n in GENERATORS if ALL or n in DEFAULT])
def test_generate_with_a_static_cache_under_discover(name):
    pytest.importorskip("transformers")
    expected, _ = _generate(generator(name), "eager", preallocated=True)
    tokens, compilations = _generate(generator(name), "discover", preallocated=True)
    assert expected.shape[1] == PROMPT + NEW_TOKENS
    assert torch.equal(tokens, expected)
    assert compilations == 2, compilations  # the prompt's shape, then one token's: not one per token


@pytest.mark.skipif(not ALL, reason="THUNDERPLUG_REAL_MODELS=1 runs it (the idiom alone: test_library_idioms.py)")
def test_generate_with_a_static_cache_it_allocates():
    """The cache allocates its tensors and sets its attributes inside the first compiled call (transformers'
    lazy initialization): thunder kept only the first attribute written (wrong tokens from the second on)."""
    expected, _ = _generate(generator("hf_llama"), "eager", preallocated=False)
    tokens, compilations = _generate(generator("hf_llama"), "discover", preallocated=False)
    assert torch.equal(tokens, expected)
    assert compilations == 2, compilations


def _hidden_states_run(model: torch.nn.Module, fn, ids: torch.Tensor):
    """Two calls with ``output_hidden_states=True``: the outputs of each, and the gradients of the first's logits
    and hidden states (each weighted) for every parameter."""
    outputs = [fn(ids, output_hidden_states=True) for _ in range(2)]
    first = outputs[0]
    loss = first.logits.sum() + sum((h * (i + 1)).sum() for i, h in enumerate(first.hidden_states))
    loss.backward()
    return outputs, {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.skipif(not ALL, reason="THUNDERPLUG_REAL_MODELS=1 runs it (~30 s; the idioms: test_library_idioms.py)")
@pytest.mark.xfail(
    transformers.__version__.startswith("4."), strict=True, raises=NotImplementedError,
    reason="transformers 4.57 sets each layer's `forward` to a capturing wrapper inside the call; thunder 0.2.6 "
    "cannot replay that write: refused, naming `self.model.layers[0].forward` (stock: AssertionError)",
)
def test_output_hidden_states_under_discover():
    """transformers 5 installs forward hooks in the first call that asks for hidden states (here the compiled
    one) and sets them on its output after the forward: every hidden state is eager's, and so are the
    gradients through them."""
    case = BY_NAME["hf_llama"]
    ids = case.batch()["input_ids"]
    eager_model, model = case.build().model, case.build().model
    expected, expected_grads = _hidden_states_run(eager_model, eager_model, ids)
    jitted = compiler("discover")(model)
    actual, grads = _hidden_states_run(model, jitted, ids)
    for a, e in zip(actual, expected, strict=True):
        assert isinstance(a.hidden_states, tuple) and len(a.hidden_states) == len(e.hidden_states) == 3
        for h, eh in zip(a.hidden_states, e.hidden_states, strict=True):
            assert torch.equal(h, eh)
        assert torch.equal(a.logits, e.logits)
    assert grads.keys() == expected_grads.keys()
    for name, grad in expected_grads.items():
        assert torch.equal(grads[name], grad), name
    hooks = [len(m._forward_hooks) for m in model.modules()]
    assert hooks == [len(m._forward_hooks) for m in eager_model.modules()] and sum(hooks)  # none registered twice
    assert thunder.cache_misses(jitted) == 1  # the hooks registered while tracing run in the same program


@pytest.mark.skipif(not ALL, reason="THUNDERPLUG_REAL_MODELS=1 runs it (the idiom alone: test_library_idioms.py)")
@pytest.mark.parametrize("preallocated", [True, False], ids=["preallocated", "lazy"])
def test_generate_on_the_thunder_module(preallocated):
    """``thunder.jit(model).generate(...)``: generate's calls of ``self(...)`` run the compiled module (they ran
    the original one, uncompiled)."""
    ids = torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    options = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None)
    results = []
    for compile_with in ("eager", "discover"):
        model = generator("hf_llama")
        cache = {_CACHE_ARGUMENT: _static_cache(model, 1, PROMPT + NEW_TOKENS)} if preallocated else dict(
            cache_implementation="static")
        fn = compiler(compile_with)(model)
        with torch.no_grad():
            results.append(fn.generate(ids, **options, **cache))
    assert torch.equal(results[1], results[0])
    assert (thunder.cache_misses(fn), thunder.cache_hits(fn)) == (2, NEW_TOKENS - 2)  # prompt, then one token
