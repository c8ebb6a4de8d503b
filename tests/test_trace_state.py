"""Autocast and the other torch state a traced graph depends on (issue 24, item 2): a function
compiled in one state and called in another, or another function compiled later, computes what
eager computes, forward and backward. The process-wide caches (unrolled graphs, recorded replays,
checked ATen metas) are keyed by that state."""

from __future__ import annotations

import contextlib
import copy

import pytest
import thunder
import torch
from subclasses import StateTensor
from test_subclass_inference import assert_same
from torch.testing._internal.two_tensor import TwoTensor

import thunderplug
from thunderplug.wiring import patches

BF16 = torch.bfloat16


def autocast(enabled: bool = True, dtype: torch.dtype = BF16):
    return torch.autocast("cpu", dtype=dtype) if enabled else contextlib.nullcontext()


def two_tensor(*shape, requires_grad=False):
    return TwoTensor(torch.randn(*shape), torch.randn(*shape)).requires_grad_(requires_grad)


def linear_twice(x, w):
    return torch.nn.functional.linear(x, w) * 2


def matmul_sin(x, w):
    return (x @ w.t()).sin()


def run(fn, x, w, under_autocast, dtype=BF16):
    """Output and the gradients of (x, w), the backward outside autocast (as eager training does)."""
    x, w = x.detach().clone().requires_grad_(x.requires_grad), w.detach().clone().requires_grad_(w.requires_grad)
    with autocast(under_autocast, dtype):
        out = fn(x, w)
    grads = torch.autograd.grad(out.sum(), [t for t in (x, w) if t.requires_grad])
    return out, grads


def check(jitted, fn, x, w, under_autocast, dtype=BF16):
    actual, actual_grads = run(jitted, x, w, under_autocast, dtype)
    expected, expected_grads = run(fn, x, w, under_autocast, dtype)
    assert expected.dtype == (dtype if under_autocast else torch.float32)
    assert_same(actual, expected)
    assert_same(list(actual_grads), list(expected_grads))


def test_two_tensor_compiled_outside_autocast_and_called_inside_it_matches_eager():
    x, w = two_tensor(4, 8, requires_grad=True), torch.randn(3, 8, requires_grad=True)
    jitted = thunder.jit(linear_twice, executors=thunderplug.discover())
    for under_autocast, dtype in ((False, BF16), (True, BF16), (True, torch.float16), (False, BF16)):
        check(jitted, linear_twice, x, w, under_autocast, dtype)


def test_functions_compiled_later_in_another_autocast_state_do_not_reuse_graphs():
    """The graph cache is process-wide: one function's plain graph must not serve another's
    autocast call, nor an autocast graph a later plain call."""
    x, w = two_tensor(4, 8), torch.randn(3, 8, requires_grad=True)
    for first in (False, True):
        for under_autocast in (first, not first):
            check(thunder.jit(matmul_sin, executors=thunderplug.discover()), matmul_sin, x, w, under_autocast)


def test_autocast_inside_the_jitted_function_applies_to_subclass_ops_forward_and_backward():
    """The op is re-emitted by autodiff after the block ended: the autocast travels with its symbol."""

    def fn(x, w):
        with torch.autocast("cpu", dtype=BF16):
            y = torch.nn.functional.linear(x, w)
        return y * x.sum()

    x, w = two_tensor(4, 8, requires_grad=True), torch.randn(3, 8, requires_grad=True)
    jitted = thunder.jit(fn, executors=thunderplug.discover())
    actual, actual_grads = run(jitted, x, w, False)
    expected, expected_grads = run(fn, x, w, False)
    assert_same(actual, expected)
    assert_same(list(actual_grads), list(expected_grads))


@pytest.mark.parametrize("executors", ["stock", "discover"])
def test_a_plain_call_after_an_autocast_call_is_not_autocast(executors):
    """thunder bug fixed by the patch "autocast state per call": each call under autocast pushed the
    caller's autocast onto the function's stack and never popped it."""
    patches.install()
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    jitted = thunder.jit(linear_twice, **({} if executors == "stock" else {"executors": thunderplug.discover()}))
    for _ in range(3):
        with autocast():
            assert jitted(x, w).dtype == BF16
    plain = jitted(x, w)
    assert plain.dtype == torch.float32
    torch.testing.assert_close(plain, linear_twice(x, w))
    assert thunder.compile_data(jitted).autocast_stack.is_empty()


def test_float8_training_under_autocast_matches_eager():
    """With discover()'s float8 plugin (torchao's Function traced whole). Without it, thunder
    interprets the Function's backward while tracing, under the caller's autocast (not fixed)."""
    float8 = pytest.importorskip("torchao.float8")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    eager = float8.convert_to_float8_training(copy.deepcopy(model))
    compiled = thunder.jit(float8.convert_to_float8_training(copy.deepcopy(model)), executors=thunderplug.discover())
    x = torch.randn(16, 32)
    for under_autocast in (False, True, False):
        outs = []
        for module in (eager, compiled):
            with autocast(under_autocast):
                out = module(x)
            out.float().sum().backward()
            outs.append(out)
        assert outs[1].dtype == outs[0].dtype == (BF16 if under_autocast else torch.float32)
        torch.testing.assert_close(outs[1], outs[0])
        for p, q in zip(eager.parameters(), compiled.parameters()):
            torch.testing.assert_close(q.grad, p.grad)
            p.grad = q.grad = None


# -- every other ingredient of the key: a subclass whose mul reads it (tests/subclasses.py) -------


def state_mul(x):
    return x * 3


def _state_tensor():
    return StateTensor(torch.randn(4, 3))


@contextlib.contextmanager
def deterministic():
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


@contextlib.contextmanager
def default_dtype_float64():
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(torch.float32)


@contextlib.contextmanager
def cudnn_benchmark():
    with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled, benchmark=True):
        yield


@contextlib.contextmanager
def mkldnn_disabled():
    with torch.backends.mkldnn.flags(enabled=False):
        yield


STATES = {
    "grad mode": torch.no_grad,
    "deterministic mode": deterministic,
    "default dtype": default_dtype_float64,
    "cudnn.benchmark": cudnn_benchmark,
    "mkldnn.enabled": mkldnn_disabled,
}


@pytest.mark.parametrize("state", sorted(STATES))
def test_graphs_traced_in_one_state_are_not_reused_in_another(state):
    x = _state_tensor()
    for first_in_state in (False, True):
        for in_state in (first_in_state, not first_in_state):  # a new function each time: only the caches are shared
            jitted = thunder.jit(state_mul, executors=thunderplug.discover())
            with STATES[state]() if in_state else contextlib.nullcontext():
                actual, expected = jitted(x), state_mul(x)
            assert_same(actual, expected)
