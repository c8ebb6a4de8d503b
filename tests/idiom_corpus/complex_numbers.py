"""Complex numbers: Meta's reference RoPE (torch.polar, view_as_complex), an FNO spectral layer with
torch.fft.rfft2 and complex parameters, complex magnitudes."""

from __future__ import annotations

import torch
from torch import nn

from .program import Program, idiom


def _rope_frequencies(dim: int, length: int, theta: float = 10000.0) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    angles = torch.outer(torch.arange(length).float(), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def _apply_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    rotated = torch.view_as_real(pairs * freqs.view(1, freqs.shape[0], 1, freqs.shape[1])).flatten(3)
    return rotated.type_as(x)


class _RoPEAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.out = nn.Linear(8, 8)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 2, 4).unbind(2)
        freqs = _rope_frequencies(4, t)
        q, k = _apply_rope(q, freqs), _apply_rope(k, freqs)
        scores = (q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2)) / 2.0
        attn = scores.softmax(-1) @ v.transpose(1, 2)
        return self.out(attn.transpose(1, 2).reshape(b, t, 8))


@idiom("rope-polar-view_as_complex")
def _rope() -> Program:
    return Program(_RoPEAttention(), (torch.randn(2, 6, 8),))


class _SpectralConv(nn.Module):
    def __init__(self, channels: int = 3, modes: int = 3):
        super().__init__()
        self.modes = modes
        scale = 1 / channels
        self.weight = nn.Parameter(scale * torch.randn(channels, channels, modes, modes, dtype=torch.cfloat))
        self.lift, self.skip = nn.Conv2d(1, channels, 1), nn.Conv2d(channels, channels, 1)
        self.project = nn.Conv2d(channels, 1, 1)

    def forward(self, x):
        h = self.lift(x)
        spectrum = torch.fft.rfft2(h)
        out = torch.zeros_like(spectrum)
        m = self.modes
        out[:, :, :m, :m] = torch.einsum("bixy,ioxy->boxy", spectrum[:, :, :m, :m], self.weight)
        h = torch.fft.irfft2(out, s=h.shape[-2:]) + self.skip(h)
        return self.project(torch.nn.functional.gelu(h))


@idiom("fno-rfft2-complex-parameters")
def _fno() -> Program:
    return Program(_SpectralConv(), (torch.randn(2, 1, 8, 8),))


class _ComplexLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4, dtype=torch.cfloat) / 2)

    def forward(self, x):
        z = torch.complex(x, x.flip(-1)) @ self.weight
        return z.abs() + torch.angle(z)


@idiom("complex-abs-angle")
def _complex_linear() -> Program:
    return Program(_ComplexLinear(), (torch.randn(3, 4),))
