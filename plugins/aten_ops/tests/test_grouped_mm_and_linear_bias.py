"""``torch._grouped_mm`` (transformers' grouped MoE experts) and the bias gradient of ``linear`` on a batched
input (DeBERTa-v2's key projection), forward and backward **bit for bit** (``torch.equal``) against eager."""

from __future__ import annotations

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunderplug

EXPERTS, TOKENS, TOP_K, HIDDEN, FFN = 4, 12, 2, 16, 24


def _grads(fn, inputs, seed=1):
    """``fn(*inputs)`` and the gradients of every input requiring grad, for a fixed random cotangent."""
    leaves = [t for t in inputs if t.requires_grad]
    out = fn(*inputs)
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    return out, torch.autograd.grad(out, leaves, cotangent)


def _assert_as_eager(fn, inputs, **discover):
    expected, expected_grads = _grads(fn, inputs)
    actual, actual_grads = _grads(thunder.jit(fn, executors=thunderplug.discover(**discover)), inputs)
    assert torch.equal(actual, expected)
    for a, e in zip(actual_grads, expected_grads, strict=True):
        assert torch.equal(a, e)


def _moe_experts(hidden, router_logits, gate_up_proj, down_proj):
    """transformers 5's ``grouped_mm_experts_forward`` (Mixtral's experts) with its router: top-k weights
    normalized in place, tokens sorted by expert, offsets from a histogram, two grouped products with
    the experts' weights transposed (column-major views), the results weighted and put back in order."""
    probs = F.softmax(router_logits, dim=-1)
    top_weights, top_index = torch.topk(probs, TOP_K, dim=-1)
    top_weights /= top_weights.sum(dim=-1, keepdim=True)
    expert_ids, perm = torch.sort(top_index.reshape(-1))
    selected = hidden[perm // TOP_K]
    weights = top_weights.reshape(-1)[perm]
    tokens_per_expert = torch.histc(expert_ids.float(), bins=EXPERTS, min=0, max=EXPERTS - 1)
    offsets = torch.cumsum(tokens_per_expert, dim=0, dtype=torch.int32)
    gate, up = torch._grouped_mm(selected, gate_up_proj.transpose(-2, -1), offs=offsets).chunk(2, dim=-1)
    out = torch._grouped_mm(F.silu(gate) * up, down_proj.transpose(-2, -1), offs=offsets)
    out = out * weights.unsqueeze(-1)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.size(0))
    return out[inverse].view(TOKENS, TOP_K, HIDDEN).sum(dim=1)


def _moe_inputs():
    torch.manual_seed(0)
    return (
        torch.randn(TOKENS, HIDDEN, requires_grad=True),
        torch.randn(TOKENS, EXPERTS, requires_grad=True),
        torch.randn(EXPERTS, 2 * FFN, HIDDEN, requires_grad=True),
        torch.randn(EXPERTS, HIDDEN, FFN, requires_grad=True),
    )


def test_grouped_mm_experts_as_eager():
    """thunder 0.2.6's ``torch._grouped_mm`` takes no ``offs`` (``TypeError``) and has no gradient; here
    ATen's kernel runs with eager's derivative, and the router's gradient goes through the in-place
    normalization as eager's does."""
    _assert_as_eager(_moe_experts, _moe_inputs())


def test_grouped_mm_experts_without_grad_as_eager():
    inputs = [t.detach() for t in _moe_inputs()]
    with torch.no_grad():
        expected = _moe_experts(*inputs)
        actual = thunder.jit(_moe_experts, executors=thunderplug.discover())(*inputs)
    assert torch.equal(actual, expected)


def _column_major(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(-2, -1).contiguous().transpose(-2, -1).detach().requires_grad_()


@pytest.mark.parametrize("mat1_layout", ["rows", "columns"])
@pytest.mark.parametrize("mat2_layout", ["rows", "columns"])
def test_grouped_mm_gradients_follow_the_operands_layout(mat1_layout, mat2_layout):
    """Eager's ``_grouped_mm_mat1_backward``/``_mat2_backward`` compute another product (bits apart) for an
    operand stored column by column; each layout gets eager's."""
    torch.manual_seed(0)
    a = torch.randn(TOKENS, HIDDEN, requires_grad=True)
    b = torch.randn(EXPERTS, HIDDEN, FFN, requires_grad=True)
    a = _column_major(a) if mat1_layout == "columns" else a
    b = _column_major(b) if mat2_layout == "columns" else b
    offs = torch.tensor([3, 5, 9, TOKENS], dtype=torch.int32)

    def grouped(a, b):
        return torch._grouped_mm(a, b, offs=offs)

    _assert_as_eager(grouped, (a, b))


def _key_attention(x, weight, bias, query):
    """DeBERTa-v2's content attention: keys by a biased projection, split into heads (``.contiguous()``), scaled
    keys transposed into ``q @ k.T``, softmax. Its key bias's gradient is zero but for rounding (softmax is
    unchanged by a key bias): its bits are those of the order of the sum."""
    batch, length, heads = x.shape[0], x.shape[1], 4
    key = F.linear(x, weight, bias).view(batch, length, heads, -1).permute(0, 2, 1, 3).contiguous()
    key = key.view(batch * heads, length, -1)
    scores = torch.bmm(query, key.transpose(-1, -2) / torch.sqrt(torch.tensor(key.size(-1) * 1.0)))
    return F.softmax(scores, dim=-1)


def _key_inputs():
    torch.manual_seed(0)
    return (
        torch.randn(2, 16, 64, requires_grad=True),
        torch.randn(64, 64, requires_grad=True),
        torch.randn(64, requires_grad=True),
        torch.randn(8, 16, 16, requires_grad=True),
    )


def test_linear_bias_gradient_summed_as_eager():
    """ATen runs a contiguous batched ``linear`` as one ``addmm`` on rows: the bias gradient sums rows of a
    copy of the gradient, where thunder summed the transposed gradient as it arrived."""
    _assert_as_eager(_key_attention, _key_inputs())


def test_thunder_alone_sums_the_bias_gradient_otherwise():
    """Without ``eager_backward_kernels`` the key bias's gradient differs (the test above can fail)."""
    expected, expected_grads = _grads(_key_attention, _key_inputs())
    jitted = thunder.jit(_key_attention, executors=thunderplug.discover(exclude=["eager_backward_kernels"]))
    actual, actual_grads = _grads(jitted, _key_inputs())
    assert torch.equal(actual, expected)
    assert not torch.equal(actual_grads[2], expected_grads[2])
