"""Tensor subclasses under thunder.jit(executors=discover()): proxies, guards, unrolling (inference)."""

import re

import pytest
import thunder
import torch
from subclasses import NotTraceable, ScaledTensor
from torch.testing._internal.two_tensor import TwoTensor

import thunderplug
from thunderplug.subclass.unroll import SubclassDispatchError


@pytest.fixture(scope="module", params=["default", "torchcompile"])
def executors(request):
    """discover()'s executors, and the same with thunder's torch.compile fuser added: the fused
    run proves nothing depends on re-dispatching real subclasses at run time."""
    found = thunderplug.discover()
    return found if request.param == "default" else [*found, "torchcompile"]


def assert_same(actual, expected):
    """Equal values, the same types, the same flatten context, recursively."""
    assert type(actual) is type(expected)
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e)
        return
    if type(expected) is torch.Tensor:
        torch.testing.assert_close(actual, expected)
        return
    attrs, ctx = expected.__tensor_flatten__()
    assert actual.__tensor_flatten__() == (attrs, ctx)
    for name in attrs:
        assert_same(getattr(actual, name), getattr(expected, name))


def two_tensor(*shape):
    return TwoTensor(torch.randn(*shape), torch.randn(*shape))


def test_two_tensor_ops_stay_in_the_subclass(executors):
    def fn(x, y):
        z = x * 2 + y
        return z.sin(), torch.mm(x, y.t()).sum()

    x, y = two_tensor(3, 4), torch.randn(3, 4)
    jitted = thunder.jit(fn, executors=executors)
    assert_same(jitted(x, y), fn(x, y))


def test_ctx_subclass_ops_that_stay_and_ops_that_leave(executors):
    def fn(x, w):
        y = x * 3  # stays, with a new scale in its ctx
        return y.t(), torch.mm(y, w) + 1, y.sin()

    x, w = ScaledTensor(torch.randn(4, 5), 2.0), torch.randn(5, 3)
    jitted = thunder.jit(fn, executors=executors)
    out = jitted(x, w)
    assert_same(out, fn(x, w))
    assert out[0].scale == 6.0


def test_nested_subclass(executors):
    def fn(t):
        return (t * 2).sin()

    nested = TwoTensor(two_tensor(3), two_tensor(3))
    jitted = thunder.jit(fn, executors=executors)
    out = jitted(nested)
    assert_same(out, fn(nested))
    assert type(out.a) is TwoTensor


def test_isinstance_inner_tensors_ctx_and_construction_inside_jit(executors):
    def fn(x, y):
        assert isinstance(x, ScaledTensor) and not isinstance(x, TwoTensor)
        assert isinstance(x, torch.Tensor)
        built = TwoTensor(y, y + 1) * 3
        return x.data_ * x.scale, built, x.dequantize()

    x, y = ScaledTensor(torch.randn(3, 4), 0.5), torch.randn(3, 4)
    jitted = thunder.jit(fn, executors=executors)
    assert_same(jitted(x, y), fn(x, y))


def test_trace_shows_subclass_types_and_one_symbol_per_op():
    jitted = thunder.jit(lambda x: x * 2, executors=thunderplug.discover())
    jitted(two_tensor(3, 4))
    initial = str(thunder.last_traces(jitted)[0])
    assert '"TwoTensor[cpu f32[3, 4]]"' in initial
    assert "TwoTensor.torch.mul(x, 2)" in initial
    # the unrolled dispatch, as subsymbols: flatten -> ATen ops -> unflatten
    assert re.search(r"\(t\d+, t\d+\) = subclass_flatten\(x, ", initial)
    assert re.search(r"torch\.ops\.aten\.mul\.Tensor\(t\d+, 2\)", initial)


def test_plain_outputs_build_no_subclass_object_at_run_time():
    def fn(x, w):
        return torch.mm(x * 2, w) + x.sin()  # every op leaves ScaledTensor: plain outputs

    x, w = ScaledTensor(torch.randn(4, 4), 2.0), torch.randn(4, 4)
    jitted = thunder.jit(fn, executors=thunderplug.discover())
    assert_same(jitted(x, w), fn(x, w))
    names = [bsym.sym.name for bsym in thunder.last_traces(jitted)[-1].bound_symbols]
    assert "subclass_unflatten" not in names and "subclass_flatten" not in names


