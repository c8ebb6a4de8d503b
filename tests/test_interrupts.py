"""KeyboardInterrupt and SystemExit leave thunder.jit as themselves (issue 24, item 5), while the
function compiles and while it runs, and the next call compiles and runs as eager: nothing of the
interrupted compilation stays behind (torch modes, autocast, grad mode, collector thresholds)."""

from __future__ import annotations

import gc
import signal
import sys

import pytest
import thunder
import torch
from test_subclass_inference import assert_same
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

import thunderplug
from thunderplug.wiring import patches

INTERRUPTS = {
    # what Ctrl-C does: SIGINT's default handler raises KeyboardInterrupt at the next bytecode,
    # here while thunder's interpreter runs the opaque call
    "KeyboardInterrupt": (KeyboardInterrupt, lambda: signal.raise_signal(signal.SIGINT)),
    "SystemExit": (SystemExit, lambda: sys.exit(3)),
}


@pytest.fixture(autouse=True)
def _sigint_raises_keyboard_interrupt():
    """SIGINT raises KeyboardInterrupt, as in a terminal, also where the test process started with SIGINT
    ignored (a shell's background job)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


class Switch:
    """Raises the chosen interrupt while on."""

    def __init__(self, raise_it):
        self.on, self.raise_it = True, raise_it

    def __call__(self):
        if self.on:
            self.raise_it()


def executors_of(kind):
    return {} if kind == "stock" else {"executors": thunderplug.discover()}


def clean_state():
    return (
        _get_current_dispatch_mode(),
        torch.is_grad_enabled(),
        torch.is_autocast_enabled("cpu"),
        gc.get_threshold(),
        torch._C._functorch.maybe_current_level(),
    )


def check_interrupted_then_clean(jitted, fn, inputs, exception, switch):
    patches.install()
    before = clean_state()
    with pytest.raises(exception):
        jitted(*inputs)
    assert clean_state() == before
    switch.on = False
    actual, expected = jitted(*inputs), fn(*inputs)
    assert_same(actual, expected)
    grads = [torch.autograd.grad(out, inputs[0], torch.ones_like(out)) for out in (actual, expected)]
    assert_same(list(grads[0]), list(grads[1]))


@pytest.mark.parametrize("kind", ["stock", "discover"])
@pytest.mark.parametrize("interrupt", sorted(INTERRUPTS))
def test_an_interrupt_in_an_opaque_call_while_tracing_leaves_as_itself(kind, interrupt):
    exception, raise_it = INTERRUPTS[interrupt]
    switch = Switch(raise_it)

    def fn(x):
        y = x.sin()
        switch()
        return y * 2

    patches.install()
    check_interrupted_then_clean(thunder.jit(fn, **executors_of(kind)), fn, [torch.randn(3, requires_grad=True)],
                                 exception, switch)


class InterruptingTensor(TwoTensor):
    """A TwoTensor whose dispatch raises the test's interrupt while ``switch`` is on: an interrupt
    while thunderplug traces a subclass op on fakes (make_fx, the fake mode, the graph cache lock)."""

    switch: Switch | None = None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return InterruptingTensor(inner["a"], inner["b"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if cls.switch is not None and func is torch.ops.aten.mul.Tensor:
            cls.switch()
        kwargs = kwargs or {}
        unwrap = lambda attr: [getattr(a, attr) if isinstance(a, InterruptingTensor) else a for a in args]  # noqa: E731
        out_a, out_b = func(*unwrap("a"), **kwargs), func(*unwrap("b"), **kwargs)
        if isinstance(out_a, torch.Tensor) and out_a.shape == out_b.shape:
            return InterruptingTensor(out_a, out_b)
        return out_a


@pytest.mark.parametrize("interrupt", sorted(INTERRUPTS))
def test_an_interrupt_while_a_subclass_op_is_traced_leaves_as_itself(interrupt):
    exception, raise_it = INTERRUPTS[interrupt]
    InterruptingTensor.switch = switch = Switch(raise_it)
    try:

        def fn(w, x):
            return x * w

        n = 3 + sorted(INTERRUPTS).index(interrupt)  # a shape of its own: graphs are cached per process
        x = InterruptingTensor(torch.randn(n), torch.randn(n))
        check_interrupted_then_clean(thunder.jit(fn, executors=thunderplug.discover()), fn,
                                     [torch.randn(n, requires_grad=True), x], exception, switch)
    finally:
        InterruptingTensor.switch = None


_RUNTIME_SWITCH = Switch(lambda: None)


@torch.library.custom_op("thunderplug_tests::maybe_interrupt", mutates_args=())
def maybe_interrupt(x: torch.Tensor) -> torch.Tensor:
    _RUNTIME_SWITCH()
    return x.clone()


@maybe_interrupt.register_fake
def _(x):
    return torch.empty_like(x)


maybe_interrupt.register_autograd(lambda ctx, grad: grad)


@pytest.mark.parametrize("interrupt", sorted(INTERRUPTS))
def test_an_interrupt_while_the_compiled_function_runs_leaves_as_itself(interrupt):
    """A custom op runs as itself (a fallback symbol): its Python kernel runs in the compiled call."""
    exception, raise_it = INTERRUPTS[interrupt]

    def fn(x):
        return torch.ops.thunderplug_tests.maybe_interrupt(x.sin()) * 2

    x = torch.randn(3, requires_grad=True)
    jitted = thunder.jit(fn, executors=thunderplug.discover())
    _RUNTIME_SWITCH.on, _RUNTIME_SWITCH.raise_it = False, raise_it
    torch.testing.assert_close(jitted(x), fn(x))  # compiled
    _RUNTIME_SWITCH.on = True
    check_interrupted_then_clean(jitted, fn, [x], exception, _RUNTIME_SWITCH)
