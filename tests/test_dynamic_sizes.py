"""Symbolic input dimensions under discover() (issue 44): one compilation per relation the trace depends on,
re-specialized for each new size, every value and gradient bit-identical to eager."""

from __future__ import annotations

import thunder
import torch
import torch.nn.functional as F
from torch import nn

import thunderplug
from thunderplug.caching import dynamic_sizes


def _counts(jitted) -> tuple[int, int]:
    return dynamic_sizes.stats(thunder.compile_data(jitted))


def _check_against_eager(fn, shapes, *, seed: int = 0) -> object:
    """Call ``fn`` jitted under discover() on inputs of ``shapes``: outputs and input gradients bit-identical
    to eager's at every call. Returns the jitted function."""
    jitted = thunder.jit(fn, executors=thunderplug.discover())
    torch.manual_seed(seed)
    for shape in shapes:
        x = torch.randn(*shape)
        x_eager, x_jit = x.clone().requires_grad_(), x.clone().requires_grad_()
        expected, actual = fn(x_eager), jitted(x_jit)
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
        grad = torch.randn_like(expected)
        expected.backward(grad)
        actual.backward(grad)
        torch.testing.assert_close(x_jit.grad, x_eager.grad, rtol=0, atol=0)
    return jitted


def _branchy(x):
    if x.shape[1] > 64:
        return x.sin() * 2
    return x.cos() + 1


def test_branch_on_a_size_compiles_again_where_the_guard_fails_and_reuses_where_it_holds():
    jitted = thunder.jit(_branchy, executors=thunderplug.discover())
    seen = []
    for length in (16, 32, 48, 100, 40):
        x = torch.randn(2, length, requires_grad=True)
        xe = x.detach().clone().requires_grad_()
        out, expected = jitted(x), _branchy(xe)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        out.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(x.grad, xe.grad, rtol=0, atol=0)
        seen.append(_counts(jitted))
    # 16: static, 32: the template (dim 1 seen twice), 48: re-specialized, 100: crosses `> 64`: compiled again,
    # 40: re-specialized from the first template
    assert seen == [(1, 0), (2, 0), (2, 1), (3, 1), (3, 2)]
    reason = dynamic_sizes.function_state(thunder.compile_data(jitted)).last_reason
    assert "input 0 dim 1 = 100: the trace depends on [input 0 dim 1] <= 64, which does not hold" in reason


def _size_programs():
    def view(x):
        return x.view(x.shape[0], -1, 4).tanh().sum(-1)

    def arange(x):
        return x * torch.arange(x.shape[1], dtype=x.dtype)

    def half(x):
        return x[:, : x.shape[1] // 2].exp()

    def flat(x):
        return x.reshape(x.shape[0] * x.shape[1], -1).sigmoid()

    def pad(x):
        return F.pad(x, (0, x.shape[1] % 3 + 1)) * 3

    return [view, arange, half, flat, pad]


def test_programs_computing_with_sizes_equal_eager_at_every_length():
    """Every program equals eager at every length; the view is re-specialized. The others compile per
    length today, soundly: `torch.arange` (thunder computes its length with floats) and the half slice
    (an int() in thunder's getitem) specialize; the flat reshape's -1 and the pad's eager kernel lose
    the symbol (a plain int in the trace), which the re-specialization's shape check refuses."""
    counts = {}
    for program in _size_programs():
        jitted = _check_against_eager(program, [(3, 8), (3, 12), (3, 16), (3, 20), (3, 28)])
        counts[program.__name__] = _counts(jitted)
    assert counts["view"] == (2, 3), counts
    assert all(full + respecialized == 5 for full, respecialized in counts.values()), counts


def test_sizes_converted_to_int_or_used_in_range_specialize_and_stay_correct():
    def with_int(x):
        return x * int(x.shape[1])

    def with_range(x):
        total = x[:, 0]
        for i in range(1, x.shape[1]):
            total = total + x[:, i]
        return total

    for program in (with_int, with_range):
        jitted = _check_against_eager(program, [(2, 4), (2, 5), (2, 6), (2, 7)])
        full, respecialized = _counts(jitted)
        assert (full, respecialized) == (4, 0), program.__name__


def test_mark_dynamic_makes_the_first_compilation_a_template():
    jitted = thunder.jit(lambda x: (x * 2).sum(1), executors=thunderplug.discover())
    for length in (5, 9, 13):
        x = torch.randn(2, length)
        torch._dynamo.mark_dynamic(x, 1)
        torch.testing.assert_close(jitted(x), (x * 2).sum(1), rtol=0, atol=0)
    assert _counts(jitted) == (1, 2)


def test_a_module_trains_with_varying_lengths_as_in_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))
    reference = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))
    reference.load_state_dict(model.state_dict())
    jitted = thunder.jit(model, executors=thunderplug.discover())
    opt, opt_ref = torch.optim.AdamW(model.parameters()), torch.optim.AdamW(reference.parameters())
    for length in (6, 10, 14, 6, 18):
        x = torch.randn(4, length, 8)
        loss, loss_ref = jitted(x).square().mean(), reference(x).square().mean()
        torch.testing.assert_close(loss, loss_ref, rtol=0, atol=0)
        loss.backward()
        loss_ref.backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)
        opt.step(), opt_ref.step(), opt.zero_grad(), opt_ref.zero_grad()
    full, respecialized = _counts(jitted)
    assert full == 2 and respecialized == 2, (full, respecialized)


def test_stock_thunder_is_unchanged():
    jitted = thunder.jit(lambda x: x * 2)
    for length in (3, 4, 5):
        jitted(torch.randn(2, length))
    assert thunder.cache_misses(jitted) == 3 and _counts(jitted) == (0, 0)
