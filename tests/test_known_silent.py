"""Silent differences from eager that thunderplug does not fix yet (stock thunder 0.2.6 has each too), recorded as
strict xfails so that a fix shows up here (docs/known-issues.md, "Known silent"), and the None reads it fixed.

- None reads (fixed): a ``None`` the jitted program reads from a module attribute, a global, an attribute of an
  argument (and from their submodules, dicts and lists), changed to a value after the first call: thunder's
  prologue checked no ``None`` read, so the cached trace kept the first call's branch; under discover() each gets a
  ``check_none`` (wiring.fixes.none_reads_guarded), so the changed call compiles its own program.
- Changed defaults: a function's default values are constants to thunder, so a changed ``__defaults__`` is not
  seen by a call relying on it.
- A view made under ``no_grad`` of a tensor requiring grad, returned: eager's is a leaf requiring grad.

The aliased views once recorded here (two views of one tensor passed as two arguments) are fixed:
tests/test_aliased_inputs.py."""

import types
from collections.abc import Callable
from typing import Any

import pytest
import thunder
import torch
from torch import nn

import thunderplug

SCALE: Any = None


class _Scaled(nn.Module):
    def __init__(self, scale: Any = None):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = scale

    def forward(self, x):
        y = self.lin(x)
        return y * self.scale if self.scale is not None else y


class _Nested(nn.Module):
    """The None is read from a submodule, a dict and a list attribute of the jitted module."""

    def __init__(self):
        super().__init__()
        self.inner = _Scaled()
        self.options = {"shift": None}
        self.factors = [None]

    def forward(self, x):
        y = self.inner(x)
        if self.options["shift"] is not None:
            y = y + self.options["shift"]
        return y if self.factors[0] is None else y * self.factors[0]


class _KeywordScaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, scale=None):
        y = self.lin(x)
        return y if scale is None else y * scale


def _global_scaled(x):
    return x * SCALE if SCALE is not None else x + 1


def _argument_attribute_scaled(x, box):
    return x * box.scale if box.scale is not None else x + 1


class _Box:
    def __init__(self, scale):
        self.scale = scale


DEFAULTS = pytest.mark.xfail(strict=True, reason="thunder 0.2.6 reads default values as constants (stock thunder too)")
NO_GRAD_VIEW = pytest.mark.xfail(strict=True, reason="a no_grad view returned: thunder 0.2.6 passes it through its "
                                  "autograd Function (stock thunder too)")


def _grads_of(fn: Callable[..., torch.Tensor], leaves: list[torch.Tensor], *args: Any, **kwargs: Any) -> list:
    """``fn``'s output and the gradients of its sum to ``leaves``, the leaves' gradients cleared after."""
    output = fn(*args, **kwargs)
    output.sum().backward()
    grads = [leaf.grad for leaf in leaves]
    for leaf in leaves:
        leaf.grad = None
    return [output, *grads]


def _as_eager(jitted: Callable[..., torch.Tensor], eager: Callable[..., torch.Tensor], leaves: list[torch.Tensor],
              *args: Any, **kwargs: Any) -> None:
    """The jitted call's output, its requires_grad and every leaf's gradient equal eager's bit for bit."""
    got, expected = _grads_of(jitted, leaves, *args, **kwargs), _grads_of(eager, leaves, *args, **kwargs)
    assert got[0].requires_grad == expected[0].requires_grad
    for a, b in zip(got, expected, strict=True):
        assert (a is None) == (b is None), f"{a} where eager has {b}"
        if a is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def _leaf(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, requires_grad=True)


def test_a_module_attribute_set_after_the_first_call():
    """None, then a tensor (a leaf requiring grad), then None again: each as eager; None twice is one program."""
    torch.manual_seed(0)
    model = _Scaled()
    jitted = thunder.jit(model, executors=thunderplug.discover())
    x, scale = _leaf(2, 4), _leaf(4)
    leaves = [x, scale, *model.parameters()]
    _as_eager(jitted, model, leaves, x)
    _as_eager(jitted, model, leaves, x)
    assert thunder.cache_misses(jitted) == 1
    model.scale = scale
    _as_eager(jitted, model, leaves, x)
    model.scale = None
    _as_eager(jitted, model, leaves, x)
    assert thunder.cache_misses(jitted) == 2


def test_a_module_attribute_set_to_none_after_the_first_call():
    torch.manual_seed(0)
    scale = _leaf(4)
    model = _Scaled(scale)
    jitted = thunder.jit(model, executors=thunderplug.discover())
    x = _leaf(2, 4)
    leaves = [x, scale, *model.parameters()]
    _as_eager(jitted, model, leaves, x)
    model.scale = None
    _as_eager(jitted, model, leaves, x)
    model.scale = scale
    _as_eager(jitted, model, leaves, x)
    assert thunder.cache_misses(jitted) == 2


