"""Tiny configurations of models nobody here wrote (random init, CPU, no downloads): Hugging Face
transformers, litgpt, thunder's own test models, torchvision, timm and a PEFT LoRA adapter. Each case builds a
module whose forward takes one batch and returns the model's own loss, and the batch."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB, HIDDEN, FFN, LAYERS, HEADS, SEQ, BATCH = 128, 64, 128, 2, 4, 16, 2


@dataclass(frozen=True)
class Case:
    name: str
    library: str  # "transformers", "litgpt", "thunder", "torchvision", "timm" or "peft"
    build: Callable[[], torch.nn.Module]  # the model, seeded
    batch: Callable[[], dict[str, Any]]
    causal_lm: bool = False  # has generate()


class Loss(torch.nn.Module):
    """The model's own loss from a batch: HF models' ``.loss``; a logits-only model's cross-entropy."""

    def __init__(self, model: torch.nn.Module, kind: str):
        super().__init__()
        self.model, self.kind = model, kind
        self.inference = False  # True: the forward returns the logits instead

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        return self.logits(batch) if self.inference else self.loss(batch)

    def logits(self, batch: dict[str, Any]) -> torch.Tensor:
        if self.kind == "hf":
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            return self.model(**inputs).logits
        if self.kind == "nanogpt":
            return self.model(batch["input_ids"])[0]
        if self.kind == "classifier":
            return self.model(batch["pixel_values"])
        return self.model(batch["input_ids"])

    def loss(self, batch: dict[str, Any]) -> torch.Tensor:
        if self.kind == "hf":
            return self.model(**batch).loss
        if self.kind == "nanogpt":
            return self.model(batch["input_ids"], batch["labels"])[1]
        if self.kind == "classifier":  # torchvision's and timm's image classifiers return logits
            return torch.nn.functional.cross_entropy(self.model(batch["pixel_values"]), batch["labels"])
        logits = self.model(batch["input_ids"], batch["labels"]) if self.kind == "llama2" else self.model(
            batch["input_ids"]
        )
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())


def _tokens() -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


def _shifted_tokens() -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return {"input_ids": ids[:, :-1].contiguous(), "labels": ids[:, 1:].contiguous()}


def _masked_tokens() -> dict[str, Any]:
    batch = _tokens()
    batch["attention_mask"] = torch.ones(BATCH, SEQ, dtype=torch.long)
    batch["attention_mask"][1, SEQ - 4 :] = 0
    return batch


def _images() -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    return {"pixel_values": torch.randn(BATCH, 3, 32, 32, generator=g), "labels": torch.tensor([1, 3])}


