"""Gradients whose bits depend on the order eager's autograd sums them, forward and backward **bit for bit**
(``torch.equal``) against eager: SDPA with an additive mask requiring grad (T5's and Swin's position biases: eager
runs ATen's math composite), a broadcast ``gamma * x`` on a permuted cotangent and a ``mean`` before it
(ConvNeXt's layer scale and pooler). Each differed under thunder's own rules (figures in each test)."""

from __future__ import annotations

import thunder
import torch
import torch.nn.functional as F

import thunderplug


def _grads(module, x):
    module.zero_grad(set_to_none=True)
    out = module(x)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)))
    return out, {name: p.grad.clone() for name, p in module.named_parameters()}


def _assert_as_eager(module, x):
    expected, expected_grads = _grads(module, x)
    actual, actual_grads = _grads(thunder.jit(module, executors=thunderplug.discover()), x)
    assert torch.equal(actual, expected)
    for name, e in expected_grads.items():
        assert torch.equal(actual_grads[name], e), (name, (actual_grads[name] - e).abs().max())


class _BiasedAttention(torch.nn.Module):
    """Self-attention whose additive mask is a learned bias (a relative position bias): eager's SDPA picks its
    math backend, as the mask requires grad."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(32, 96)
        self.bias = torch.nn.Parameter(torch.randn(1, 4, 8, 8))

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, 4, 8).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias * 2)
        return out.transpose(1, 2).reshape(b, n, 32)


def test_sdpa_with_a_mask_requiring_grad_as_eager():
    """thunder's decomposition: the mask's gradient 8.3e-7 off eager's, the projection's 3.7e-7."""
    torch.manual_seed(0)
    _assert_as_eager(_BiasedAttention(), torch.randn(2, 8, 32))


class _LayerScale(torch.nn.Module):
    """ConvNeXt's block: channels last, a linear, a per-channel scale, channels first again; ``pool`` ends in
    its pooler's mean over (h, w)."""

    def __init__(self, pool: bool):
        super().__init__()
        self.pool = pool
        self.linear = torch.nn.Linear(16, 16)
        self.gamma = torch.nn.Parameter(torch.rand(16))

    def forward(self, x):
        features = self.gamma * self.linear(x.permute(0, 2, 3, 1))
        out = x + features.permute(0, 3, 1, 2)
        return out.mean([-2, -1]) if self.pool else out


def test_a_broadcast_product_on_a_permuted_cotangent_as_eager():
    """``gamma``'s gradient sums ``grad * x`` in ``grad``'s (permuted) layout, as eager's ``grad * other``;
    thunder's ``x * grad`` is laid out as ``x``: 7.6e-6 apart."""
    torch.manual_seed(0)
    _assert_as_eager(_LayerScale(pool=False), torch.randn(2, 16, 8, 8))


def test_a_layer_scale_before_a_mean_as_eager():
    """eager's ``mean`` backward expands its cotangent, then divides; thunder's divides, then expands (a stride-0
    cotangent), and ``gamma``'s gradient was summed in another order: ConvNeXt's first-step drift."""
    torch.manual_seed(0)
    _assert_as_eager(_LayerScale(pool=True), torch.randn(2, 16, 8, 8))
