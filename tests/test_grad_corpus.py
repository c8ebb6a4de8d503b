"""Gradients of implicitly broadcast 0-dim tensors (issue 8) and a generated differential corpus.

* The issue's examples are right under ``thunder.jit(fn, executors=thunderplug.discover())``.
* They are still wrong (or crash) under plain ``thunder.jit`` and under ``discover()`` without the
  ``thunderplug_broadcast_grads`` executor, so the override is what makes the difference; when
  thunder fixes it upstream, ``test_upstream_still_broken`` fails and the override can go.
* The corpus (tests/grad_corpus.py) compares seeded random programs with eager, forward and
  backward. 200 programs by default; ``pytest --long`` runs 3000. A failure is excused only by a
  documented :data:`grad_corpus.KNOWN_ISSUES` entry (docs/known-issues.md), reported as xfail.
"""

from __future__ import annotations

import grad_corpus
import pytest
import thunder
import torch

import thunderplug
from thunderplug.eager import broadcast_grads

DEFAULT_PROGRAMS = 200
LONG_PROGRAMS = 3000


def pytest_generate_tests(metafunc):
    if "corpus_seed" in metafunc.fixturenames:
        n = LONG_PROGRAMS if metafunc.config.getoption("--long", default=False) else DEFAULT_PROGRAMS
        metafunc.parametrize("corpus_seed", range(n))


@pytest.fixture(scope="module")
def plug_executors():
    return thunderplug.discover()


@pytest.fixture(scope="module")
def executors_without_override():
    # eager_backward_kernels takes maximum, pow... whole (ATen kernels broadcast themselves), so the
    # prims the override corrects are only reached without it
    executors = thunderplug.discover(exclude=[broadcast_grads.EXECUTOR_NAME, "eager_backward_kernels"])
    assert broadcast_grads.EXECUTOR_NAME not in [ex.name for ex in executors]
    return executors


# --- the issue's examples ---------------------------------------------------------------------
# (name, fn, shapes of the float inputs)
ISSUE_CASES = [
    ("add_sum", lambda x: (x + x.sum()).sum(), [(3, 4)]),
    ("mul_sum", lambda x: (x * x.sum()).sum(), [(3, 4)]),
    ("t_add_sum_sin", lambda x: (x.t() + x.sum()).sin().sum(), [(3, 4)]),
    ("where_sum", lambda x, y: torch.where(x > 0, x, y.sum()), [(3, 4), (2, 2)]),
    ("sub_mean_pow", lambda x, y: (x - y.mean()).pow(2).sum(), [(3, 4), (2, 2)]),
    ("div_abs_amax", lambda x, y: (x / y.abs().amax()).sum(), [(3, 4), (2, 2)]),
    ("mul_index", lambda x, y: (x * y[0, 0]).sum(), [(3, 4), (2, 2)]),
    ("maximum_min", lambda x, y: torch.maximum(x, y.min()), [(3, 4), (2, 2)]),
]
# More ways the same prims see a 0-dim tensor: methods, reversed operands, two 0-dim operands,
# mixed dtypes, ops that decompose into the affected prims.
MORE_CASES = [
    ("scalar_param_scale_f32", lambda x, w: x * w[0, 0] + w[1, 1], [(5, 3), (2, 2)]),
    ("reversed_div", lambda x, y: y.sum() / (x.abs() + 1), [(3, 4), (2, 2)]),
    ("rsub_alpha", lambda x, y: torch.sub(y.sum(), x, alpha=2), [(3, 4), (2, 2)]),
    ("pow_scalar_base", lambda x, y: torch.pow(y.abs().sum() + 0.5, x), [(3, 4), (2, 2)]),
    ("pow_scalar_exp", lambda x, y: (x.abs() + 0.5).pow(y.mean()), [(3, 4), (2, 2)]),
    ("where_two_scalars", lambda x, y: torch.where(x > 0, y.sum(), y.mean()) * x, [(3, 4), (2, 2)]),
    ("masked_fill", lambda x, y: x.masked_fill(x > 0, y.sum()), [(3, 4), (2, 2)]),
    ("clamp_tensors", lambda x, y: torch.clamp(x, min=y.min()), [(3, 4), (2, 2)]),
    ("addcmul", lambda x, y: torch.addcmul(x, y.sum(), x), [(3, 4), (2, 2)]),
    ("atan2", lambda x, y: torch.atan2(x, y.sum()), [(3, 4), (2, 2)]),
    ("fmod", lambda x, y: torch.fmod(x, y.abs().sum() + 0.5), [(3, 4), (2, 2)]),
    ("softmax_temperature", lambda x, y: torch.softmax(x / y.abs().sum(), -1), [(3, 4), (2, 2)]),
    ("softplus_scaled", lambda x, y: torch.nn.functional.softplus(x * y[0, 0]), [(3, 4), (2, 2)]),
    ("where_scalar_pred", lambda x, y: torch.where(y.sum() > 0, x, x * 2), [(3, 4), (2, 2)]),
    ("where_scalar_pred_and_value", lambda x, y: torch.where(y.sum() > 0, x, y[0, 0]), [(3, 4), (2, 2)]),
    ("same_scalar_twice", lambda x, y: torch.where(x > 0, y.sum(), y.sum() * 2) + x, [(3, 4), (2, 2)]),
    ("size_one_dims", lambda x, y: (x * y.mean()).sum(0), [(1, 4, 1), (3,)]),
]


