"""Which outputs of a jitted function require grad: eager's answer (thunder 0.2.6 says True for
every output of a function with autograd), and gradients unchanged."""

import pytest
import thunder
import torch
from torch.testing._internal.custom_tensor import CustomTensorPlainOut

import thunderplug


def _mixed(x, y):
    return y * x, y.cos(), (x > 0).float() * y, x, x.detach() * y, (x * 2).argmax()


def _run(fn, *inputs, executors):
    jitted = thunder.jit(fn, executors=executors) if executors else thunder.jit(fn)
    return jitted(*inputs)


def test_outputs_require_grad_as_in_eager():
    x, y = torch.randn(3, requires_grad=True), torch.randn(3)
    expected = _mixed(x, y)
    actual = _run(_mixed, x, y, executors=thunderplug.discover())
    assert [o.requires_grad for o in actual] == [o.requires_grad for o in expected] == [
        True, False, False, True, False, False
    ]
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want)
    differentiable = [i for i, o in enumerate(expected) if o.requires_grad]
    cotangents = [torch.randn_like(expected[i]) for i in differentiable]
    (want,) = torch.autograd.grad([expected[i] for i in differentiable], x, cotangents)
    (got,) = torch.autograd.grad([actual[i] for i in differentiable], x, cotangents)
    torch.testing.assert_close(got, want)


def test_stock_thunder_marks_every_output_differentiable():
    """What thunderplug changes (tested so the override is not silently a no-op)."""
    x, y = torch.randn(3, requires_grad=True), torch.randn(3)
    assert all(o.requires_grad for o in _run(_mixed, x, y, executors=None)[:5])


def test_backward_of_an_output_without_grad_raises_as_in_eager():
    x, y = torch.randn(3, requires_grad=True), torch.randn(3)
    with pytest.raises(RuntimeError, match="does not require grad"):
        _mixed(x, y)[1].sum().backward()
    with pytest.raises(RuntimeError, match="does not require grad"):
        _run(_mixed, x, y, executors=thunderplug.discover())[1].sum().backward()


def test_an_inner_tensor_read_carries_no_gradient():
    def fn(x, w):
        return (x @ w).relu(), x.get_elem().cos()

    x = CustomTensorPlainOut(torch.randn(4, 5), torch.randn(4, 5)).requires_grad_(True)
    w = torch.randn(5, 3, requires_grad=True)
    expected = fn(x, w)
    actual = _run(fn, x, w, executors=thunderplug.discover())
    assert [o.requires_grad for o in actual] == [o.requires_grad for o in expected] == [True, False]
    grads = torch.autograd.grad(actual[0].sum(), (x, w))
    expected_grads = torch.autograd.grad(expected[0].sum(), (x, w))
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want)


def test_the_flag_does_not_outlive_the_call():
    x, y = torch.randn(3, requires_grad=True), torch.randn(3)
    out = _run(_mixed, x, y, executors=thunderplug.discover())
    assert all("_thunderplug_non_differentiable" not in vars(o) for o in out)


def _under_no_grad(x, w):
    with torch.no_grad():
        frozen = x * 2  # no gradient, though x requires grad
        scale = w.abs().max()
    return frozen, frozen * w, x * w / scale, scale


def test_values_computed_under_no_grad_carry_no_gradient():
    x, w = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    expected = _under_no_grad(x, w)
    actual = _run(_under_no_grad, x, w, executors=thunderplug.discover())
    assert [o.requires_grad for o in actual] == [o.requires_grad for o in expected] == [False, True, True, False]
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want)
    cotangents = [torch.randn(3), torch.randn(3)]
    want = torch.autograd.grad(expected[1:3], (x, w), cotangents)
    got = torch.autograd.grad(actual[1:3], (x, w), cotangents)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)
    with pytest.raises(RuntimeError, match="does not require grad"):
        actual[0].sum().backward()
