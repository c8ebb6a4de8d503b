"""A jitted function that changes a container it did not create (an argument list or dict, a list attribute
of an argument or of the module, a global list): stock thunder 0.2.6 changes the real container while tracing
(it holds thunder's proxies after the first call) and changes nothing on later, cached calls, silently.
Under ``discover()`` such a compilation breaks the graph at the change, naming the method, the container's type
and the user's line (Dynamo replays the change on every call, as eager makes it), or, where the graph cannot
break, is refused and the container left as it was; containers the function creates itself work as before
(wiring.fixes.breaking_at_outside_container_mutations)."""

import re

import pytest
import thunder
import torch
from thunder.core.proxies import TensorProxy

import thunderplug

_GLOBAL_LIST: list = []


def _jit(fn):
    return thunder.jit(fn, executors=thunderplug.discover())


def _append_to_argument(x, lst):
    lst.append(x * 2)  # the line the refusal names
    return x + 1


class _Box:
    def __init__(self):
        self.items = []
        self.d = {}


def _append_to_attribute(x, box):
    box.items.append(x)
    return x


def _write_dict_item(x, box):
    box.d["k"] = x * 3
    return x


def _append_to_global(x):
    _GLOBAL_LIST.append(x)
    return x


class _Accumulates(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, x):
        self.seen.append(x.sum())
        return x * 2


def _line_of(fn, text):
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _contents(container):
    return (container.items, container.d) if isinstance(container, _Box) else container


@pytest.mark.parametrize(
    ("fn", "make", "method", "text"),
    [
        (_append_to_argument, lambda: [], "list.append", "lst.append"),
        (_append_to_attribute, _Box, "list.append", "box.items.append"),
        (_write_dict_item, _Box, "dict.__setitem__", 'box.d["k"]'),
    ],
    ids=["argument list append", "list attribute of an argument", "dict item write"],
)
def test_the_graph_breaks_at_the_change_naming_the_method_the_type_and_the_line(fn, make, method, text):
    """Dynamo replays the change on every call: the container ends as eager's, holding tensors."""
    jitted = _jit(fn)
    container, expected = make(), make()
    kind = "dict" if method.startswith("dict") else "list"
    where = f"{re.escape(__file__)}:{_line_of(fn, text)}"
    with pytest.warns(thunderplug.ThunderplugWarning, match=rf"`{re.escape(method)}` at {where} changes a {kind}"):
        for _ in range(3):
            x = torch.randn(3)
            torch.testing.assert_close(jitted(x, container), fn(x, expected), rtol=0, atol=0)
            torch.testing.assert_close(_contents(container), _contents(expected), rtol=0, atol=0)


def test_global_and_module_attribute_lists_change_as_in_eager():
    with pytest.warns(thunderplug.ThunderplugWarning, match="list.append"):
        jitted = _jit(_append_to_global)
        for _ in range(2):
            x = torch.randn(3)
            jitted(x)
            assert _GLOBAL_LIST[-1] is x  # as in eager: the argument itself
    assert len(_GLOBAL_LIST) == 2
    _GLOBAL_LIST.clear()
    model = _Accumulates()
    with pytest.warns(thunderplug.ThunderplugWarning, match="list.append"):
        jitted = _jit(model)
        xs = [torch.randn(3) for _ in range(2)]
        for x in xs:
            torch.testing.assert_close(jitted(x), x * 2, rtol=0, atol=0)
    assert [type(t) for t in model.seen] == [torch.Tensor] * 2
    torch.testing.assert_close(model.seen, [x.sum() for x in xs], rtol=0, atol=0)


def test_refused_where_the_graph_cannot_break_and_the_process_is_usable_after():
    """Under a thunder transform the graph cannot break: the change is refused, the list left as it was."""
    from thunder.core.transform_common import Transform

    lst = []
    where = f"{re.escape(__file__)}:{_line_of(_append_to_argument, 'lst.append')}"
    jitted = thunder.jit(_append_to_argument, executors=thunderplug.discover(), transforms=[Transform()])
    for _ in range(2):  # nothing cached: the second call is refused too
        with pytest.raises(NotImplementedError, match=rf"`list.append` at {where} changes a list .*Return"):
            jitted(torch.randn(3), lst)
        assert lst == []
    x = torch.randn(3, requires_grad=True)
    jitted = _jit(lambda x, lst: (x * 2 + len(lst), [x.cos()]))
    out, made = jitted(x, lst)
    torch.testing.assert_close(out, x * 2)
    torch.testing.assert_close(made[0], x.cos())
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))
    assert lst == [] and _append_to_argument(x, lst).requires_grad and len(lst) == 1  # eager as before


def test_stock_thunder_leaves_proxies_and_skips_later_calls():
    lst, box = [], _Box()
    jitted, jitted_box = thunder.jit(_append_to_argument), thunder.jit(_write_dict_item)
    jitted(torch.randn(3), lst)
    jitted_box(torch.randn(3), box)
    assert len(lst) == 1 and isinstance(lst[0], TensorProxy)  # a trace's proxy, not a tensor
    assert isinstance(box.d["k"], TensorProxy)
    lst.clear()
    jitted(torch.randn(3), lst)  # cached: nothing appended
    assert lst == []