def _params(cases):
    return [pytest.param(fn, shapes, id=name) for name, fn, shapes in cases]


def _compare(fn, shapes, executors=None, dtype=torch.float64):
    """(forward matches, grads match) vs eager; raises what thunder raises."""
    gen = torch.Generator().manual_seed(0)
    eager_inputs = [torch.randn(s, generator=gen, dtype=dtype, requires_grad=True) for s in shapes]
    jit_inputs = [t.detach().clone().requires_grad_(True) for t in eager_inputs]
    expected = fn(*eager_inputs)
    cotangent = torch.randn(expected.shape, generator=gen, dtype=expected.dtype)
    expected_grads = torch.autograd.grad(expected, eager_inputs, cotangent, allow_unused=True)
    expected_grads = [torch.zeros_like(t) if g is None else g for g, t in zip(expected_grads, eager_inputs)]
    jitted = thunder.jit(fn) if executors is None else thunder.jit(fn, executors=executors)
    actual = jitted(*jit_inputs)
    actual_grads = torch.autograd.grad(actual, jit_inputs, cotangent, allow_unused=True)
    forward_ok = torch.allclose(actual, expected)
    actual_grads = [torch.zeros_like(t) if g is None else g for g, t in zip(actual_grads, jit_inputs)]
    grads_ok = all(a.shape == e.shape and torch.allclose(a, e) for a, e in zip(actual_grads, expected_grads))
    return forward_ok, grads_ok


def _wrong_or_raises(fn, shapes, executors=None) -> bool:
    try:
        forward_ok, grads_ok = _compare(fn, shapes, executors)
    except Exception:  # noqa: BLE001 - the expand errors, NotImplementedError... all count as broken
        return True
    return not (forward_ok and grads_ok)


