"""The generic fallback for overloads no plugin registers: metadata from the op's own fake kernel,
run as the op itself, gradients from torch's autograd of the op (or an error naming it), against
eager on the ops real dispatch emits and on a ``torch.library`` op defined here."""

from __future__ import annotations

import pytest
import thunder
import torch

import thunderplug
from thunderplug.tracing.aten import NotDifferentiableError, UnsupportedAtenOpError, is_fallback
from thunderplug.tracing.compilation import record_of

aten = torch.ops.aten


@torch.library.custom_op("thunderplug_test::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


@scaled_tanh.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _scaled_tanh_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * ctx.scale * (1 - torch.tanh(x) ** 2), None


def _scaled_tanh_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.scale = inputs[1]


scaled_tanh.register_autograd(_scaled_tanh_backward, setup_context=_scaled_tanh_setup)


@torch.library.custom_op("thunderplug_test::no_grad_op", mutates_args=())
def no_grad_op(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@no_grad_op.register_fake
def _(x):
    return torch.empty_like(x)


def _jit(fn):
    return thunder.jit(fn, executors=thunderplug.discover())


def _check(fn, *args, grad=True):
    """Outputs (values, dtypes) equal eager's; input gradients for a random cotangent too."""
    expected_in = [a.detach().clone().requires_grad_(grad and a.is_floating_point()) for a in args]
    actual_in = [a.detach().clone().requires_grad_(grad and a.is_floating_point()) for a in args]
    jitted = _jit(fn)
    expected, actual = fn(*expected_in), jitted(*actual_in)
    assert actual.dtype == expected.dtype and actual.requires_grad == expected.requires_grad
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    if grad and expected.requires_grad:
        cotangent = torch.randn_like(expected)
        wrt = [i for i, a in enumerate(args) if a.is_floating_point()]
        want = torch.autograd.grad(expected, [expected_in[i] for i in wrt], cotangent)
        got = torch.autograd.grad(actual, [actual_in[i] for i in wrt], cotangent)
        torch.testing.assert_close(got, want)
    return jitted


def _int8(*shape):
    return torch.randint(-8, 8, shape, dtype=torch.int8)


@pytest.mark.parametrize(
    "fn,args",
    [
        (lambda a, b: aten._int_mm.default(a, b), (_int8(32, 64), _int8(64, 32))),
        (lambda a: aten.__rshift__.Scalar(a, 2), (torch.randint(-100, 100, (5, 6)),)),
        (lambda a: aten.bitwise_left_shift.Tensor_Scalar(a, 3), (torch.randint(-100, 100, (5, 6)),)),
        (lambda a: aten.bitwise_right_shift.Tensor_Scalar(a, 1), (torch.randint(-100, 100, (5, 6)),)),
        (lambda a: aten.view.dtype(a, torch.int32), (torch.randn(4, 6),)),
    ],
    ids=["_int_mm", "__rshift__.Scalar", "bitwise_left_shift", "bitwise_right_shift", "view.dtype"],
)
def test_integer_and_view_ops_match_eager(fn, args):
    jitted = _check(fn, *args)
    assert record_of(jitted).fallbacks, "expected the op to run through the fallback"


def test_exp2_forward_and_backward_from_torch_autograd():
    jitted = _check(lambda x: aten.exp2.default(x) * 2, torch.randn(3, 5, dtype=torch.float64))
    assert "torch.ops.aten.exp2.default" in record_of(jitted).fallbacks
    initial = thunder.last_traces(jitted)[0]
    fallbacks = [b for b in initial.bound_symbols if is_fallback(b.sym)]
    assert [b.sym.name for b in fallbacks] == ["exp2.default"]
    assert "torch.ops.aten.exp2.default(x)" in str(initial)


def test_custom_op_forward_and_backward():
    x = torch.randn(4, 3, dtype=torch.float64)
    _check(lambda x: torch.ops.thunderplug_test.scaled_tanh.default(x, 2.5) + x, x)
    _check(lambda x: torch.ops.thunderplug_test.scaled_tanh(x, 0.5), x)  # packet form


def test_weight_int4pack_mm_for_cpu_forward_and_missing_derivative():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    packed = aten._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (32, 64), dtype=torch.int32), 2)
    scales_and_zeros = torch.randn(2, 32, 2, dtype=torch.bfloat16)

    def fn(x):
        return aten._weight_int4pack_mm_for_cpu.default(x, packed, 32, scales_and_zeros)

    _check(fn, x, grad=False)
    # eager: the forward runs with x requiring grad, the backward has no derivative
    xg = x.clone().requires_grad_()
    jitted = _jit(fn)
    out = jitted(xg)
    torch.testing.assert_close(out, fn(x), rtol=0, atol=0)
    with pytest.raises(NotDifferentiableError, match=r"_weight_int4pack_mm_for_cpu.*test_aten_fallback\.py"):
        out.float().sum().backward()


def test_no_derivative_raises_only_when_a_gradient_flows():
    """Like eager: an output nobody differentiates through needs no derivative."""

    def fn(x):
        return torch.ops.thunderplug_test.no_grad_op.default(x), x * 2

    x = torch.randn(3, requires_grad=True)
    jitted = _jit(fn)
    untouched, doubled = jitted(x)
    doubled.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))
    torch.testing.assert_close(untouched, x.detach() * 3)
    with pytest.raises((NotDifferentiableError, RuntimeError), match="no_grad_op"):
        a, _ = jitted(x)
        a.sum().backward()


def test_mutating_op_is_refused_with_a_clear_error():
    def fn(x):
        return aten.add_.Tensor(x, 1)

    with pytest.raises(UnsupportedAtenOpError, match=r"add_\.Tensor writes to its argument.*in place"):
        _jit(fn)(torch.randn(3))


def test_fallback_on_a_subclass_value_unrolls_through_its_dispatch():
    from torch.testing._internal.two_tensor import TwoTensor

    a, b = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)

    def fn(x):
        return aten.exp2.default(x)

    out = _jit(fn)(TwoTensor(a, b))
    assert isinstance(out, TwoTensor)
    torch.testing.assert_close(out.a, torch.exp2(a))
    torch.testing.assert_close(out.b, torch.exp2(b))


def test_random_fallback_ops_draw_like_eager_and_are_never_merged():
    """A seeded random op no plugin registers runs as itself, so it draws from torch's generator
    exactly as eager does; two identical calls stay two draws (thunder's CSE must not merge them)."""

    def fn(x):
        return aten.bernoulli.p(x, 0.5), aten.bernoulli.p(x, 0.5)

    x = torch.zeros(64)
    jitted = _jit(fn)
    jitted(x)  # compile first: tracing must not consume random numbers either
    torch.manual_seed(1234)
    first, second = jitted(x)
    torch.manual_seed(1234)
    want_first, want_second = fn(x)
    torch.testing.assert_close((first, second), (want_first, want_second), rtol=0, atol=0)
    assert not torch.equal(first, second)
    assert "torch.ops.aten.bernoulli.p" in record_of(jitted).fallbacks