def test_inner_tensors_are_the_computation_inputs_and_the_prologue_unpacks_them():
    x = two_tensor(3, 4)
    jitted = thunder.jit(lambda x: x * 2, executors=thunderplug.discover())
    jitted(x)
    final = thunder.last_traces(jitted)[-1]
    assert [a.name[-2:] for a in final.args] == ["_a", "_b"]
    names = [bsym.sym.name for bsym in final.bound_symbols]
    assert not any("TwoTensor" in name for name in names)
    assert names.count("subclass_unflatten") == 1  # only the output is rebuilt
    prologue = str(thunder.last_prologue_traces(jitted)[-1])
    assert f"{final.args[0].name} = " in prologue.replace(": \"cpu f32[3, 4]\"", "") and "check_subclass(" in prologue


def test_cache_plain_vs_subclass_and_different_ctx_are_different_entries():
    jitted = thunder.jit(lambda x: x.sin(), executors=thunderplug.discover())
    data = torch.randn(3, 4)
    jitted(ScaledTensor(data, 2.0))
    jitted(ScaledTensor(data, 2.0))
    assert (thunder.cache_misses(jitted), thunder.cache_hits(jitted)) == (1, 1)
    torch.testing.assert_close(jitted(ScaledTensor(data, 3.0)), (data * 3.0).sin())
    assert thunder.cache_misses(jitted) == 2
    torch.testing.assert_close(jitted(data), data.sin())
    assert thunder.cache_misses(jitted) == 3
    assert type(jitted(data)) is torch.Tensor


def test_metadata_guard_is_used_when_defined():
    class RoundedScale(ScaledTensor):
        """Scales equal to one decimal are interchangeable (the class says so)."""

        @classmethod
        def __metadata_guard__(cls, orig_ctx, new_ctx):
            return round(orig_ctx["scale"], 1) == round(new_ctx["scale"], 1)

        @staticmethod
        def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
            return RoundedScale(inner["data_"], ctx["scale"])

    jitted = thunder.jit(lambda x: x.sin(), executors=thunderplug.discover())
    data = torch.randn(2, 3)
    jitted(RoundedScale(data, 2.0))
    jitted(RoundedScale(data, 2.01))
    assert thunder.cache_misses(jitted) == 1
    jitted(RoundedScale(data, 3.0))
    assert thunder.cache_misses(jitted) == 2


def test_untraceable_subclass_is_refused_with_class_and_line():
    def fn(x):
        return x + 1

    jitted = thunder.jit(fn, executors=thunderplug.discover())
    with pytest.raises(Exception, match="NotTraceable") as error:
        jitted(torch.randn(3).as_subclass(NotTraceable))
    assert "__tensor_flatten__" in str(error.value)


def test_unsupported_subclass_op_names_the_op_and_the_users_line():
    def fn(x):
        return torch.exp(x)  # ScaledTensor's dispatch refuses exp

    jitted = thunder.jit(fn, executors=thunderplug.discover())
    with pytest.raises(Exception) as error:
        jitted(ScaledTensor(torch.randn(3), 2.0))
    message = "".join(str(e) for e in _chain(error.value))
    assert "ScaledTensor.torch.exp" in message and "aten.exp" in message
    assert "test_subclass_inference.py" in message


def _chain(error):
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def test_plain_thunder_jit_is_unchanged():
    """Without discover()'s executors thunder behaves as 0.2.6 does (subclass erased to a plain proxy)."""
    jitted = thunder.jit(lambda x: x * 2)
    jitted(two_tensor(3, 4))
    assert '"TwoTensor[' not in str(thunder.last_traces(jitted)[0])


def test_dispatch_error_type_is_public():
    assert issubclass(SubclassDispatchError, RuntimeError)


@pytest.mark.parametrize(
    "fn",
    [
        lambda t: torch.nn.ReLU()(t),  # F.relu(t, inplace=False): Tensor.relu takes no keywords
        lambda t: torch.nn.functional.relu(t, inplace=False),
        lambda t: 2.0 / t,  # a number first: no Tensor method takes that
        lambda t: 1 - t,
    ],
    ids=["nn.ReLU", "F.relu(inplace=False)", "number / subclass", "number - subclass"],
)
def test_calls_a_tensor_method_cannot_take_go_to_the_torch_function(fn):
    x = TwoTensor(torch.rand(3) + 1, torch.rand(3) + 1)
    out = thunder.jit(fn, executors=thunderplug.discover(quiet=True))(x)
    expected = fn(x)
    assert type(out) is TwoTensor
    torch.testing.assert_close(out.a, expected.a)
    torch.testing.assert_close(out.b, expected.b)