def _local_containers(x, lst):
    made = []
    made.append(x * 2)
    made.extend([x.sin()])
    table = {}
    table["a"] = made[0] + made[1]
    table.update(b=x.cos())
    kept = ()
    kept += (table["a"], table["b"])
    copy = lst[:]
    copy.append(x)
    box = _Box()
    box.items.append(x.exp())
    lst.append(x)  # pushed and popped: the argument ends as it came
    lst.pop()
    return kept[0] * kept[1] + copy[-1] + box.items[0] + len(lst)


def test_containers_the_function_creates_work_as_eager():
    x = torch.randn(4, requires_grad=True)
    lst = [1]
    jitted = _jit(_local_containers)
    for _ in range(2):
        expected, actual = _local_containers(x, lst), jitted(x, lst)
        torch.testing.assert_close(actual, expected)
        grads = [torch.autograd.grad(out.sum(), x)[0] for out in (actual, expected)]
        torch.testing.assert_close(*grads)
        assert lst == [1]


def _memo(x, cache):
    if "scale" not in cache:
        cache["scale"] = 2.0  # a value that is the same on every call: left as thunder leaves it
    return x * cache["scale"]


def test_dict_changed_with_plain_values_is_left_as_before():
    cache = {}
    x = torch.randn(3)
    jitted = _jit(_memo)
    assert torch.equal(jitted(x, cache), x * 2) and cache == {"scale": 2.0}
    assert torch.equal(jitted(x, cache), x * 2) and cache == {"scale": 2.0}


class _CollectsWithHooks(torch.nn.Module):
    """transformers' output capturing: a hook appends to a collector the forward creates for the call."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inner = torch.nn.Linear(4, 4)
        self.collector = None
        self.inner.register_forward_hook(lambda m, args, out: self.collector.append(out) if self.collector else None)

    def forward(self, x):
        self.collector = [x]
        y = self.inner(x).tanh()
        collected = tuple(self.collector)
        self.collector = None
        return y, collected


def test_a_collector_created_by_the_call_works_as_eager():
    x = torch.randn(2, 4, requires_grad=True)
    model = _CollectsWithHooks()
    jitted = _jit(model)
    for _ in range(2):
        (actual, collected), (expected, eager_collected) = jitted(x), model(x)
        assert torch.equal(actual, expected) and len(collected) == len(eager_collected) == 2
        assert torch.equal(collected[1], eager_collected[1]) and model.collector is None
        grads = [torch.autograd.grad(y.sum() + c[1].sum(), x)[0] for y, c in ((actual, collected),
                                                                             (expected, eager_collected))]
        torch.testing.assert_close(*grads)


def _append_a_constant(x, lst):
    lst.append(1)
    return x


def test_a_list_grown_without_proxies_is_left_as_stock_thunder_leaves_it_with_a_warning():
    """The change is made while tracing only, so a cached call skips it (eager: every call). Not refused, since
    code that appends to a list while tracing (thunder's tests counting their traces) relies on it; warned,
    naming the method and the user's line."""
    lst = []
    jitted = _jit(_append_a_constant)
    with pytest.warns(thunderplug.ThunderplugWarning, match=re.escape(f"`list.append` at {__file__}:")) as caught:
        jitted(torch.randn(3), lst)
    assert any("later (cached) calls skip it" in str(w.message) for w in caught)
    jitted(torch.randn(3), lst)
    assert lst == [1]  # eager: [1, 1]


class _Counts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.seen: list[int] = []

    def forward(self, x):
        self.seen.append(x.shape[0])
        return x * 2


def test_a_module_list_attribute_grown_is_warned():
    model = _Counts()
    with pytest.warns(thunderplug.ThunderplugWarning, match="changes a list that the jitted function did not"):
        _jit(model)(torch.randn(3))


def _rewrite_an_item(x, lst):
    lst[0] = lst[0] * 1  # the same state after every call, as in eager
    return x


@pytest.mark.parametrize(
    "fn, args", [(_rewrite_an_item, ([3],)), (_memo, ({},))], ids=["list item rewritten", "memo dict"]
)
def test_changes_that_repeat_to_the_same_state_are_not_warned(fn, args):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", thunderplug.ThunderplugWarning)
        _jit(fn)(torch.randn(3), *args)


def test_changes_made_by_library_code_are_not_warned():
    """Only the user's own lines are named: the standard library's and installed packages' (thunder's tests,
    shipped in its wheel, append to lists while tracing to count traces) are not."""
    import sysconfig

    from thunderplug.wiring.fixes import _in_a_library

    assert _in_a_library(f" at {sysconfig.get_paths()['stdlib']}/re/__init__.py:10")
    assert _in_a_library(f" at {sysconfig.get_paths()['purelib']}/thunder/tests/test_core.py:5")
    assert not _in_a_library(f" at {__file__}:1")


def _append_then_fail(x, lst):
    lst.append(x * 2)
    raise ValueError("in the user's code")


def test_a_failed_compilation_leaves_the_container_as_it_was():
    lst = [0]
    with pytest.raises(ValueError, match="user's code"):
        _jit(_append_then_fail)(torch.randn(3), lst)
    assert lst == [0]  # stock thunder: [0, <TensorProxy>]
