"""torchao quantization-aware training: fake-quantized linears trained with AdamW."""

from __future__ import annotations

import torch
from torch import nn

from .program import Program, idiom


@idiom("torchao-QAT-int8-act-int4-weight")
def _qat() -> Program:
    from torchao.quantization import quantize_
    from torchao.quantization.qat import IntxFakeQuantizeConfig, QATConfig

    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))
    activations = IntxFakeQuantizeConfig(torch.int8, "per_token", is_symmetric=False)
    weights = IntxFakeQuantizeConfig(torch.int4, group_size=16)
    quantize_(model, QATConfig(activation_config=activations, weight_config=weights, step="prepare"))
    return Program(model, (torch.randn(4, 32),))


@idiom("fake_quantize_per_tensor_affine")
def _fake_quant() -> Program:
    class _FakeQuant(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            w = torch.fake_quantize_per_tensor_affine(self.lin.weight, 0.05, 0, -128, 127)
            return nn.functional.linear(torch.fake_quantize_per_tensor_affine(x, 0.1, 0, -128, 127), w, self.lin.bias)

    return Program(_FakeQuant(), (torch.randn(4, 8),))
