"""litgpt's GPT at a tiny config (the model class users fine-tune), next-token loss."""

from __future__ import annotations

import torch
from torch import nn

from .program import Program, idiom


class _NextToken(nn.Module):
    def __init__(self, name: str, **overrides):
        super().__init__()
        import litgpt

        config = litgpt.Config.from_name(name, n_layer=2, n_embd=16, n_head=4, block_size=16, vocab_size=16,
                                         padded_vocab_size=16, **overrides)
        self.gpt = litgpt.GPT(config)

    def forward(self, tokens):
        logits = self.gpt(tokens[:, :-1])
        return nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


_TOKENS = torch.tensor([[3, 7, 1, 9, 4, 2, 8, 5], [6, 2, 2, 8, 1, 3, 7, 4]])


@idiom("litgpt-pythia-like")
def _pythia() -> Program:
    return Program(_NextToken("pythia-14m"), (_TOKENS,))


@idiom("litgpt-llama-like-GQA")
def _llama() -> Program:
    return Program(_NextToken("Llama-3.2-1B", n_query_groups=2, intermediate_size=32), (_TOKENS,))