def _image_text() -> dict[str, Any]:
    """CLIP's contrastive batch: captions and images, its loss from their similarities."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)
    return {"input_ids": ids, "pixel_values": torch.randn(BATCH, 3, 32, 32, generator=g), "return_loss": True}


MEL_BINS, AUDIO_POSITIONS = 16, 32  # Whisper's encoder takes 2 * AUDIO_POSITIONS frames (its convolutions halve them)


def _audio() -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    return {"input_features": torch.randn(BATCH, MEL_BINS, 2 * AUDIO_POSITIONS, generator=g),
            "labels": torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)}


def _seeded(make: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return make()

    return build


#: case name -> (config class, model class, the config's arguments) of the Hugging Face cases
HF_MODELS: dict[str, tuple[str, str, dict[str, Any]]] = {}

#: the arguments the training cases add to a config: the real-model corpus trains without a KV cache
_TRAINING_ONLY = ("use_cache",)


def _hf(name: str, config_name: str, model_name: str, **config: Any) -> Callable[[], torch.nn.Module]:
    HF_MODELS[name] = (config_name, model_name, config)

    def make() -> torch.nn.Module:
        return Loss(hf_model(name, defaults=False), "hf")

    return _seeded(make)


def hf_model(name: str, *, defaults: bool = True, attention: str = "sdpa") -> torch.nn.Module:
    """The bare Hugging Face model of case ``name`` (seeded), in training mode. ``defaults``: its config keeps
    the library's defaults for everything but the sizes and the dropout probabilities (``use_cache``,
    ``return_dict``, ``output_attentions``...), as a user's ``LlamaConfig(...)`` does. ``attention``: the
    attention implementation (``"eager"`` computes the attention weights ``output_attentions=True`` returns)."""
    import transformers

    config_name, model_name, config = HF_MODELS[name]
    if defaults:
        config = {key: value for key, value in config.items() if key not in _TRAINING_ONLY}
    torch.manual_seed(0)
    cfg = getattr(transformers, config_name)(**config)
    model_class = getattr(transformers, model_name)
    # a model without SDPA support (BLOOM, Gemma2, DeBERTa-v2) keeps its eager attention
    cfg._attn_implementation = attention if getattr(model_class, "_supports_sdpa", False) else "eager"
    return model_class(cfg)


_DECODER = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                num_attention_heads=HEADS, num_key_value_heads=2, max_position_embeddings=64, use_cache=False)


def _litgpt(name: str, **overrides: Any) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        import litgpt

        config = litgpt.Config.from_name(name, n_layer=LAYERS, n_embd=HIDDEN, n_head=HEADS, block_size=64,
                                         vocab_size=VOCAB, padded_vocab_size=VOCAB, **overrides)
        return Loss(litgpt.GPT(config), "litgpt")

    return _seeded(make)


def _nanogpt() -> torch.nn.Module:
    from thunder.tests import nanogpt_model

    config = nanogpt_model.GPTConfig(block_size=64, vocab_size=VOCAB, n_layer=LAYERS, n_head=HEADS, n_embd=HIDDEN)
    return Loss(nanogpt_model.GPT(config), "nanogpt")


def _llama2() -> torch.nn.Module:
    from thunder.tests import llama2_model

    args = llama2_model.ModelArgs(dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, n_kv_heads=2, vocab_size=VOCAB,
                                  multiple_of=16, max_seq_len=64)
    return Loss(llama2_model.Transformer(args), "llama2")


def _thunder_litgpt() -> torch.nn.Module:
    from thunder.tests import litgpt_model

    config = litgpt_model.Config.from_name("llama2-like", vocab_size=VOCAB, padded_vocab_size=VOCAB,
                                           intermediate_size=FFN, block_size=64)
    return Loss(litgpt_model.GPT(config), "litgpt")


def _clip() -> torch.nn.Module:
    import transformers

    text = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                num_attention_heads=HEADS, max_position_embeddings=SEQ, attention_dropout=0.0, pad_token_id=0,
                bos_token_id=1, eos_token_id=2)
    vision = dict(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  image_size=32, patch_size=8, attention_dropout=0.0)
    config = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=32)
    config._attn_implementation = "sdpa"
    return Loss(transformers.CLIPModel(config), "hf")


def _torchvision(name: str, **options: Any) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        import torchvision

        return Loss(getattr(torchvision.models, name)(num_classes=4, **options), "classifier")

    return _seeded(make)


def _timm_vit() -> torch.nn.Module:
    import timm

    return Loss(timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=4, img_size=32, patch_size=8,
                                  embed_dim=HIDDEN, depth=LAYERS, num_heads=HEADS, mlp_ratio=4.0), "classifier")


def _peft_lora_llama() -> torch.nn.Module:
    """HF Llama with a LoRA adapter on its attention's projections: only the adapters train."""
    import peft
    import transformers

    config = transformers.LlamaConfig(**_DECODER)
    config._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(config)
    lora = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                           task_type="CAUSAL_LM")
    return Loss(peft.get_peft_model(model, lora), "hf")


