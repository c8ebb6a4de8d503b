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

    def flat_all(x):
        return x.reshape(-1).sigmoid()

    def softmax(x):
        return x.softmax(-1) * 2

    def sliced(x):
        return x[:, 1 : x.shape[1] - 1].softmax(-1)

    def tril(x):
        return x.unsqueeze(-1) * torch.ones(x.shape[1], x.shape[1]).tril()

    def full(x):
        return x + torch.full((x.shape[0], x.shape[1]), 2.0)

    def zeros(x):
        return torch.cat([x, torch.zeros(x.shape[0], x.shape[1])], 1).cos()

    def arange_from_one(x):
        return x * torch.arange(1, x.shape[1] + 1)

    return [view, arange, half, flat, pad, flat_all, softmax, sliced, tril, full, zeros, arange_from_one]


#: programs whose length stays symbolic: the first length compiles static, the second a template, the rest are
#: re-specialized from it
SYMBOLIC = ("view", "arange", "half", "flat_all", "softmax", "sliced", "tril", "full", "zeros", "arange_from_one")


def test_programs_computing_with_sizes_equal_eager_at_every_length():
    """Every program equals eager at every length. Symbolic: a view with -1, `torch.arange` of a size (and from 1
    to a size + 1), `tril` of a size-square tensor (its arange), a slice to a size (its gradient's padding), the
    half slice, softmax (its meta reads `numel`), `full`/`zeros` of sizes, `reshape(-1)`. Still one compilation
    per length, soundly: the flat reshape's -1 of a product of sizes (thunder's reshape records divisibility
    guards for each length) and the pad's eager kernel, which loses the symbol (a plain int in the trace) and
    which the re-specialization's shape check refuses."""
    counts = {}
    for program in _size_programs():
        jitted = _check_against_eager(program, [(3, 8), (3, 12), (3, 16), (3, 20), (3, 28)])
        counts[program.__name__] = _counts(jitted)
    assert {name: counts[name] for name in SYMBOLIC} == {name: (2, 3) for name in SYMBOLIC}, counts
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


def test_explain_shows_the_symbolic_dims_their_guards_and_why_a_call_compiled_again():
    from thunderplug.commands.explain import dynamic_sizes_lines

    jitted = thunder.jit(_branchy, executors=thunderplug.discover())
    jitted(torch.randn(2, 16))
    assert dynamic_sizes_lines(jitted) == []  # one size: nothing tracked yet
    for length in (32, 48, 100):
        jitted(torch.randn(2, length))
    lines = dynamic_sizes_lines(jitted)
    assert lines[0] == "symbolic sizes: 3 full compilation(s), 1 re-specialized for new sizes", lines
    assert "  symbolic: input 0 dim 1 (every size the guards allow)" in lines, lines
    assert "    guard: [input 0 dim 1] > 64" in lines, lines  # the newest template: the long branch
    assert ("  last compiled again: input 0 dim 1 = 100: the trace depends on [input 0 dim 1] <= 64, which does "
            "not hold") in lines, lines


def test_explain_and_the_recompile_notice_say_which_dim_was_specialized_and_where(recwarn):
    from thunderplug.commands.explain import dynamic_sizes_lines

    def scaled(x):
        return x * float(x.shape[1])

    jitted = thunder.jit(scaled, executors=thunderplug.discover())
    for length in (4, 5, 6, 7):
        x = torch.randn(2, length)
        torch.testing.assert_close(jitted(x), scaled(x), rtol=0, atol=0)
    notices = [w for w in recwarn if issubclass(w.category, thunderplug.RecompileWarning)]
    assert len(notices) == 1, [str(w.message) for w in notices]  # once per function
    message = str(notices[0].message)
    assert "scaled compiles again for every new size" in message and "input 0 dim 1: float()" in message, message
    assert "test_dynamic_sizes.py" in message, message  # the user's line
    lines = dynamic_sizes_lines(jitted)
    assert lines[0] == "symbolic sizes: 4 full compilation(s), 0 re-specialized for new sizes", lines
    assert any(line.startswith("  specialized: input 0 dim 1: float() (at ") for line in lines), lines


def test_thunderplug_explain_prints_the_symbolic_sizes_of_a_script(tmp_path):
    import subprocess
    import sys

    (tmp_path / "varying.py").write_text(
        "import torch, thunder, thunderplug\n"
        "jitted = thunder.jit(lambda x: (x * 2).sum(1), executors=thunderplug.discover())\n"
        "for n in (5, 9, 13):\n"
        "    jitted(torch.randn(2, n))\n"
    )
    result = subprocess.run([sys.executable, "-m", "thunderplug", "explain", "varying.py"], capture_output=True,
                            text=True, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stderr
    assert "symbolic sizes: 2 full compilation(s), 1 re-specialized for new sizes" in result.stdout, result.stdout
    assert "  symbolic: input 0 dim 1 (every size the guards allow)" in result.stdout, result.stdout
