"""Silent differences from eager that thunderplug does not fix yet (stock thunder 0.2.6 has each too), recorded as
strict xfails so that a fix shows up here (docs/known-issues.md, "Known silent"), and the None reads it fixed.

- None reads (fixed): a ``None`` the jitted program reads from a module attribute, a global, an attribute of an
  argument (and from their submodules, dicts and lists), changed to a value after the first call: thunder's
  prologue checked no ``None`` read, so the cached trace kept the first call's branch; under discover() each gets a
  ``check_none`` (wiring.fixes.none_reads_guarded), so the changed call compiles its own program.
- A None read of an object the program returns (fixed): the epilogue's proxy of the object, named like the read's
  guard, took the guard's place in the prologue (wiring.fixes.constraints_keep_their_reads).
- Changed defaults (fixed): thunder bound a call's missing arguments to the function's defaults as constants, so a
  changed ``__defaults__`` (``__kwdefaults__``, a list default changed in place) was not seen by a call relying on
  it; under discover() each is read from the function and checked (wiring.fixes.defaults_read_from_the_function).
- The length of a list read from the inputs: thunder checks the items read, not the length.
- A view made under ``no_grad`` of a tensor requiring grad, returned: eager's is a leaf requiring grad.

The aliased views once recorded here (two views of one tensor passed as two arguments) are fixed:
tests/test_aliased_inputs.py."""

import types
import warnings
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


LIST_LENGTH = pytest.mark.xfail(strict=True, reason="thunder 0.2.6 checks the items read from a list, not its length "
                                 "(stock thunder too)")
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


class _Cache:
    """A read of a None class attribute through an instance (transformers' caches read theirs through ``self``)."""

    layer_class: Any = None

    def __init__(self):
        self.replicate: Any = None


def _reads_the_instance_attribute_and_returns(x, cache):
    return (x if cache.replicate is None else x * cache.replicate), cache


def _reads_the_class_attribute_and_returns(x, cache):
    return (x if cache.layer_class is None else x * cache.layer_class), cache


@pytest.mark.parametrize("where", ["instance", "class"])
def test_a_none_read_of_an_object_the_program_returns(where: str) -> None:
    """The epilogue's proxy of the returned object (named ``any0`` among the epilogue's names) took the place of the
    None read's guard named alike in the computation's, which then checked the object (transformers 4.57's
    StaticCache: a check failing at every call) or, left unchecked, kept the first call's branch."""
    fn = _reads_the_instance_attribute_and_returns if where == "instance" else _reads_the_class_attribute_and_returns
    jitted = thunder.jit(fn, executors=thunderplug.discover())
    x, scale = _leaf(3), _leaf(3)
    cache = _Cache()
    try:
        for _ in range(2):
            _as_eager(lambda *a: jitted(*a)[0], lambda *a: fn(*a)[0], [x, scale], x, cache)
        assert thunder.cache_misses(jitted) == 1
        if where == "instance":
            cache.replicate = scale
        else:
            _Cache.layer_class = scale
        _as_eager(lambda *a: jitted(*a)[0], lambda *a: fn(*a)[0], [x, scale], x, cache)
        assert jitted(x, cache)[1] is cache
        assert thunder.cache_misses(jitted) == 2
    finally:
        _Cache.layer_class = None

def _defaulted(x, scale=None, k=2):
    return (x if scale is None else x * scale) * k


def _function_of(fn: Callable[..., Any], defaults: tuple) -> Callable[..., Any]:
    """A fresh function with ``fn``'s code and ``defaults``, so that changing them leaves ``fn`` as it is."""
    function = types.FunctionType(fn.__code__, globals(), fn.__name__, defaults)
    function.__kwdefaults__ = fn.__kwdefaults__ and dict(fn.__kwdefaults__)
    return function


@pytest.mark.parametrize("first, changed, programs", [
    ((None, 2), (None, 3), 2),
    ((None, 2), (3.0, 2), 2),
    ((None, 2), ("tensor", 2), 2),
    (("tensor", 2), ("other tensor", 2), 1),
    (("tensor", 2), (None, 2), 2),
], ids=["number", "none_to_number", "none_to_tensor", "tensor_to_tensor", "tensor_to_none"])
def test_a_changed_default_value(first: tuple, changed: tuple, programs: int) -> None:
    """A call relying on a changed default gives eager's result and gradients; unchanged, it is one program; back to
    the first defaults, the first program. A tensor default (requiring grad: it gets its gradient, as in eager) is
    an input read from the function at each call, so another tensor of its metadata runs the same program."""
    scale, other = _leaf(3), _leaf(3)
    named = {"tensor": scale, "other tensor": other}

    def values(defaults: tuple) -> tuple:
        return tuple(named.get(v, v) if isinstance(v, str) else v for v in defaults)

    function = _function_of(_defaulted, values(first))
    jitted = thunder.jit(function, executors=thunderplug.discover())
    x = _leaf(3)
    _as_eager(jitted, function, [x, scale, other], x)
    _as_eager(jitted, function, [x, scale, other], x)
    assert thunder.cache_misses(jitted) == 1
    function.__defaults__ = values(changed)
    _as_eager(jitted, function, [x, scale, other], x)
    _as_eager(jitted, function, [x, scale, other], x)
    assert thunder.cache_misses(jitted) == programs
    function.__defaults__ = values(first)
    _as_eager(jitted, function, [x, scale, other], x)
    assert thunder.cache_misses(jitted) == programs


def _tupled(x, scales=(2.0, 3.0), mode="add"):
    return x * scales[0] + scales[1] if mode == "add" else x * scales[0] - scales[1]


