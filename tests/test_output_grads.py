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


def _from_a_no_grad_view(x, w):
    with torch.no_grad():
        v = x.view(-1)
    return v * 2, (v * 3).view(2, 3).sum(0), x.detach() * 2


def _only_an_unused_input_requires_grad(x, w):
    return x * 2, x


@pytest.mark.parametrize("fn", [_from_a_no_grad_view, _only_an_unused_input_requires_grad], ids=["view", "unused"])
def test_outputs_without_any_gradient_to_an_input_require_grad_as_in_eager(fn):
    """eager: a view made under ``no_grad`` of a tensor requiring grad requires grad (a leaf without ``grad_fn``),
    so ``v * 2`` does too, its backward leading nowhere (no input gets a gradient, and none is an error). thunder
    (stock too) makes no backward when no input gets a gradient, so every output said False and a backward of
    ``v * 2`` raised "does not require grad". Where nothing requires grad (``x * 2`` of an input without grad
    beside an unused ``w`` requiring grad), eager's False stays."""
    x, w = torch.randn(2, 3, requires_grad=fn is _from_a_no_grad_view), torch.randn(3, requires_grad=True)
    expected = fn(x, w)
    actual = _run(fn, x, w, executors=thunderplug.discover())
    assert [o.requires_grad for o in actual] == [o.requires_grad for o in expected]
    for got, want in zip(actual, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    for outputs in (expected, actual):
        differentiable = [o.sum() for o in outputs if o.requires_grad]
        if differentiable:
            sum(differentiable).backward()
        assert x.grad is None and w.grad is None
    for got, want in zip(actual, expected):
        if not want.requires_grad:
            with pytest.raises(RuntimeError, match="does not require grad"):
                got.sum().backward()


# --- the grad mode of the joint trace is the one the function ends in: eager's answer regardless ---

EXECUTORS = [pytest.param(None, id="stock"), pytest.param("discover", id="discover")]


def _executors(name):
    return thunderplug.discover(quiet=True) if name == "discover" else None


def _sin_under_enable_grad_then_off(x):
    torch.set_grad_enabled(True)
    y = x.sin()
    torch.set_grad_enabled(False)
    return y, y * 2


def _sin_then_off(x):
    y = x.sin()
    torch.set_grad_enabled(False)
    return y, y.cos()  # the cosine is computed without grad


def _assert_like_eager(fn, executors, *, grad_enabled):
    """Values, gradients and which outputs require grad as in eager (stock thunder marks every
    output differentiable, so for it only the differentiable outputs are compared)."""
    x = torch.randn(5, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    initial = torch.is_grad_enabled()
    try:
        torch.set_grad_enabled(grad_enabled)
        expected = fn(x_ref)
        torch.set_grad_enabled(grad_enabled)
        actual = _run(fn, x, executors=_executors(executors))
        assert not torch.is_grad_enabled()  # as eager leaves it
    finally:
        torch.set_grad_enabled(initial)
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want)
    differentiable = [i for i, o in enumerate(expected) if o.requires_grad]
    assert differentiable, "the program must have a differentiable output"
    compared = range(len(expected)) if executors == "discover" else differentiable
    assert [actual[i].grad_fn is None for i in compared] == [expected[i].grad_fn is None for i in compared]
    cotangents = [torch.randn(5) for _ in differentiable]
    torch.autograd.backward([expected[i] for i in differentiable], cotangents)
    torch.autograd.backward([actual[i] for i in differentiable], cotangents)
    torch.testing.assert_close(x.grad, x_ref.grad)


@pytest.mark.parametrize("executors", EXECUTORS)
@pytest.mark.parametrize("grad_enabled", [False, True])
def test_grad_enabled_inside_a_function_ending_without_grad(executors, grad_enabled):
    _assert_like_eager(_sin_under_enable_grad_then_off, executors, grad_enabled=grad_enabled)


@pytest.mark.parametrize("executors", EXECUTORS)
def test_a_function_ending_without_grad(executors):
    _assert_like_eager(_sin_then_off, executors, grad_enabled=True)


class _SinUnderNoGrad(torch.autograd.Function):
    """An autograd.Function whose forward computes under ``no_grad`` (its backward defines the gradient)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        with torch.no_grad():
            return x.sin() * 1.5

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * x.cos() * 1.5


def _forward_under_no_grad(x, w):
    return _SinUnderNoGrad.apply(x * w), w.cos()


def _apply_under_no_grad(x, w):
    def forward(_, a):
        with torch.no_grad():
            return a.sin(), (a,)

    def backward(_, grad, a):
        return grad * 2 * a

    out = torch.ops.higher_order.autograd_function_apply(
        forward, backward, x * w, args_tensor_mask=[True], non_differentiable_idx=[]
    )
    return out, w.cos()


def _compiled(fn, how):
    if how == "thunderfx":
        from thunder.dynamo import ThunderCompiler

        torch._dynamo.reset()
        return torch.compile(fn, backend=ThunderCompiler(executors=thunderplug.discover(quiet=True)))
    return thunder.jit(fn, executors=_executors(how)) if how == "discover" else thunder.jit(fn)


@pytest.mark.parametrize(
    "how, fn",
    [
        ("discover", _forward_under_no_grad),
        ("thunderfx", _forward_under_no_grad),
        ("stock", _apply_under_no_grad),
        ("discover", _apply_under_no_grad),
        ("thunderfx", _apply_under_no_grad),
    ],
)
def test_an_autograd_function_computing_under_no_grad_keeps_its_gradient(how, fn):
    x, w = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    ref = [t.detach().clone().requires_grad_(True) for t in (x, w)]
    expected, actual = fn(*ref), _compiled(fn, how)(x, w)
    assert [o.requires_grad for o in actual] == [o.requires_grad for o in expected] == [True, True]
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want)
    cotangents = [torch.randn(4), torch.randn(4)]
    torch.autograd.backward(expected, cotangents)
    torch.autograd.backward(actual, cotangents)
    for got, want in zip((x, w), ref):
        torch.testing.assert_close(got.grad, want.grad)


def test_stock_thunder_drops_the_gradient_of_a_function_computing_under_no_grad():
    """The thunder bug ``fixes.function_apply_outer_grad_mode`` corrects under discover() (tested so
    the fix is not silently a no-op): the Function's output is constant for autodiff."""
    x, w = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    out, _ = thunder.jit(_forward_under_no_grad)(x, w)
    out.sum().backward()
    assert x.grad is None and _forward_under_no_grad(x, w)[0].requires_grad
