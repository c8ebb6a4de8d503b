"""Training through tensor subclasses: autodiff above the subclass, against eager PyTorch."""

import copy

import pytest
import thunder
import torch
from subclasses import ScaledTensor
from test_subclass_inference import assert_same
from torch.testing._internal.two_tensor import TwoTensor

import thunderplug

aten = torch.ops.aten


@pytest.fixture(scope="module", params=["default", "torchcompile"])
def executors(request):
    found = thunderplug.discover()
    return found if request.param == "default" else [*found, "torchcompile"]


class MulIsDiv(TwoTensor):
    """The discussion's example: dispatch runs every ``mul`` as ``div``. Eager autograd
    differentiates ``mul`` (the outer op) and the backward's ``mul`` ops become ``div`` too."""

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return MulIsDiv(inner["a"], inner["b"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        func = aten.div.Tensor if func is aten.mul.Tensor else func
        unwrap = lambda attr: [getattr(a, attr) if isinstance(a, MulIsDiv) else a for a in args]  # noqa: E731
        out_a, out_b = func(*unwrap("a"), **kwargs), func(*unwrap("b"), **kwargs)
        if isinstance(out_a, torch.Tensor) and out_a.shape == out_b.shape:
            return MulIsDiv(out_a, out_b)
        return out_a


def grads_of(fn, inputs, cotangent_like):
    out = fn(*inputs)
    cotangent = torch.ones_like(out) if cotangent_like is None else cotangent_like
    grads = torch.autograd.grad(out, [x for x in inputs if x.requires_grad], cotangent)
    return out, grads


def clone_inputs(inputs):
    return [
        x.detach().clone().requires_grad_(x.requires_grad) if type(x) is torch.Tensor else copy.deepcopy(x)
        for x in inputs
    ]


def check_fwd_bwd(fn, inputs, executors, cotangent=None):
    jitted = thunder.jit(fn, executors=executors)
    expected_out, expected_grads = grads_of(fn, clone_inputs(inputs), cotangent)
    actual_out, actual_grads = grads_of(jitted, clone_inputs(inputs), cotangent)
    assert_same(actual_out, expected_out)
    assert_same(list(actual_grads), list(expected_grads))
    return jitted


def two_tensor(*shape, requires_grad=True):
    return TwoTensor(torch.randn(*shape), torch.randn(*shape)).requires_grad_(requires_grad)


def test_two_tensor_input_and_plain_weight_get_two_tensor_grads(executors):
    x, w = two_tensor(3, 4), torch.randn(3, 4, requires_grad=True)
    check_fwd_bwd(lambda x, w: (x * w).sin().sum(), [x, w], executors)


def test_subclass_output_with_subclass_cotangent(executors):
    x, w = two_tensor(4, 5), torch.randn(5, 3, requires_grad=True)
    cotangent = TwoTensor(torch.randn(4, 3), torch.randn(4, 3))
    check_fwd_bwd(lambda x, w: torch.mm(x, w).relu() * 2, [x, w], executors, cotangent)


def test_mul_is_unrolled_as_div_forward_and_backward(executors):
    x = MulIsDiv(torch.randn(3) + 3, torch.randn(3) + 3).requires_grad_()
    y = torch.rand(3, requires_grad=True) + 0.5
    cotangent = MulIsDiv(torch.ones(3), torch.ones(3))
    jitted = check_fwd_bwd(lambda x, y: x * y, [x, y.detach().requires_grad_()], executors, cotangent)
    if executors[-1] != "torchcompile":
        forward, backward = str(thunder.last_traces(jitted)[0]), str(thunder.last_backward_traces(jitted)[-1])
        assert "MulIsDiv.torch.mul(x, y)" in forward and "torch.ops.aten.div.Tensor" in forward
        assert "aten_div_Tensor" in backward and "aten_mul_Tensor" not in backward


def test_ctx_subclass_gradients(executors):
    def fn(x, w):
        return (torch.mm(x, w) + x.sin().sum()).sum()  # both ops leave ScaledTensor: plain gradients

    x = ScaledTensor(torch.randn(4, 5), 2.0).requires_grad_()
    w = torch.randn(5, 3, requires_grad=True)
    check_fwd_bwd(fn, [x, w], executors)


def test_intermediate_whose_gradient_is_plain_in_eager(executors):
    """``x * 3`` stays a ScaledTensor but gets a plain gradient from ``mm`` in eager PyTorch: the
    backward traced for a ScaledTensor gradient is traced again for the plain one."""

    def fn(x, w):
        return torch.mm(x * 3, w).sum()

    x = ScaledTensor(torch.randn(4, 5), 2.0).requires_grad_()
    check_fwd_bwd(fn, [x, torch.randn(5, 3, requires_grad=True)], executors)


class ToTwoTensor(torch.autograd.Function):
    """Builds a subclass from a plain tensor that requires grad, like torchao's _ToFloat8ConstrFunc."""

    @staticmethod
    def forward(ctx, x):
        return TwoTensor(x * 2, x.sin())

    @staticmethod
    def backward(ctx, grad):
        return grad.a + grad.b


def test_subclass_built_inside_by_an_autograd_function(executors):
    def fn(x, w):
        return (ToTwoTensor.apply(x) * w).sum()

    check_fwd_bwd(fn, [torch.randn(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True)], executors)


def test_optimizer_steps_match_eager(executors):
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(4, 4))
    eager_weight = torch.nn.Parameter(weight.detach().clone())

    def loss_fn(x, w):
        return ((x @ w).relu() - 0.5).pow(2).mean()

    jitted = thunder.jit(loss_fn, executors=executors)
    optimizers = torch.optim.SGD([weight], lr=0.1), torch.optim.SGD([eager_weight], lr=0.1)
    for _ in range(3):
        x = two_tensor(8, 4, requires_grad=False)
        for fn, w, optimizer in ((jitted, weight, optimizers[0]), (loss_fn, eager_weight, optimizers[1])):
            loss = fn(x, w)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    torch.testing.assert_close(weight, eager_weight)


def test_missing_gradient_names_op_and_line():
    class NoBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("no gradient for NoBackward")

    jitted = thunder.jit(lambda x: NoBackward.apply(x).sum(), executors=thunderplug.discover())
    with pytest.raises(Exception, match="NoBackward"):
        jitted(torch.randn(3, requires_grad=True)).backward()


def test_autograd_function_apply_with_subclass_arguments(executors):
    """torch.ops.higher_order.autograd_function_apply (what fx graphs of autograd.Functions hold)
    with a TwoTensor argument: the user's backward is used (it returns 3x the true gradient)."""

    def forward(ctx, x, y):
        return x * y, (x, y)

    def backward(ctx, grad, x, y):
        return grad * y * 3, grad * x

    def fn(x, y):
        return torch.ops.higher_order.autograd_function_apply(
            forward, backward, x, y, args_tensor_mask=[True, True], non_differentiable_idx=[]
        ).sum()

    try:
        fn(torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)).backward()
    except (AttributeError, KeyError) as error:  # torch >= 2.10 wants fx graphs and saved_for_backward_idx
        pytest.skip(f"torch {torch.__version__}'s autograd_function_apply rejects this program in eager: {error!r}")
    check_fwd_bwd(fn, [two_tensor(3), torch.randn(3, requires_grad=True)], executors)