CASES: tuple[Case, ...] = (
    Case("hf_llama", "transformers", _hf("hf_llama", "LlamaConfig", "LlamaForCausalLM", **_DECODER), _tokens,
         causal_lm=True),
    Case("hf_qwen2", "transformers", _hf("hf_qwen2", "Qwen2Config", "Qwen2ForCausalLM", **_DECODER), _tokens,
         causal_lm=True),
    Case("hf_mistral", "transformers", _hf("hf_mistral", "MistralConfig", "MistralForCausalLM", **_DECODER), _tokens,
         causal_lm=True),
    Case("hf_gpt2", "transformers",
         _hf("hf_gpt2", "GPT2Config", "GPT2LMHeadModel", vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
             n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False),
         _tokens, causal_lm=True),
    Case("hf_bert", "transformers",
         _hf("hf_bert", "BertConfig", "BertForMaskedLM", vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN,
             num_hidden_layers=LAYERS, num_attention_heads=HEADS, max_position_embeddings=64,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
         _masked_tokens),
    Case("hf_vit", "transformers",
         _hf("hf_vit", "ViTConfig", "ViTForImageClassification", image_size=32, patch_size=8, hidden_size=HIDDEN,
             intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_labels=4,
             problem_type="single_label_classification",
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
         _images),
    # more families (issue 36 item 4): tiny configs, random weights; attention as the library supports it
    Case("hf_gemma", "transformers", _hf("hf_gemma", "GemmaConfig", "GemmaForCausalLM", **_DECODER, head_dim=16),
         _tokens, causal_lm=True),
    Case("hf_gemma2", "transformers", _hf("hf_gemma2", "Gemma2Config", "Gemma2ForCausalLM", **_DECODER, head_dim=16),
         _tokens, causal_lm=True),
    Case("hf_phi3", "transformers", _hf("hf_phi3", "Phi3Config", "Phi3ForCausalLM", **_DECODER, pad_token_id=0),
         _tokens, causal_lm=True),
    Case("hf_mixtral", "transformers",
         _hf("hf_mixtral", "MixtralConfig", "MixtralForCausalLM", **_DECODER, num_local_experts=4,
             num_experts_per_tok=2),
         _tokens, causal_lm=True),
    Case("hf_gpt_neox", "transformers",
         _hf("hf_gpt_neox", "GPTNeoXConfig", "GPTNeoXForCausalLM", vocab_size=VOCAB, hidden_size=HIDDEN,
             num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN, max_position_embeddings=64,
             use_cache=False, hidden_dropout=0.0, attention_dropout=0.0),
         _tokens, causal_lm=True),
    Case("hf_falcon", "transformers",
         _hf("hf_falcon", "FalconConfig", "FalconForCausalLM", vocab_size=VOCAB, hidden_size=HIDDEN,
             num_hidden_layers=LAYERS, num_attention_heads=HEADS, use_cache=False, hidden_dropout=0.0,
             attention_dropout=0.0),
         _tokens, causal_lm=True),
    Case("hf_opt", "transformers",
         _hf("hf_opt", "OPTConfig", "OPTForCausalLM", vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
             ffn_dim=FFN, num_attention_heads=HEADS, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
             use_cache=False, word_embed_proj_dim=HIDDEN),
         _tokens, causal_lm=True),
    Case("hf_bloom", "transformers",  # ALiBi
         _hf("hf_bloom", "BloomConfig", "BloomForCausalLM", vocab_size=VOCAB, hidden_size=HIDDEN, n_layer=LAYERS,
             n_head=HEADS, use_cache=False, hidden_dropout=0.0, attention_dropout=0.0),
         _tokens, causal_lm=True),
    Case("hf_t5", "transformers",  # encoder-decoder
         _hf("hf_t5", "T5Config", "T5ForConditionalGeneration", vocab_size=VOCAB, d_model=HIDDEN, d_kv=16, d_ff=FFN,
             num_layers=LAYERS, num_heads=HEADS, dropout_rate=0.0, use_cache=False, decoder_start_token_id=0,
             pad_token_id=0),
         _tokens),
    Case("hf_bart", "transformers",
         _hf("hf_bart", "BartConfig", "BartForConditionalGeneration", vocab_size=VOCAB, d_model=HIDDEN,
             encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=HEADS,
             decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, max_position_embeddings=64,
             dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, use_cache=False),
         _tokens),
    Case("hf_roberta", "transformers",
         _hf("hf_roberta", "RobertaConfig", "RobertaForMaskedLM", vocab_size=VOCAB, hidden_size=HIDDEN,
             intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS, max_position_embeddings=66,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
         _masked_tokens),
    Case("hf_distilbert", "transformers",
         _hf("hf_distilbert", "DistilBertConfig", "DistilBertForMaskedLM", vocab_size=VOCAB, dim=HIDDEN,
             n_layers=LAYERS, n_heads=HEADS, hidden_dim=FFN, max_position_embeddings=64, dropout=0.0,
             attention_dropout=0.0),
         _masked_tokens),
    Case("hf_deberta_v2", "transformers",
         _hf("hf_deberta_v2", "DebertaV2Config", "DebertaV2ForMaskedLM", vocab_size=VOCAB, hidden_size=HIDDEN,
             num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN, max_position_embeddings=64,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
         _masked_tokens),
    Case("hf_swin", "transformers",
         _hf("hf_swin", "SwinConfig", "SwinForImageClassification", image_size=32, patch_size=4, embed_dim=16,
             depths=[1, 1], num_heads=[2, 2], window_size=4, num_labels=4, hidden_dropout_prob=0.0,
             attention_probs_dropout_prob=0.0, drop_path_rate=0.0),
         _images),
    Case("hf_clip", "transformers", _seeded(_clip), _image_text),  # contrastive: return_loss=True
    Case("hf_whisper", "transformers",  # audio: log-mel features in, tokens out
         _hf("hf_whisper", "WhisperConfig", "WhisperForConditionalGeneration", vocab_size=VOCAB, num_mel_bins=MEL_BINS,
             d_model=HIDDEN, encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=HEADS,
             decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN,
             max_source_positions=AUDIO_POSITIONS, max_target_positions=64, pad_token_id=0, bos_token_id=1,
             eos_token_id=2, decoder_start_token_id=1, suppress_tokens=None, begin_suppress_tokens=None,
             dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, use_cache=False),
         _audio),
    Case("hf_convnext", "transformers",
         _hf("hf_convnext", "ConvNextConfig", "ConvNextForImageClassification", image_size=32, patch_size=4,
             num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], num_labels=4, drop_path_rate=0.0),
         _images),
    # BatchNorm in training mode: its running statistics are compared too (harness.compare's buffers)
    Case("tv_resnet18", "torchvision", _torchvision("resnet18"), _images),
    Case("tv_mobilenet_v2", "torchvision", _torchvision("mobilenet_v2", width_mult=0.25, dropout=0.0), _images),
    Case("tv_mobilenet_v3", "torchvision", _torchvision("mobilenet_v3_small", width_mult=0.25, dropout=0.0),
         _images),
    Case("timm_vit", "timm", _seeded(_timm_vit), _images),
    Case("peft_lora_llama", "peft", _seeded(_peft_lora_llama), _tokens),
    Case("litgpt_pythia", "litgpt", _litgpt("pythia-14m"), _shifted_tokens),
    Case("litgpt_llama", "litgpt", _litgpt("Llama-3.2-1B", n_query_groups=2, intermediate_size=FFN, head_size=16),
         _shifted_tokens),
    Case("thunder_nanogpt", "thunder", _seeded(_nanogpt), _shifted_tokens),
    Case("thunder_llama2", "thunder", _seeded(_llama2), _shifted_tokens),
    Case("thunder_litgpt", "thunder", _seeded(_thunder_litgpt), _shifted_tokens),
)

BY_NAME = {case.name: case for case in CASES}

#: the families issue 36 added: measured in fp32 training under discover(), stock thunder and aot_eager only
#: (float8, quantized inference and the configs' defaults are measured on the cases before them)
FAMILIES = ("hf_gemma", "hf_gemma2", "hf_phi3", "hf_mixtral", "hf_gpt_neox", "hf_falcon", "hf_opt", "hf_bloom", "hf_t5",
            "hf_bart", "hf_roberta", "hf_distilbert", "hf_deberta_v2", "hf_swin", "hf_clip", "hf_whisper",
            "hf_convnext", "tv_resnet18", "tv_mobilenet_v2", "tv_mobilenet_v3", "timm_vit", "peft_lora_llama")

#: the causal LMs that also run greedy ``generate()`` with a static KV cache (tests/real_models)
GENERATORS = ("hf_llama", "hf_gpt2")


def generator(name: str) -> torch.nn.Module:
    """The HF model of case ``name`` for ``generate()``, in eval mode, with the KV cache on. Weights are
    drawn 15x wider than the training cases' (``initializer_range=0.3``), so that the greedy choice of
    every token is decided by a margin far above float32 rounding: a random-init tiny model's logits are
    otherwise near ties, and the test would measure ulps instead of the cache and the compilations."""
    import transformers

    torch.manual_seed(0)
    if name == "hf_llama":
        config = transformers.LlamaConfig(**{**_DECODER, "use_cache": True}, initializer_range=0.3)
        model = transformers.LlamaForCausalLM(config)
    elif name == "hf_gpt2":
        config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                                         n_positions=64, initializer_range=0.3)
        model = transformers.GPT2LMHeadModel(config)
    else:
        raise ValueError(name)
    config._attn_implementation = "sdpa"
    return model.eval()
