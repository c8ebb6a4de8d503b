"""Ops that eager and torch.compile differentiate and stock thunder 0.2.6 refuses (docs/known-issues.md, once
KI-1 to KI-4 and the trace-time refusals below it): under ``discover()`` each runs, its value and every
input gradient equal to eager's, bit for bit, on random inputs; plain ``thunder.jit`` still fails on each
(so these tests cannot pass without thunderplug's rules)."""

from __future__ import annotations

import pytest
import thunder
import torch

import thunderplug


def _inputs(*shapes: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator).requires_grad_() for shape in shapes]


_CONSTANT = torch.randn(5, 7, generator=torch.Generator().manual_seed(3))

#: name -> (function, input shapes); every input requires grad
PROGRAMS = {
    "flip": (lambda x: x.flip(0), [(5, 7)]),
    "flip_dims": (lambda x: torch.flip(x, (0, 2)) * x, [(3, 4, 5)]),
    "flip_0dim": (lambda s: s.flip(0) * 2, [()]),
    "lerp_scalar": (lambda x, y: torch.lerp(x, y, 0.3), [(5, 7), (5, 7)]),
    "lerp_tensor": (lambda x, y, w: torch.lerp(x, y, w.sigmoid()), [(5, 7), (5, 7), (5, 7)]),
    "lerp_broadcast": (lambda x, y, w: torch.lerp(x, y, w.sigmoid()), [(5, 7), (1, 7), (5, 1)]),
    "lerp_method": (lambda x, y: x.lerp(y, 0.75).exp(), [(5, 7), (5, 7)]),
    "remainder": (lambda x, y: torch.remainder(x, y.abs() + 0.5), [(5, 7), (5, 7)]),
    "remainder_broadcast": (lambda x, y: torch.remainder(x * 3, y.abs() + 0.5), [(5, 7), (7,)]),
    "remainder_scalar": (lambda x: torch.remainder(x * 3, 0.7), [(5, 7)]),
    "zeta_q": (lambda q: torch.special.zeta(_CONSTANT.abs() + 2, q.abs() + 1), [(5, 7)]),
    "squeeze_0dim": (lambda s: s.squeeze(-1) * s.squeeze(0), [()]),
    "squeeze_0dim_tuple": (lambda s: s.squeeze((0,)).exp(), [()]),
    "transpose_0dim": (lambda s: s.transpose(0, -1) * 3, [()]),
    "logsumexp_0dim": (lambda s: torch.logsumexp(s, -1) + torch.logsumexp(s * 2, 0), [()]),
    "logsumexp_0dim_keepdim": (lambda s: torch.logsumexp(s, -1, keepdim=True), [()]),
}


def _run(fn, inputs: list[torch.Tensor], jit=None):
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = (jit(fn) if jit else fn)(*inputs)
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad(out, inputs, cotangent, allow_unused=True)
    return out.detach(), grads


@pytest.fixture(scope="module")
def plug():
    return thunderplug.discover(quiet=True)


@pytest.mark.parametrize("name", PROGRAMS)
def test_value_and_gradients_are_eagers(name, plug):
    fn, shapes = PROGRAMS[name]
    inputs = _inputs(*shapes)
    expected_out, expected_grads = _run(fn, inputs)
    out, grads = _run(fn, inputs, lambda f: thunder.jit(f, executors=plug))
    assert out.shape == expected_out.shape and torch.equal(out, expected_out)
    for grad, expected in zip(grads, expected_grads, strict=True):
        assert (grad is None) == (expected is None)
        assert grad is None or torch.equal(grad, expected)


#: what stock thunder runs already (a 0-dim flip, a 0-dim logsumexp with keepdim)
STOCK_RUNS = ("flip_0dim", "logsumexp_0dim_keepdim")


@pytest.mark.parametrize("name", [name for name in PROGRAMS if name not in STOCK_RUNS])
def test_stock_thunder_still_refuses(name):
    """What the test above needs thunderplug for: plain ``thunder.jit`` fails on every program."""
    fn, shapes = PROGRAMS[name]
    with pytest.raises((RuntimeError, IndexError)):
        _run(fn, _inputs(*shapes), thunder.jit)


@pytest.mark.parametrize("op", ["nextafter", "zeta"])
@pytest.mark.parametrize("wanted", ["first", "both"])
def test_not_implemented_derivatives_raise_as_eagers(op, wanted, plug):
    """``torch.nextafter`` and ``torch.special.zeta``'s first argument have no derivative in eager: the forward
    runs and the backward raises eager's ``NotImplementedError`` (stock thunder refused to compile). A known gap:
    the backward also raises where the argument is ``x.detach()`` of a tensor that requires grad (thunder 0.2.6
    differentiates through its ``detach``), where eager's does not."""
    fn = {"nextafter": torch.nextafter, "zeta": lambda x, q: torch.special.zeta(x.abs() + 2, q.abs() + 1)}[op]
    x, y = _inputs((5, 7), (5, 7))
    y.requires_grad_(wanted == "both")
    for call in (fn, thunder.jit(fn, executors=plug)):
        out = call(x, y)
        assert out.requires_grad
        with pytest.raises(NotImplementedError, match=f"the derivative for '{op}' is not implemented"):
            out.sum().backward()


def test_traces_run_eagers_kernels(plug):
    jitted = thunder.jit(lambda x, y: torch.remainder(torch.lerp(x.flip(1), y, 0.5), 0.3), executors=plug)
    x, y = _inputs((3, 4), (3, 4))
    jitted(x, y).sum().backward()
    forward = {b.sym.name for b in thunder.last_traces(jitted)[-1].bound_symbols}
    backward = {b.sym.name for b in thunder.last_backward_traces(jitted)[-1].bound_symbols}
    assert {"eager_flip", "eager_lerp_scalar", "eager_remainder_scalar"} <= forward
    assert {"eager_flip", "eager_lerp_scalar_backward"} <= backward


def test_squeeze_of_a_0dim_tensor_keeps_torchs_errors(plug):
    """Only dim 0 and -1 are accepted on a 0-dim tensor, as torch does."""
    s = torch.randn(())
    with pytest.raises(IndexError):
        s.squeeze(1)
    with pytest.raises(Exception):  # noqa: B017 - thunder's own error for a dim out of range
        thunder.jit(lambda s: s.squeeze(1), executors=plug)(s)