@pytest.mark.parametrize("changed", [((2.0, 4.0), "add"), ((2.0, 3.0), "subtract")], ids=["tuple", "string"])
def test_a_changed_tuple_or_string_default(changed: tuple) -> None:
    function = _function_of(_tupled, _tupled.__defaults__)
    jitted = thunder.jit(function, executors=thunderplug.discover())
    x = _leaf(3)
    _as_eager(jitted, function, [x], x)
    function.__defaults__ = changed
    _as_eager(jitted, function, [x], x)
    function.__defaults__ = _tupled.__defaults__
    _as_eager(jitted, function, [x], x)
    assert thunder.cache_misses(jitted) == 2


def test_a_tensor_default_changed_in_place() -> None:
    """A tensor default is an input of the one program, read from the function at each call, so an in-place change
    is seen without compiling again (stock thunder made it a constant the prologue cannot read: a graph break)."""
    def scaled(x, scale=torch.ones(3)):  # noqa: B008 (the tensor default is what is tested)
        return x * scale

    jitted = thunder.jit(scaled, executors=thunderplug.discover())
    x = _leaf(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", thunderplug.ThunderplugWarning)
        _as_eager(jitted, scaled, [x], x)
        scaled.__defaults__[0].mul_(3)
        _as_eager(jitted, scaled, [x], x)
    assert thunder.cache_misses(jitted) == 1


def _keyword_only(x, *, k=2, shift="none"):
    return x * k if shift == "none" else x * k + 1


def test_a_changed_keyword_only_default() -> None:
    function = _function_of(_keyword_only, ())
    jitted = thunder.jit(function, executors=thunderplug.discover())
    x = _leaf(3)
    _as_eager(jitted, function, [x], x)
    _as_eager(jitted, function, [x], x)
    assert thunder.cache_misses(jitted) == 1
    for kwdefaults in ({"k": 5, "shift": "none"}, {"k": 5, "shift": "one"}, {"k": 2, "shift": "none"}):
        function.__kwdefaults__ = kwdefaults
        _as_eager(jitted, function, [x], x)
    assert thunder.cache_misses(jitted) == 3


class _DefaultedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, k=2, scale=None):
        y = self.lin(x) * k
        return y if scale is None else y * scale


def test_a_changed_default_of_a_module_forward() -> None:
    """The defaults of ``forward`` (the class's function, read through the module) and of a helper it calls."""
    torch.manual_seed(0)
    cls = type("Forward", (_DefaultedForward,), {"forward": _function_of(_DefaultedForward.forward, (2, None))})
    model = cls()
    jitted = thunder.jit(model, executors=thunderplug.discover())
    x, scale = _leaf(2, 4), _leaf(4)
    leaves = [x, scale, *model.parameters()]
    _as_eager(jitted, model, leaves, x)
    _as_eager(jitted, model, leaves, x)
    assert thunder.cache_misses(jitted) == 1
    cls.forward.__defaults__ = (3, None)
    _as_eager(jitted, model, leaves, x)
    cls.forward.__defaults__ = (3, scale)
    _as_eager(jitted, model, leaves, x)
    assert thunder.cache_misses(jitted) == 3


def _from_a_list_default(x, factors=[2.0]):  # noqa: B006 (the mutable default is what is tested)
    return x * factors[0]


def _from_a_dict_default(x, options={"k": 2}):  # noqa: B006
    return x * options["k"]


@pytest.mark.parametrize("fn, change", [
    (_from_a_list_default, lambda defaults: defaults[0].__setitem__(0, 7.0)),
    (_from_a_dict_default, lambda defaults: defaults[0].update(k=5)),
], ids=["list", "dict"])
def test_a_mutable_default_changed_in_place(fn: Callable[..., Any], change: Callable[[tuple], None]) -> None:
    function = _function_of(fn, tuple(type(v)(v) for v in fn.__defaults__))
    jitted = thunder.jit(function, executors=thunderplug.discover())
    x = _leaf(3)
    _as_eager(jitted, function, [x], x)
    change(function.__defaults__)
    _as_eager(jitted, function, [x], x)
    assert thunder.cache_misses(jitted) == 2


def _appending_to_a_list_default(x, outputs=[]):  # noqa: B006
    outputs.append(x * 2)
    return x + len(outputs)


def test_a_tensor_appended_to_a_list_default() -> None:
    """As to a list argument (tests/test_container_mutations.py): the list gets eager's tensors, not thunder's
    proxies, and each call appends (stock thunder left a proxy in the default, and later calls appended nothing)."""
    function = _function_of(_appending_to_a_list_default, ([],))
    eager = _function_of(_appending_to_a_list_default, ([],))
    jitted = thunder.jit(function, executors=thunderplug.discover())
    x = torch.randn(3)
    with pytest.warns(UserWarning, match="list.append"):  # the graph break, once
        torch.testing.assert_close(jitted(x), eager(x), rtol=0, atol=0)
    for _ in range(2):
        torch.testing.assert_close(jitted(x), eager(x), rtol=0, atol=0)
    assert all(type(v) is torch.Tensor for v in function.__defaults__[0])
    torch.testing.assert_close(function.__defaults__[0], eager.__defaults__[0], rtol=0, atol=0)


def _times_the_length(x, items):
    return x * len(items)


@LIST_LENGTH
def test_the_length_of_a_list_argument_grown_after_the_first_call() -> None:
    jitted = thunder.jit(_times_the_length, executors=thunderplug.discover())
    x, items = _leaf(3), [1, 2]
    _as_eager(jitted, _times_the_length, [x], x, items)
    items.append(3)
    _as_eager(jitted, _times_the_length, [x], x, items)


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
