"""Memory layouts of subclass inner tensors: thunder proxies carry no strides, so the core notes
the layouts it knows and traces subclass ops on fakes with them (``fake.memory_order``). Eager is
the reference: a subclass op whose dispatch depends on its inner tensors' strides must do in a
jitted function what it does in eager, including raising where eager raises."""

import pytest
import thunder
import torch
from torch.testing._internal.two_tensor import TwoTensor

import thunderplug
from thunderplug.tracing.fake import memory_order, strides_in_order


@pytest.mark.parametrize(
    "tensor, order",
    [
        (torch.empty(3, 4), None),
        (torch.empty(3, 4).t(), (1, 0)),
        (torch.empty(2, 3, 4).permute(2, 0, 1), (1, 2, 0)),
        (torch.empty(1, 4), None),
        (torch.empty(4, 1).t(), None),  # size-1 dims do not order anything
        (torch.empty(3, 8)[:, ::2], None),  # gaps: not dense, traced as contiguous
        (torch.empty(4).expand(3, 4), None),  # overlapping
    ],
)
def test_memory_order(tensor, order):
    assert memory_order(tuple(tensor.shape), tensor.stride()) == order
    if order is not None:
        assert strides_in_order(tuple(tensor.shape), order) == tensor.stride()


def _transposed_two_tensor():
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    return TwoTensor(a.t(), b.t())  # (3, 4), each inner tensor transposed


def _view_after_t(x):
    return x.t().view(-1) * 2  # valid only when x.t() is contiguous: x's inner tensors are transposed


def test_transposed_inner_tensors_are_traced_with_their_layout():
    x = _transposed_two_tensor()
    expected = _view_after_t(x)
    actual = thunder.jit(_view_after_t, executors=thunderplug.discover())(x)
    assert type(actual) is TwoTensor
    torch.testing.assert_close(actual.a, expected.a, rtol=0, atol=0)
    torch.testing.assert_close(actual.b, expected.b, rtol=0, atol=0)


def test_a_layout_change_is_guarded_and_raises_where_eager_raises():
    jitted = thunder.jit(_view_after_t, executors=thunderplug.discover())
    jitted(_transposed_two_tensor())
    contiguous = TwoTensor(torch.randn(3, 4), torch.randn(3, 4))
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        _view_after_t(contiguous)
    with pytest.raises(RuntimeError, match=r"TwoTensor.torch.view failed .*test_memory_layouts.py.*view a tensor"):
        jitted(contiguous)  # the guard sees the new layout: retraced, the dispatch raises as in eager


def test_gradients_through_transposed_inner_tensors():
    def fn(x, w):
        return (x.t().reshape(-1) * w).sum()

    x = _transposed_two_tensor().requires_grad_(True)
    w = torch.randn(12, requires_grad=True)
    expected = fn(x, w)
    expected_grads = torch.autograd.grad(expected, (x, w))
    actual = thunder.jit(fn, executors=thunderplug.discover())(x, w)
    actual_grads = torch.autograd.grad(actual, (x, w))
    torch.testing.assert_close(actual, expected)
    for got, want in zip(actual_grads, expected_grads):
        assert type(got) is type(want)
        torch.testing.assert_close(got, want)


def _clones_in(run) -> int:
    """Copies into a new layout (``clone``, ``contiguous``) that one call of ``run`` makes."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        run()
    return sum(event.count for event in profile.key_averages() if event.key == "aten::clone")


def test_a_permuted_parameter_is_traced_transposed_not_copied_contiguous():
    """``weight.t()`` is a transposed view in eager; an unrolled op that reads it must be traced
    with that layout, or it copies the weight contiguous first (and torchao's float8 Linear then
    copies its float8 weight back to column-major)."""
    float8 = pytest.importorskip("torchao.float8")
    torch.manual_seed(0)
    eager = float8.convert_to_float8_training(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 32)))
    jitted = thunder.jit(eager, executors=thunderplug.discover(quiet=True))
    x = torch.randn(16, 64)
    torch.testing.assert_close(jitted(x), eager(x), rtol=0, atol=0)
    with torch.no_grad():
        jitted(x)  # compiled for inference here, outside the profile
        # eager's clones are the ones ``_scaled_mm`` makes of its column-major operand on CPU
        assert _clones_in(lambda: jitted(x)) == _clones_in(lambda: eager(x))
