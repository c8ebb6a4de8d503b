"""Hugging Face transformers, tiny configs, random init, the loss the model computes from labels:
Llama (GQA), BERT (its default dropout), Qwen2-MoE, gradient_checkpointing_enable(), DETR (heavy)."""

from __future__ import annotations

import torch
from torch import nn

from .program import Program, idiom

_TOKENS = torch.tensor([[3, 7, 1, 9, 4, 2, 8, 5], [6, 2, 2, 8, 1, 3, 7, 4]])
_SIZES = dict(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=32)


class _CausalLM(nn.Module):
    """Returns the model's own loss from ``labels`` (what a Trainer calls)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens):
        return self.model(input_ids=tokens, labels=tokens).loss


def _llama(**overrides) -> nn.Module:
    import transformers

    config = transformers.LlamaConfig(**{**_SIZES, "num_key_value_heads": 4, "use_cache": False, **overrides})
    config._attn_implementation = "sdpa"
    return transformers.LlamaForCausalLM(config)


@idiom("hf-LlamaForCausalLM")
def _hf_llama() -> Program:
    return Program(_CausalLM(_llama()), (_TOKENS,))


@idiom("hf-Llama-GQA-sdpa")
def _hf_llama_gqa() -> Program:
    return Program(_CausalLM(_llama(num_key_value_heads=2)), (_TOKENS,))


@idiom("hf-Llama-eager-attention")
def _hf_llama_eager() -> Program:
    model = _llama(num_key_value_heads=2)
    model.config._attn_implementation = "eager"
    return Program(_CausalLM(model), (_TOKENS,))


@idiom("hf-gradient_checkpointing_enable")
def _hf_checkpointing() -> Program:
    model = _llama()
    model.gradient_checkpointing_enable()
    return Program(_CausalLM(model), (_TOKENS,))


@idiom("hf-BertForMaskedLM-default-dropout")
def _hf_bert() -> Program:
    import transformers

    config = transformers.BertConfig(**_SIZES)
    config._attn_implementation = "sdpa"
    model = transformers.BertForMaskedLM(config)
    labels = torch.full_like(_TOKENS, -100)
    labels[:, 2] = _TOKENS[:, 2]

    class _Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, tokens, attention_mask):
            masked = tokens.clone()
            masked[:, 2] = 0
            return self.model(input_ids=masked, attention_mask=attention_mask, labels=labels).loss

    mask = torch.ones_like(_TOKENS)
    mask[1, 6:] = 0
    return Program(_Masked(), (_TOKENS, mask))


@idiom("hf-Qwen2MoE")
def _hf_qwen_moe() -> Program:
    import transformers

    config = transformers.Qwen2MoeConfig(**_SIZES, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=16, shared_expert_intermediate_size=16, use_cache=False)
    config._attn_implementation = "sdpa"
    return Program(_CausalLM(transformers.Qwen2MoeForCausalLM(config)), (_TOKENS,))


@idiom("hf-DETR", heavy=True, steps=2)
def _hf_detr() -> Program:
    import transformers

    backbone = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 16, 16], depths=[1, 1, 1, 1],
                                         out_features=["stage4"])
    config = transformers.DetrConfig(backbone_config=backbone, num_queries=4, encoder_layers=1, decoder_layers=1,
                                     encoder_ffn_dim=32, decoder_ffn_dim=32, d_model=16, encoder_attention_heads=2,
                                     decoder_attention_heads=2, num_labels=3)
    model = transformers.DetrForObjectDetection(config)

    class _Detect(nn.Module):  # its Hungarian-matching loss needs scipy (not installed): logits and boxes
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, pixels):
            out = self.model(pixel_values=pixels)
            return out.logits.softmax(-1)[..., 0].sum() + out.pred_boxes.sum()

    return Program(_Detect(), (torch.randn(1, 3, 64, 64),))
