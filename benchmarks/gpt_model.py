"""A small GPT-style decoder, the "real model" of issue 14, shared by benchmarks and tests.

Token + position embedding, ``layers`` pre-LayerNorm blocks (causal self-attention through
separate q/k/v/out ``nn.Linear`` and ``F.scaled_dot_product_attention``; MLP
``Linear(d, 4d) - GELU - Linear(4d, d)``; residuals), a final LayerNorm, an LM head and
cross-entropy. Written the way a user writes one, with nothing tuned for any compiler, so that
``convert_to_float8_training`` swaps every Linear (attention, MLP, LM head) for a float8 one.

Tests load this file by path (``tests/test_gpt_float8.py``); the benchmark imports it as a sibling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    """Model and batch shape. Defaults are issue 14's: d_model 256, 4 heads, seq 128, batch 4, vocab 512."""

    layers: int = 2
    d_model: int = 256
    heads: int = 4
    seq: int = 128
    batch: int = 4
    vocab: int = 512

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by heads {self.heads}")


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        d = config.d_model
        self.heads = config.heads
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.heads

        def split(y: torch.Tensor) -> torch.Tensor:  # (b, t, d) -> (b, h, t, d/h)
            return y.view(b, t, h, d // h).transpose(1, 2)

        y = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        d = config.d_model
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.proj = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """``forward(tokens, targets)`` returns the mean cross-entropy loss of next-token logits."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.tok = nn.Embedding(config.vocab, config.d_model)
        self.pos = nn.Embedding(config.seq, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def build(config: GPTConfig, *, seed: int = 0) -> tuple[GPT, torch.Tensor, torch.Tensor]:
    """The model (fp32, seeded) and one batch of random tokens and targets."""
    torch.manual_seed(seed)
    model = GPT(config)
    tokens = torch.randint(0, config.vocab, (config.batch, config.seq))
    targets = torch.randint(0, config.vocab, (config.batch, config.seq))
    return model, tokens, targets


def to_float8(model: nn.Module) -> nn.Module:
    """torchao's default (tensorwise, dynamic) float8 training conversion of every Linear."""
    from torchao.float8 import convert_to_float8_training

    return convert_to_float8_training(model)