def test_a_submodule_dict_and_list_attribute_set_after_the_first_call():
    torch.manual_seed(0)
    model = _Nested()
    jitted = thunder.jit(model, executors=thunderplug.discover())
    x, scale, shift, factor = _leaf(2, 4), _leaf(4), _leaf(4), _leaf(4)
    leaves = [x, scale, shift, factor, *model.parameters()]
    _as_eager(jitted, model, leaves, x)
    model.inner.scale = scale
    _as_eager(jitted, model, leaves, x)
    model.options["shift"] = shift
    _as_eager(jitted, model, leaves, x)
    model.factors[0] = factor
    _as_eager(jitted, model, leaves, x)
    model.inner.scale, model.options["shift"], model.factors[0] = None, None, None
    _as_eager(jitted, model, leaves, x)
    _as_eager(jitted, model, leaves, x)
    assert thunder.cache_misses(jitted) == 4  # the last call is the first one's program


def test_a_none_default_of_a_keyword_argument():
    torch.manual_seed(0)
    model = _KeywordScaled()
    jitted = thunder.jit(model, executors=thunderplug.discover())
    x, scale = _leaf(2, 4), _leaf(4)
    leaves = [x, scale, *model.parameters()]
    _as_eager(jitted, model, leaves, x)
    _as_eager(jitted, model, leaves, x, scale=scale)
    _as_eager(jitted, model, leaves, x, scale=None)
    _as_eager(jitted, model, leaves, x, scale)
    _as_eager(jitted, model, leaves, x)
    assert thunder.cache_misses(jitted) == 4


def test_a_global_set_after_the_first_call():
    global SCALE
    jitted = thunder.jit(_global_scaled, executors=thunderplug.discover())
    x, scale = _leaf(3), _leaf(3)
    try:
        _as_eager(jitted, _global_scaled, [x, scale], x)
        for value in (3.0, scale, None):
            SCALE = value
            _as_eager(jitted, _global_scaled, [x, scale], x)
    finally:
        SCALE = None
    assert thunder.cache_misses(jitted) == 3


def test_an_attribute_of_an_argument():
    jitted = thunder.jit(_argument_attribute_scaled, executors=thunderplug.discover())
    x, scale = _leaf(3), _leaf(3)
    for box in (_Box(None), _Box(scale), _Box(None), _Box(None)):
        _as_eager(jitted, _argument_attribute_scaled, [x, scale], x, box)
    assert thunder.cache_misses(jitted) == 2


def test_a_none_argument_is_checked():
    """A None among the call's own arguments (and in their containers) is checked as the other reads are."""
    def scaled(x, s, pair):
        return (x * s if s is not None else x + 1) + (0 if pair[0] is None else pair[0])

    jitted = thunder.jit(scaled, executors=thunderplug.discover())
    x, s = _leaf(3), _leaf(3)
    for args in ((None, (None,)), (s, (None,)), (None, [s]), (None, (None,))):
        _as_eager(jitted, scaled, [x, s], x, *args)
    assert thunder.cache_misses(jitted) == 3


def test_a_closure_cell_set_after_the_first_call():
    scale: Any = None

    def scaled(x):
        return x * scale if scale is not None else x + 1

    jitted = thunder.jit(scaled, executors=thunderplug.discover())
    x, tensor = _leaf(3), _leaf(3)
    for value in (None, tensor, None, None):
        scale = value
        _as_eager(jitted, scaled, [x, tensor], x)
    assert thunder.cache_misses(jitted) == 2


def _defaulted(x, scale=None, k=2):
    return (x if scale is None else x * scale) * k


@DEFAULTS
@pytest.mark.parametrize("defaults", [(None, 3), (3.0, 2)], ids=["number", "none"])
def test_a_changed_default_value(defaults: tuple) -> None:
    function = types.FunctionType(_defaulted.__code__, globals(), "defaulted", _defaulted.__defaults__)
    jitted = thunder.jit(function, executors=thunderplug.discover())
    x = torch.randn(3)
    jitted(x)
    function.__defaults__ = defaults
    torch.testing.assert_close(jitted(x), function(x), rtol=0, atol=0)


def _a_no_grad_view_and_another_path(x):
    with torch.no_grad():
        v = x.view(-1)
    return v, x * 3


def _a_no_grad_view_and_a_value_from_it(x):
    with torch.no_grad():
        v = x.view(-1)
    return v, v * 2


@NO_GRAD_VIEW
@pytest.mark.parametrize("fn", [_a_no_grad_view_and_another_path, _a_no_grad_view_and_a_value_from_it],
                         ids=["another_path", "value_from_it"])
def test_a_view_made_under_no_grad_returned(fn):
    """eager: the view is a leaf requiring grad (``grad_fn`` None; a backward through it fills ``v.grad``) and
    ``v * 2`` requires grad. discover(): with another path to ``x`` the view comes back through thunder's autograd
    Function, not a leaf; without one (``value_from_it``) there is no backward and ``v * 2`` does not require grad."""
    x = torch.randn(2, 3, requires_grad=True)
    expected = fn(x)
    actual = thunder.jit(fn, executors=thunderplug.discover())(x)
    assert [(o.requires_grad, o.is_leaf) for o in actual] == [(o.requires_grad, o.is_leaf) for o in expected]
