"""A list the program passes to an op and changes afterwards: eager used the list as it was at the call, and so
does discover() (wiring.fixes.symbol_arguments_as_called); stock thunder 0.2.6 kept the program's own list in the
trace, so the recorded op read the changed list: silently other values. And ``torch.split`` by a size returns a
tuple, as in eager (thunder: a list)."""

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunderplug


def _view_then_change(x):
    shape = [2, 8]
    y = x.view(shape)
    shape[0], shape[1] = 8, 2
    return y.sum(0) * 2, x.reshape(shape).sum(0)


def _pad_then_change(x):
    x = x.view(4, 4)
    pads = [1, 2]
    y = F.pad(x, pads)
    pads.append(3)
    pads.append(0)
    return y.cumsum(-1), F.pad(x, pads).cumsum(-1)


def _permute_then_change(x):
    dims = [1, 0]
    y = x.view(2, 8).permute(dims)
    dims.reverse()
    return y.cumsum(0), x.view(2, 8).permute(dims).cumsum(0)


def _nested_then_change(x):
    sizes = ([8, 8], 0)
    a, b = torch.split(x, *sizes)
    sizes[0][0], sizes[0][1] = 2, 14
    return a * 2 + b, torch.split(x, *sizes)[0].exp()


PROGRAMS = [_view_then_change, _pad_then_change, _permute_then_change, _nested_then_change]


@pytest.mark.parametrize("requires_grad", [False, True], ids=["no grad", "grad"])
@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda fn: fn.__name__.strip("_"))
def test_a_list_changed_after_the_call_is_used_as_it_was(fn, requires_grad):
    x = torch.randn(16, requires_grad=requires_grad)
    jitted = thunder.jit(fn, executors=thunderplug.discover())
    outs, expected = jitted(x), fn(x)
    for out, want in zip(outs, expected, strict=True):
        torch.testing.assert_close(out, want, rtol=0, atol=0)
    if requires_grad:
        grads = [torch.randn_like(o) for o in expected]
        torch.testing.assert_close(torch.autograd.grad(outs, x, grads), torch.autograd.grad(expected, x, grads),
                                   rtol=0, atol=0)


def test_stock_thunder_reads_the_changed_list():
    x = torch.arange(16.0)
    out = thunder.jit(_view_then_change)(x)[0]
    assert out.shape != _view_then_change(x)[0].shape  # stock's silently other result: (2,) where eager has (8,)


def _split_then_extend(x):
    parts = torch.split(x, 2)
    more = x.split(3)
    return parts + (x.sum(),), type(parts) is tuple and type(more) is tuple


def test_split_by_a_size_returns_a_tuple_as_in_eager():
    x = torch.randn(6, requires_grad=True)
    parts, is_tuple = thunder.jit(_split_then_extend, executors=thunderplug.discover())(x)
    expected, eager_is_tuple = _split_then_extend(x)
    assert is_tuple and eager_is_tuple and type(parts) is tuple
    for part, want in zip(parts, expected, strict=True):
        torch.testing.assert_close(part, want, rtol=0, atol=0)
