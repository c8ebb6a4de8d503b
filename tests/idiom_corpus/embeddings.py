"""Embeddings: max_norm (renormalizes the weight in place in forward), padding_idx, weight tying,
EmbeddingBag."""

from __future__ import annotations

import torch
from torch import nn

from .program import Program, idiom

_TOKENS = torch.tensor([[1, 4, 2, 0], [3, 3, 5, 0]])


class _Classifier(nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.embed = nn.Embedding(8, 6, **kwargs)
        self.head = nn.Linear(6, 3)

    def forward(self, tokens):
        return self.head(self.embed(tokens).mean(1))


@idiom("Embedding-max_norm")
def _max_norm() -> Program:
    return Program(_Classifier(max_norm=1.0), (_TOKENS,))


@idiom("Embedding-padding_idx")
def _padding_idx() -> Program:
    return Program(_Classifier(padding_idx=0), (_TOKENS,))


class _TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(8, 6)
        self.mix = nn.Linear(6, 6)
        self.lm_head = nn.Linear(6, 8, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, tokens, targets):
        logits = self.lm_head(torch.tanh(self.mix(self.embed(tokens))))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


@idiom("weight-tying-lm-head")
def _tied() -> Program:
    return Program(_TiedLM(), (_TOKENS, _TOKENS.roll(1, 1)))


class _Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(8, 6, mode="mean")
        self.head = nn.Linear(6, 2)

    def forward(self, flat, offsets):
        return self.head(self.bag(flat, offsets))


@idiom("EmbeddingBag-offsets")
def _bag() -> Program:
    return Program(_Bag(), (torch.tensor([1, 2, 4, 5, 4, 3, 2, 7]), torch.tensor([0, 3, 5])))