@pytest.mark.parametrize(("fn", "shapes"), _params(ISSUE_CASES + MORE_CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_fixed_under_discover(fn, shapes, dtype, plug_executors):
    assert _compare(fn, shapes, plug_executors, dtype) == (True, True)


# 0-dim tensor inputs broadcast by one prim, as thunder's test_phantom_grad_vs_torch_consistency_{add,mul}
# samples have them (a (4, 4) and a () tensor)
ZERO_DIM_INPUT_CASES = [
    ("add", lambda x, s: x + s, [(4, 4), ()]),
    ("add_reversed", lambda x, s: s + x, [(4, 4), ()]),
    ("mul", lambda x, s: x * s, [(4, 4), ()]),
    ("sub_alpha", lambda x, s: torch.sub(x, s, alpha=2), [(4, 4), ()]),
    ("where", lambda x, s: torch.where(x > 0, x, s), [(4, 4), ()]),
    ("used_twice", lambda x, s: x * s + s, [(4, 4), ()]),
]


@pytest.mark.parametrize(("fn", "shapes"), _params(ZERO_DIM_INPUT_CASES))
def test_thunder_grad_transform_under_discover(fn, shapes, plug_executors):
    """``thunder.core.transforms.grad`` (what thunder's own grad tests call) splits each rule into a
    forward and a backward (``vjp_utils``); the override's rule must survive that split too (it once
    read the expanded operand's gradient back with ``get_grad``: ``KeyError: 't5'``)."""
    from thunder.core.transforms import grad

    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(s, generator=gen, requires_grad=True) for s in shapes]
    expected = fn(*inputs)
    expected_grads = torch.autograd.grad(expected, inputs, torch.ones_like(expected))
    torch.testing.assert_close(thunder.jit(fn, executors=plug_executors)(*inputs), expected)
    actual_grads = grad(thunder.jit(fn, executors=plug_executors))(*inputs)
    assert len(actual_grads) == len(expected_grads)
    for actual, wanted in zip(actual_grads, expected_grads):
        assert actual.shape == wanted.shape
        torch.testing.assert_close(actual, wanted)


@pytest.mark.parametrize(("fn", "shapes"), _params(ISSUE_CASES))
def test_upstream_still_broken(fn, shapes):
    """Plain thunder.jit still gets these wrong: if this fails, thunder fixed issue 8 upstream."""
    assert _wrong_or_raises(fn, shapes), "plain thunder.jit is now correct here: revisit broadcast_grads"


@pytest.mark.parametrize(("fn", "shapes"), _params(ISSUE_CASES))
def test_override_is_what_fixes_it(fn, shapes, executors_without_override):
    assert _wrong_or_raises(fn, shapes, executors_without_override)


def test_silently_wrong_without_override_not_just_crashing(executors_without_override):
    """The worst form of the bug: no error, wrong numbers."""
    fn = lambda x: (x + x.sum()).sum()  # noqa: E731
    assert _compare(fn, [(3, 4)], executors_without_override) == (True, False)


def test_override_only_answers_for_implicit_broadcasts(plug_executors):
    """Same-shape operands, numbers and 0-dim results keep thunder's own rules and traces."""
    assert plug_executors[1] is broadcast_grads.executor()
    x = torch.randn(3, 4, requires_grad=True)
    jitted = thunder.jit(lambda x: (x * 2.0 + x).sin().sum() * x.sum(), executors=plug_executors)
    jitted(x).backward()
    trace = str(thunder.last_traces(jitted)[-1])
    assert "thunderplug_broadcast" not in trace
    ex = broadcast_grads.executor()
    assert set(broadcast_grads.overridden_prims()) >= {
        thunder.core.prims.PrimIDs.ADD,
        thunder.core.prims.PrimIDs.MUL,
        thunder.core.prims.PrimIDs.WHERE,
        thunder.core.prims.PrimIDs.MAXIMUM,
    }
    assert not ex.can_fuse(thunder.last_traces(jitted)[0].bound_symbols[-1])


def test_plain_jit_untouched():
    """Importing thunderplug and building the executor does not change thunder's global rules."""
    from thunder.core.prims import PrimIDs
    from thunder.core.transforms import _grad_fn_map

    before = _grad_fn_map[PrimIDs.ADD]
    broadcast_grads.executor()
    assert _grad_fn_map[PrimIDs.ADD] is before
    assert _wrong_or_raises(lambda x: (x + x.sum()).sum(), [(3, 4)])


def test_inference_unchanged(plug_executors):
    """Without grad the executor is never consulted; results match eager."""
    x, y = torch.randn(3, 4), torch.randn(2, 2)
    fn = lambda x, y: torch.maximum(x, y.min()) * y[0, 0]  # noqa: E731
    torch.testing.assert_close(thunder.jit(fn, executors=plug_executors)(x, y), fn(x, y))


def test_unsupported_prim_is_a_clear_error():
    """Where thunder has no rule at all (prims.remainder, without eager_backward_kernels, which differentiates it
    with eager's rule) the error names the prim, never a wrong grad."""
    x, y = torch.randn(3, 4, requires_grad=True), torch.randn(2, 2, requires_grad=True)
    executors = thunderplug.discover(exclude=["eager_backward_kernels"], quiet=True)
    jitted = thunder.jit(lambda x, y: torch.remainder(x, y.max()), executors=executors)
    with pytest.raises(RuntimeError, match=r"Failed to find a gradient transform .*prims\.remainder"):
        jitted(x, y)


def test_unusable_upstream_rule_is_a_clear_error():
    """If thunder's backward for an overridden prim has a shape we cannot map back to the operands,
    the override raises a NotImplementedError naming the prim instead of guessing."""
    from thunder.core.prims import PrimIDs
    from thunder.core.transforms import augmented_forward_impls, backward_impls

    # ZETA's backward returns a mapping (thunder 0.2.6): exactly the case the override refuses.
    joint = broadcast_grads._aug_fwd_joint(PrimIDs.ZETA)
    assert augmented_forward_impls[PrimIDs.ZETA] and backward_impls[PrimIDs.ZETA]
    from thunder.core.proxies import TensorProxy
    from thunder.core.trace import TraceCtx, tracectx

    with tracectx(TraceCtx()):
        x = TensorProxy(shape=(3,), device=thunder.devices.cpu, dtype=thunder.dtypes.float64)
        q = TensorProxy(shape=(3,), device=thunder.devices.cpu, dtype=thunder.dtypes.float64)
        with pytest.raises(NotImplementedError, match="ZETA"):
            joint(x, q)


# --- the generated corpus ---------------------------------------------------------------------


def test_corpus(corpus_seed, plug_executors):
    program = grad_corpus.generate(corpus_seed)
    outcome = grad_corpus.run(program, lambda fn: thunder.jit(fn, executors=plug_executors))
    if outcome.ok:
        return
    issue = grad_corpus.known_issue(program, outcome)
    if issue is not None:
        pytest.xfail(f"{issue.key}: {issue.reason}")
    pytest.fail(f"seed {corpus_seed}: {outcome.status} ({outcome.detail})\n{program.reproduction()}")
