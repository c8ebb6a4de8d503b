"""In-place ops on tensor-subclass inputs and intermediates, also through views (issue 24, item 6):
values, the caller's input mutated as in eager, gradients, and eager's error for a leaf that
requires grad. thunderplug decomposes them as thunder does for plain tensors (the out-of-place
subclass op, then ``copy_``), and thunder's alias updates see views made by subclass ops."""

from __future__ import annotations

import pytest
import thunder
import torch
from test_subclass_inference import assert_same
from torch.testing._internal.subclasses import WrapperSubclass
from torch.testing._internal.two_tensor import TwoTensor

import thunderplug

SUBCLASSES = {
    "TwoTensor": lambda *shape: TwoTensor(torch.randn(*shape), torch.randn(*shape)),
    "WrapperSubclass": lambda *shape: WrapperSubclass(torch.randn(*shape)),
}


def copy_of(value):
    return value.detach().clone().requires_grad_(value.requires_grad)


def add_in_place(x, w):
    x.add_(1)
    return x * w


def mul_by_a_tensor_in_place(x, w):
    x.mul_(w)
    return x.sin()


def row_view_in_place(x, w):
    x[0].mul_(3)
    return x.sin() * w


def transposed_view_in_place(x, w):
    x.t().add_(1)
    x.t()[0].mul_(2)
    return x.cos() * w


def relu_in_place(x, w):
    torch.nn.functional.relu(x, inplace=True)
    return x * w


def read_before_and_after(x, w):
    before = x.sin()
    x.add_(1)
    return before * w, x.sin()


def intermediate_in_place(x, w):
    y = x * w
    y.mul_(2)
    y.sub_(w)
    return y.sin()


def views_of_an_intermediate_in_place(x, w):
    y = x * w
    y.mul_(2)
    y.t().add_(1)
    y[1].sub_(w[0])
    return y.sin()


PROGRAMS = [add_in_place, mul_by_a_tensor_in_place, row_view_in_place, transposed_view_in_place, relu_in_place,
            read_before_and_after, intermediate_in_place]


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.__name__)
@pytest.mark.parametrize("subclass", sorted(SUBCLASSES))
def test_in_place_ops_match_eager_with_the_inputs_mutation(subclass, program):
    """Outputs, the caller's subclass input after the call, and the gradient of ``w``."""
    x, w = SUBCLASSES[subclass](3, 3), torch.randn(3, 3, requires_grad=True)
    jitted = thunder.jit(program, executors=thunderplug.discover())
    for _ in range(2):  # the second call runs the cached program
        x_eager, x_jit, w_eager, w_jit = copy_of(x), copy_of(x), copy_of(w), copy_of(w)
        expected, actual = program(x_eager, w_eager), jitted(x_jit, w_jit)
        assert_same(actual, expected)
        assert_same(x_jit.detach(), x_eager.detach())
        expected, actual = (o if isinstance(o, tuple) else (o,) for o in (expected, actual))
        grads = [
            torch.autograd.grad(sum(o.sum() for o in out), w_, allow_unused=True)
            for out, w_ in ((actual, w_jit), (expected, w_eager))
        ]
        assert_same(list(grads[0]), list(grads[1]))


@pytest.mark.parametrize("subclass", sorted(SUBCLASSES))
def test_in_place_ops_on_an_intermediate_of_an_input_requiring_grad_match_eager(subclass):
    def program(x):
        y = x * 2
        y.add_(x)
        y.mul_(x.sin())
        return y

    x = SUBCLASSES[subclass](2, 3).requires_grad_(True)
    jitted = thunder.jit(program, executors=thunderplug.discover())
    x_eager, x_jit = copy_of(x), copy_of(x)
    expected, actual = program(x_eager), jitted(x_jit)
    assert_same(actual, expected)
    grads = [torch.autograd.grad(out, x_, torch.ones_like(out)) for out, x_ in ((actual, x_jit), (expected, x_eager))]
    assert_same(list(grads[0]), list(grads[1]))


@pytest.mark.parametrize("subclass", sorted(SUBCLASSES))
def test_in_place_on_a_leaf_requiring_grad_is_refused_as_in_eager(subclass):
    def program(x):
        x.add_(1)
        return x * 2

    x = SUBCLASSES[subclass](2, 3).requires_grad_(True)
    message = "a leaf Variable that requires grad is being used in an in-place operation"
    with pytest.raises(RuntimeError, match=message):
        program(copy_of(x))
    with pytest.raises(RuntimeError, match=message):
        thunder.jit(program, executors=thunderplug.discover())(copy_of(x))
    with torch.no_grad():  # allowed in eager under no_grad
        x_eager, x_jit = copy_of(x), copy_of(x)
        assert_same(thunder.jit(program, executors=thunderplug.discover())(x_jit), program(x_eager))
        assert_same(x_jit, x_eager)


@pytest.mark.parametrize("subclass", sorted(SUBCLASSES))
def test_views_of_an_intermediate_updated_in_place_match_eager_without_gradients(subclass):
    x, w = SUBCLASSES[subclass](3, 3), torch.randn(3, 3)
    jitted = thunder.jit(views_of_an_intermediate_in_place, executors=thunderplug.discover())
    assert_same(jitted(copy_of(x), w), views_of_an_intermediate_in_place(copy_of(x), w))
    w.requires_grad_(True)
    with torch.no_grad():
        assert_same(jitted(copy_of(x), w), views_of_an_intermediate_in_place(copy_of(x), w))


@pytest.mark.parametrize("subclass", sorted(SUBCLASSES))
def test_a_gradient_through_an_in_place_update_of_a_view_is_refused(subclass):
    """thunder's alias updates pass no gradient from a view to the value it views (stock thunder
    fails on this too): refused by name rather than computing a wrong gradient."""
    x, w = SUBCLASSES[subclass](3, 3), torch.randn(3, 3, requires_grad=True)
    jitted = thunder.jit(views_of_an_intermediate_in_place, executors=thunderplug.discover())
    with pytest.raises(NotImplementedError, match="on a view of a subclass value"):
        jitted(copy_of(x), w)


def test_an_in_place_update_of_a_plain_tensor_with_a_subclass_value_is_refused_by_name():
    def program(p, x):
        p.add_(x)
        return p

    with pytest.raises(Exception, match="cannot write a subclass value into a plain tensor"):
        thunder.jit(program, executors=thunderplug.discover())(torch.randn(3), SUBCLASSES["TwoTensor"](3))
