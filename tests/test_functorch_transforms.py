"""functorch transforms inside jitted functions (thunderplug.eager.functorch_transforms): ``torch.vmap`` runs as one op,
torch's vmap on the real tensors, with the tensors its function captures as inputs and the TorchFunctionModes
around it, differentiated by torch.func.vjp of the same vmap; the other transforms are refused with the user's
line; a failed compilation leaves no functorch level or mode behind. Eager is the reference everywhere."""

import functools
import threading
import types

import pytest
import thunder
import torch
from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex

import thunderplug
from thunderplug.eager.functorch_transforms import _depth, _leave_innermost_level


def _jit(fn):
    return thunder.jit(fn, executors=thunderplug.discover())


def _eager_still_works():
    assert torch._C._functorch.maybe_current_level() is None
    assert torch._C._len_torch_function_stack() == 0
    torch.nn.init.normal_(torch.empty(3))  # random ops fail while a vmap level is left entered


def _ops(jitted):
    return [bsym.sym.name for bsym in thunder.last_traces(jitted)[-1].bound_symbols]


def _vmapped_mask(q, kv):
    return torch.vmap(lambda i: kv <= i)(q)


def test_a_vmap_capturing_a_tensor_is_one_op_with_eager_values():
    jitted = _jit(_vmapped_mask)
    q, kv = torch.arange(4), torch.arange(4)
    torch.testing.assert_close(jitted(q, kv), kv[None, :] <= q[:, None], rtol=0, atol=0)
    assert _ops(jitted).count("functorch_vmap") == 1
    # the captured tensor is an input: new values, same compilation
    q2, kv2 = torch.tensor([3, 0, 2, 1]), torch.tensor([2, 2, 0, 5])
    assert torch.equal(jitted(q2, kv2), _vmapped_mask(q2, kv2))
    assert thunder.cache_misses(jitted) == 1
    _eager_still_works()


def _hf_like_mask(cache_position, kv_arange, attention_mask, offset):
    """transformers 4.57's masking_utils, in small: closures capturing a derived tensor, combined through a tuple
    of functions, vmapped four times under TransformGetItemToIndex (indexing with a batched scalar calls .item()
    without it)."""
    padding = attention_mask.bool()

    def causal(b, h, q, kv):
        return kv <= q + offset

    def padded(b, h, q, kv):
        return padding[b, kv]

    def both(*masks):
        def mask(b, h, q, kv):
            result = masks[0](b, h, q, kv)
            for other in masks[1:]:
                result = result & other(b, h, q, kv)
            return result

        return mask

    mask_function = both(causal, padded)
    for dims in [(None, None, None, 0), (None, None, 0, None), (None, 0, None, None), (0, None, None, None)]:
        mask_function = torch.vmap(mask_function, in_dims=dims, out_dims=0)
    with TransformGetItemToIndex():
        mask = mask_function(torch.arange(attention_mask.shape[0]), torch.arange(1), cache_position, kv_arange)
    return torch.where(mask, 0.0, -1e9)


def test_nested_vmaps_of_nested_closures_under_a_torch_function_mode():
    attention_mask = torch.ones(2, 6, dtype=torch.long)
    attention_mask[1, 4:] = 0
    args = (torch.arange(6), torch.arange(6), attention_mask, 0)
    jitted = _jit(_hf_like_mask)
    assert torch.equal(jitted(*args), _hf_like_mask(*args))
    assert _ops(jitted).count("functorch_vmap") == 1  # the four nested vmaps: torch's nested vmap, one op
    other_mask = torch.ones(2, 6, dtype=torch.long)
    other_mask[0, 2:] = 0
    args = (torch.arange(6), torch.arange(6), other_mask, 0)
    assert torch.equal(jitted(*args), _hf_like_mask(*args))
    _eager_still_works()


class _AddIsSub(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.add, torch.Tensor.add, torch.Tensor.__add__):
            func = torch.sub
        return func(*args, **(kwargs or {}))


