"""Inputs sharing memory in a function with an in-place op (eager.aliased_inputs): two views of one tensor are two
tensors, as in eager; the same tensor passed twice is one. Each case against eager, forward and backward, and the
base tensor's values after the call, rtol=atol=0."""

import pytest
import thunder
import torch
from torch import nn

import thunderplug


def _same(jitted_run, eager_run):
    for got, expected in zip(jitted_run, eager_run, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def _both(fn, make):
    """``make()`` gives fresh inputs (the base tensor first); each run returns the output, the leaves' gradients
    of ``output.sum()`` and the base tensor after the call."""

    def run(f):
        torch.manual_seed(0)
        base, *args = make()
        out = f(*args)
        leaves = [a for a in args if isinstance(a, torch.Tensor) and a.is_leaf and a.requires_grad]
        grads = torch.autograd.grad(out.sum(), leaves) if out.requires_grad else ()
        return (out.detach(), *grads, base.detach().clone())

    return run(thunder.jit(fn, executors=thunderplug.discover())), run(fn)


def _update_then_combine(index, mask, value, second, first):
    index[mask] = value
    return second - first * 2 + index.sum()


def test_two_views_of_one_tensor_in_a_function_with_an_in_place_op():
    """The columns of ``base.unbind(-1)``: one shape, other offsets (thunder read both as the first: [-2, -4])."""
    base = torch.tensor([[1.0, 3.0], [2.0, 5.0]])
    first, second = base.unbind(-1)

    def call(fn):
        return fn(torch.zeros(2), torch.tensor([True, False]), torch.tensor(1.0), second, first)

    jitted = thunder.jit(_update_then_combine, executors=thunderplug.discover())
    torch.testing.assert_close(call(jitted), call(_update_then_combine), rtol=0, atol=0)  # eager: [2, 2]


def _scale_first_read_second(first, second, w):
    first.mul_(2)
    return second * w


def test_overlapping_views_one_updated_in_place():
    def make():
        x = torch.randn(5)
        return x, x[0:3], x[1:4], torch.randn(3, requires_grad=True)

    _same(*_both(_scale_first_read_second, make))


def _scale_by_w_read_second(first, second, w):
    first.mul_(w)
    return second * w


def test_an_update_with_gradients_read_through_another_view_is_refused():
    """Eager's gradient of ``w`` goes through the update into the other view (its common base): refused by name."""
    x = torch.randn(5)
    jitted = thunder.jit(_scale_by_w_read_second, executors=thunderplug.discover())
    with pytest.raises(NotImplementedError, match=r"mul_ \(at .*test_aliased_inputs.py:\d+\) updates the input "
                                                  r"`first` .* the input `second`"):
        jitted(x[0:3], x[1:4], torch.randn(3, requires_grad=True))


def _update_base_read_transpose(transposed, x, w):
    x.add_(1)
    return transposed @ w


def _update_transpose_read_base(x, transposed, w):
    transposed[0].mul_(3)
    return x * w


def test_a_transpose_and_its_base():
    def make_transposed_first():
        x = torch.randn(3, 3)
        return x, x.t(), x, torch.randn(3, 2, requires_grad=True)

    def make_base_first():
        x = torch.randn(3, 3)
        return x, x, x.t(), torch.randn(3, requires_grad=True)

    _same(*_both(_update_base_read_transpose, make_transposed_first))
    _same(*_both(_update_transpose_read_base, make_base_first))


def _add_to_first_read_second(first, second, w):
    first.add_(1)
    return second * w


def test_the_same_tensor_twice_is_one_tensor():
    def make():
        x = torch.randn(3)
        return x, x, x, torch.randn(3, requires_grad=True)

    def make_view_twice():
        x = torch.randn(4, 3)
        view = x[1]
        return x, view, x[1], torch.randn(3, requires_grad=True)

    _same(*_both(_add_to_first_read_second, make))
    _same(*_both(_add_to_first_read_second, make_view_twice))


def test_a_compilation_serves_only_calls_with_the_same_views():
    """Traced for one tensor passed twice (merged), then called with two views of one tensor, and back."""
    jitted = thunder.jit(_add_to_first_read_second, executors=thunderplug.discover())
    w = torch.randn(3)
    for make in (lambda x: (x[0], x[0]), lambda x: (x[0], x[1]), lambda x: (x[0], x[0])):
        x, expected_x = torch.randn(2, 3), None
        expected_x = x.clone()
        got = jitted(*make(x), w)
        expected = _add_to_first_read_second(*make(expected_x), w)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        torch.testing.assert_close(x, expected_x, rtol=0, atol=0)


def _skips_an_argument(a, unused, b, c):
    b.add_(1)
    return a + c


def test_alias_groups_count_the_computation_inputs():
    """thunder applied the positions of the call's arguments to the computation's inputs: with ``unused`` dropped,
    ``c`` (``x``) was read as ``b`` (``y``)."""
    x, y = torch.zeros(3), torch.ones(3)
    got = thunder.jit(_skips_an_argument, executors=thunderplug.discover())(x, y, y, x)
    x2, y2 = torch.zeros(3), torch.ones(3)
    torch.testing.assert_close(got, _skips_an_argument(x2, y2, y2, x2), rtol=0, atol=0)
    torch.testing.assert_close((x, y), (x2, y2), rtol=0, atol=0)


class _Rescaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3))

    def forward(self, x):
        before = self.weight * 3
        x.mul_(2)
        return before + self.weight * self.weight.sum()


def test_a_parameter_passed_as_an_argument():
    """The argument is the parameter's memory (``weight.detach()``): the update is seen by the later reads of the
    parameter, not by the earlier one."""
    runs = []
    for compiled in (True, False):
        torch.manual_seed(0)
        model = _Rescaled()
        fn = thunder.jit(model, executors=thunderplug.discover()) if compiled else model
        out = fn(model.weight.detach())
        out.sum().backward()
        runs.append((out.detach(), model.weight.grad, model.weight.detach().clone()))
    _same(*runs)
