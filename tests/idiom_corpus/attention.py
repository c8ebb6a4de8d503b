"""Attention modules: nn.MultiheadAttention, TransformerEncoder (train and eval fast path),
nn.Transformer with masks, scaled_dot_product_attention with GQA, a Conformer-like block."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .program import Program, idiom

_PADDING = torch.tensor([[False, False, False, True, True], [False] * 5, [False, False, False, False, True]])


class _MHA(nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True, **kwargs)

    def forward(self, x, mask=None):
        out, weights = self.attn(x, x, x, key_padding_mask=mask)
        return out, weights


@idiom("MultiheadAttention")
def _mha() -> Program:
    return Program(_MHA(), (torch.randn(3, 5, 8),))


@idiom("MultiheadAttention-key_padding_mask")
def _mha_mask() -> Program:
    return Program(_MHA(), (torch.randn(3, 5, 8), _PADDING))


def _encoder() -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


@idiom("TransformerEncoder-train")
def _encoder_train() -> Program:
    return Program(_encoder(), (torch.randn(3, 5, 8),))


class _EncoderWithMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = _encoder()

    def forward(self, x, mask):
        return self.encoder(x, src_key_padding_mask=mask)


@idiom("TransformerEncoder-eval-fast-path", train=False)
def _encoder_eval() -> Program:
    return Program(_EncoderWithMask(), (torch.randn(3, 5, 8), _PADDING))


class _Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Transformer(8, 2, 1, 1, dim_feedforward=16, dropout=0.0, batch_first=True)

    def forward(self, src, tgt, src_padding):
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        return self.model(src, tgt, tgt_mask=causal, src_key_padding_mask=src_padding, tgt_is_causal=True)


@idiom("Transformer-with-masks")
def _transformer() -> Program:
    return Program(_Seq2Seq(), (torch.randn(3, 5, 8), torch.randn(3, 4, 8), _PADDING))


class _GQA(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 4), nn.Linear(8, 4)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, 4, 2).transpose(1, 2)
        k = self.k(x).view(b, t, 2, 2).transpose(1, 2)
        v = self.v(x).view(b, t, 2, 2).transpose(1, 2)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


@idiom("sdpa-enable_gqa")
def _gqa() -> Program:
    return Program(_GQA(), (torch.randn(2, 5, 8),))


class _Conformer(nn.Module):
    """Feed-forward half step, self-attention (F.multi_head_attention_forward inside nn.MHA),
    depthwise convolution module with GLU and BatchNorm, feed-forward half step, LayerNorm."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.ff1 = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.SiLU(), nn.Linear(2 * d, d))
        self.attn_norm = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 2, dropout=0.0)
        self.conv_norm = nn.LayerNorm(d)
        self.pointwise = nn.Conv1d(d, 2 * d, 1)
        self.depthwise = nn.Conv1d(d, d, 3, padding=1, groups=d)
        self.bn = nn.BatchNorm1d(d)
        self.out_conv = nn.Conv1d(d, d, 1)
        self.ff2 = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.SiLU(), nn.Linear(2 * d, d))
        self.final = nn.LayerNorm(d)

    def forward(self, x, padding):  # x: (time, batch, d)
        x = x + 0.5 * self.ff1(x)
        h = self.attn_norm(x)
        x = x + self.attn(h, h, h, key_padding_mask=padding, need_weights=False)[0]
        h = self.conv_norm(x).permute(1, 2, 0)
        h = F.glu(self.pointwise(h), dim=1)
        h = self.out_conv(F.silu(self.bn(self.depthwise(h))))
        x = x + h.permute(2, 0, 1)
        return self.final(x + 0.5 * self.ff2(x))


@idiom("conformer-block")
def _conformer() -> Program:
    return Program(_Conformer(), (torch.randn(5, 3, 8), _PADDING))