class _Doubles(torch.overrides.TorchFunctionMode):
    """Not idempotent: entered twice, results are multiplied by four."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        return result * 2 if func is torch.Tensor.sin else result


def test_the_torch_function_modes_entered_around_the_call_apply_at_run_time():
    def f(x, y):
        with _AddIsSub():
            result = torch.vmap(lambda a: a + y)(x)
        return result * 2

    x, y = torch.randn(3, 4), torch.randn(4)
    expected = f(x, y)
    torch.testing.assert_close(expected, (x - y) * 2)  # the mode acts in eager
    assert torch.equal(_jit(f)(x, y), expected)
    _eager_still_works()


def test_a_mode_the_caller_entered_is_not_part_of_the_compilation():
    def f(x):
        return torch.vmap(lambda a: a.sin())(x)

    jitted, x = _jit(f), torch.randn(3, 4)
    with _Doubles():  # compiled under it: eager applies it, and so does torch's vmap at run time
        expected, got = f(x), jitted(x)
    torch.testing.assert_close(expected, x.sin() * 2, rtol=0, atol=0)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(jitted(x), x.sin(), rtol=0, atol=0)  # the same compilation, without the mode
    assert thunder.cache_misses(jitted) == 1


@pytest.mark.parametrize(
    "case",
    ["in_dims_1", "out_dims_1", "tuple_out", "none_in_dim_number", "chunk_size", "dict_input", "nested_in_dims"],
)
def test_in_dims_and_out_dims_as_in_eager(case):
    x, y = torch.randn(3, 5), torch.randn(5, 3)
    programs = {
        "in_dims_1": lambda x, y: torch.vmap(lambda a, b: a * b, in_dims=(0, 1))(x, y),
        "out_dims_1": lambda x, y: torch.vmap(lambda a: a.cumsum(0), out_dims=1)(x),
        "tuple_out": lambda x, y: torch.vmap(lambda a: (a.sin(), a.sum()), out_dims=(0, 0))(x),
        "none_in_dim_number": lambda x, y: torch.vmap(lambda a, s, b: a * s + b, in_dims=(0, None, None))(
            x, 3, y[:, 0]
        ),
        "chunk_size": lambda x, y: torch.vmap(lambda a: a.exp(), chunk_size=2)(x),
        "dict_input": lambda x, y: torch.vmap(lambda d: d["a"] - d["b"], in_dims=({"a": 0, "b": 1},))(
            {"a": x, "b": y}
        ),
        "nested_in_dims": lambda x, y: torch.vmap(torch.vmap(lambda a, b: a @ b, in_dims=(None, 1)), in_dims=(0, None))(
            x, y
        ),
    }
    program = programs[case]
    got, expected = _jit(program)(x, y), program(x, y)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    _eager_still_works()


def test_tensors_captured_in_defaults_partials_methods_and_containers():
    class Scale:
        def __init__(self, factor):
            self.factor = factor

        def apply(self, a):
            return a * self.factor

    def f(x, w):
        shift = w.cos()

        def with_default(a, s=shift):
            return a + s

        partial = functools.partial(lambda a, t: a - t, t=w * 3)
        method = types.MethodType(lambda self, a: a * self[0], (w.exp(),))
        table = {"w": [w.sin()]}
        return (
            torch.vmap(with_default)(x),
            torch.vmap(partial)(x),
            torch.vmap(method)(x),
            torch.vmap(lambda a: a * table["w"][0])(x),
            torch.vmap(Scale(2.0).apply)(x),
        )

    x, w = torch.randn(3, 4), torch.randn(4)
    for got, expected in zip(_jit(f)(x, w), f(x, w)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_a_function_defined_outside_keeps_its_captured_tensor():
    outside = torch.randn(4)
    scaled = lambda a: a * outside  # noqa: E731
    cell = scaled.__closure__[0]

    def f(x):
        return torch.vmap(scaled)(x)

    x = torch.randn(3, 4)
    torch.testing.assert_close(_jit(f)(x), x * outside, rtol=0, atol=0)
    assert scaled.__closure__[0] is cell and cell.cell_contents is outside


def test_calls_from_several_threads_use_their_own_tensors():
    jitted = _jit(_vmapped_mask)
    jitted(torch.arange(5), torch.arange(5))
    failures = []

    def call(seed):
        g = torch.Generator().manual_seed(seed)
        for _ in range(20):
            q, kv = torch.randint(0, 5, (5,), generator=g), torch.randint(0, 5, (5,), generator=g)
            if not torch.equal(jitted(q, kv), kv[None, :] <= q[:, None]):
                failures.append(seed)

    threads = [threading.Thread(target=call, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


def _grads_as_in_eager(f, *args):
    """Forward and every input's gradient of ``f`` jitted equal eager's (the same random cotangent)."""
    eager_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    jit_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    jitted = _jit(f)
    expected, got = f(*eager_args), jitted(*jit_args)
    torch.testing.assert_close(got, expected)
    backward_ops = [bsym.sym.name for bsym in thunder.last_backward_traces(jitted)[-1].bound_symbols]
    assert "functorch_vmap_backward" in backward_ops
    cotangent = torch.randn_like(expected)
    expected.backward(cotangent)
    got.backward(cotangent)
    for eager_arg, jit_arg in zip(eager_args, jit_args):
        if eager_arg.requires_grad:
            assert jit_arg.grad is not None
            torch.testing.assert_close(jit_arg.grad, eager_arg.grad)
    _eager_still_works()


def test_gradients_through_vmap_of_arguments_and_captured_tensors():
    def f(x, w, b):
        shift = b.tanh()
        return torch.vmap(lambda a: (a * w).sin() + shift)(x) * 3

    _grads_as_in_eager(f, torch.randn(3, 4, requires_grad=True), torch.randn(4, requires_grad=True), torch.randn(4))
    _grads_as_in_eager(f, torch.randn(3, 4), torch.randn(4), torch.randn(4, requires_grad=True))


def test_gradients_through_nested_vmaps_with_several_outputs_under_a_mode():
    def f(x, y, w):
        def inner(a, b):
            return torch.add((a * b * w).exp(), a), a > b  # a boolean output beside the floating one

        with _AddIsSub():
            pairs, above = torch.vmap(torch.vmap(inner, in_dims=(None, 0)), in_dims=(0, None))(x, y)
        return pairs.masked_fill(above, 0.0) + w

    _grads_as_in_eager(f, *(torch.randn(n, requires_grad=True) for n in (3, 5, ())))


def test_vmap_of_tensors_without_grad_in_a_function_that_trains():
    def f(x, w, attention_mask):
        keep = torch.vmap(lambda m: m > 0)(attention_mask)
        return (x @ w).masked_fill(~keep, 0.0).sum()

    x, mask = torch.randn(3, 4), torch.tensor([[1, 1, 0, 0], [1, 0, 1, 1], [0, 0, 0, 1]])
    w1 = torch.randn(4, 4, requires_grad=True)
    w2 = w1.detach().clone().requires_grad_()
    f(x, w1, mask).backward()
    loss = _jit(f)(x, w2, mask)
    loss.backward()
    torch.testing.assert_close(loss, f(x, w1.detach(), mask), rtol=0, atol=0)
    torch.testing.assert_close(w2.grad, w1.grad, rtol=0, atol=0)


def test_a_tensor_the_function_hides_in_an_object_fails_with_the_line():
    def f(x, w):
        holder = types.SimpleNamespace(w=w * 2)
        return torch.vmap(lambda a: a * holder.w)(x)

    with pytest.raises(NotImplementedError, match=r"(?s)`torch.vmap`.*test_functorch_transforms.py:\d+.*FakeTensors"):
        _jit(f)(torch.randn(3, 4), torch.randn(4))
    _eager_still_works()


def test_grad_transform_is_refused():
    def f(x):
        return torch.func.grad(lambda y: (y * y).sum())(x)

    with pytest.raises(NotImplementedError, match=r"(?s)torch.func.grad.*test_functorch_transforms.py:\d+"):
        _jit(f)(torch.randn(3))
    _eager_still_works()


def test_a_level_entered_before_a_failure_is_left():
    def enters_then_fails(x):
        torch._C._functorch._vmap_increment_nesting(2, "error")
        raise ValueError("failed inside a transform")

    with pytest.raises(ValueError, match="failed inside a transform"):
        _jit(enters_then_fails)(torch.randn(2))
    _eager_still_works()


def test_a_mode_entered_before_a_failure_is_left():
    def fails_inside_a_mode(x):
        _AddIsSub().__enter__()  # thunder enters it for real; a `with` block would leave it on the way out
        raise ValueError("failed inside a mode")

    with pytest.raises(ValueError, match="failed inside a mode"):
        _jit(fails_inside_a_mode)(torch.randn(2))
    _eager_still_works()


def test_stock_thunder_leaves_the_vmap_level_entered():
    """What the patches change (the level is left here by the test itself)."""
    depth = _depth()
    try:
        with pytest.raises(TypeError, match="_add_batch_dim"):
            thunder.jit(_vmapped_mask)(torch.arange(4), torch.arange(4))
        assert _depth() > depth
    finally:
        while _depth() > depth:
            _leave_innermost_level()
    _eager_still_works()


def test_a_tensor_subclass_value_in_a_vmap_is_refused_naming_the_line():
    from torch.testing._internal.two_tensor import TwoTensor

    def f(x):
        return torch.vmap(lambda a: a * 2)(x)

    x = TwoTensor(torch.randn(3, 4), torch.randn(3, 4))
    with pytest.raises(NotImplementedError, match=r"(?s)`torch.vmap`.*test_functorch_transforms.py:\d+.*subclass"):
        _jit(f)(x)
    _eager_still_works()


def test_a_mode_applies_once_at_trace_time_and_at_run_time_forward_and_backward():
    def f(x):
        with _Doubles():
            y = torch.vmap(lambda a: a.sin())(x)
        return y

    x = torch.randn(3, 4, requires_grad=True)
    torch.testing.assert_close(f(x), x.sin() * 2)
    _grads_as_in_eager(f, x)
    _grads_as_in_eager(lambda x, w: torch.vmap(lambda a: a * w)(x).sum(dim=0), x, torch.randn(4, requires_grad=True))
