"""Ops whose output shape depends on values (``x[mask]``, ``nonzero``, ``masked_select``) under discover():
the function runs with a graph break at the op, as torch.compile runs it (thunderplug.wiring.graph_breaks).
Values, gradients and which outputs require grad against eager, call after call with masks that select
different counts; stock thunder still refuses each."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import warnings

import pytest
import thunder
import torch
from thunder.core.transform_common import Transform
from torch.testing._internal.two_tensor import TwoTensor

import thunderplug
from thunderplug.commands.explain import explain
from thunderplug.plugin_api.notices import ThunderplugWarning
from thunderplug.tracing.aten import DataDependentShapeError
from thunderplug.tracing.compilation import record_of


def masked_sum(x, w):
    y = (x * w).sin()
    z = y[y > 0]
    return z.sum() * 2 + x.mean()


def three_selections(x, w):
    y = x * w
    return y[y > 0], torch.nonzero(x > 0), torch.masked_select(y, x < 0).exp()


def selection_then_matmul(x, w):
    rows = x[x.sum(-1) > 0]
    return (rows @ w.view(-1, 1)).tanh()


class MaskedHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x):
        y = self.lin(x)
        return y[y.sum(-1) > 0].relu().mean()


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(5, 6, generator=generator).requires_grad_()
    w = torch.randn(6, generator=generator).requires_grad_()
    return x, w


def _copies(tensors):
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]


def _assert_same_as_eager(fn, jitted, args):
    expected_args = _copies(args)
    actual, expected = jitted(*args), fn(*expected_args)
    actual = actual if isinstance(actual, tuple) else (actual,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert [a.requires_grad for a in actual] == [e.requires_grad for e in expected]
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype and torch.equal(a, e)
    differentiable = [i for i, e in enumerate(expected) if e.requires_grad]
    cotangents = [torch.randn_like(expected[i]) for i in differentiable]
    grads = torch.autograd.grad([actual[i] for i in differentiable], args, cotangents)
    expected_grads = torch.autograd.grad([expected[i] for i in differentiable], expected_args, cotangents)
    for g, e in zip(grads, expected_grads, strict=True):
        assert torch.equal(g, e)


@pytest.mark.parametrize("fn", [masked_sum, three_selections, selection_then_matmul])
def test_functions_with_data_dependent_ops_match_eager_call_after_call(fn):
    jitted = thunder.jit(fn, executors=thunderplug.discover(quiet=True))
    with pytest.warns(ThunderplugWarning, match="data-dependent output shape"):
        _assert_same_as_eager(fn, jitted, _inputs(0))
    counts = set()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ThunderplugWarning)  # once per compilation
        for seed in range(1, 6):
            x, w = _inputs(seed)
            counts.add(int(((x * w) > 0).sum()))
            _assert_same_as_eager(fn, jitted, (x, w))
    assert len(counts) > 1  # the masks selected different numbers of elements
    assert record_of(jitted).graph_parts and thunder.last_traces(jitted) == []
    # the prologue is the first graph's (thunder's test_litgpt_variants reads it: IndexError before)
    assert thunder.last_prologue_traces(jitted) == thunder.last_prologue_traces(record_of(jitted).graph_parts[0])


#: torch calls whose result's shape depends on values, other than indexing with a mask: thunder's automatic
#: registrations (their fake kernels raise), thunder's refusals of such forms, and torch.unique's implementations
#: thunder has no symbol for
OTHER_CALLS = {
    "unique": lambda x, w: torch.unique((x.detach() * 2).floor()).sum() + (x * w).sum(),
    "unique_dim": lambda x, w: (x.detach() * 2).floor().unique(dim=0).sum() + (x * w).sum(),
    "unique_consecutive": lambda x, w: torch.unique_consecutive((x.detach() * 2).floor()).sum() + (x * w).sum(),
    "bincount": lambda x, w: torch.bincount((x.detach().abs() * 3).long().flatten()).sum() + (x * w).sum(),
    "repeat_interleave": lambda x, w: torch.repeat_interleave(x * w, (x.detach().abs() * 2).long().flatten()).sum(),
    "nonzero_as_tuple": lambda x, w: (x * w)[torch.nonzero(x > 0, as_tuple=True)].sum(),
    "argwhere": lambda x, w: torch.argwhere(x > 0).sum() + (x * w).sum(),
    "where_condition": lambda x, w: (x * w)[torch.where(x > 0)].sum(),
}


@pytest.mark.parametrize("name", sorted(OTHER_CALLS))
def test_other_data_dependent_calls_match_eager(name):
    fn = OTHER_CALLS[name]
    jitted = thunder.jit(fn, executors=thunderplug.discover(quiet=True))
    with pytest.warns(ThunderplugWarning, match="data-dependent output shape"):
        _assert_same_as_eager(fn, jitted, _inputs(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ThunderplugWarning)
        for seed in (1, 2):
            _assert_same_as_eager(fn, jitted, _inputs(seed))
    with pytest.raises((NotImplementedError, TypeError)):  # stock: automatic registration, refusal, opaque call
        thunder.jit(fn)(*_inputs(0))


@pytest.mark.parametrize("fn", [masked_sum, three_selections])
def test_stock_thunder_still_refuses(fn):
    with pytest.raises(NotImplementedError):
        thunder.jit(fn)(*_inputs(0))


def test_module_training_steps_match_eager():
    torch.manual_seed(0)
    model = MaskedHead()
    reference = MaskedHead()
    reference.load_state_dict(model.state_dict())
    jitted = thunder.jit(model, executors=thunderplug.discover(quiet=True))
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ThunderplugWarning)
        for step in range(4):
            x = torch.randn(4, 6, generator=torch.Generator().manual_seed(step))
            losses = [jitted(x), reference(x)]
            assert torch.equal(losses[0], losses[1])
            for loss, optimizer in zip(losses, optimizers):
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            for (name, p), q in zip(model.named_parameters(), reference.parameters()):
                assert torch.equal(p, q), name


def test_subclass_inputs_break_at_a_mask_inside_the_subclass_dispatch():
    """``x[mask]`` of a TwoTensor: its ``__torch_dispatch__`` runs ``nonzero`` (the unrolled op), the graph breaks
    there, and Dynamo's graphs with subclass inputs are jitted whole (wiring.thunderfx)."""

    def fn(x, mask):
        return (x * 2)[mask].sin().sum()

    generator = torch.Generator().manual_seed(0)
    x = TwoTensor(torch.randn(6, generator=generator), torch.randn(6, generator=generator)).requires_grad_()
    mask = torch.tensor([True, False, True, True, False, True])
    expected_x = x.detach().clone().requires_grad_()
    with pytest.warns(ThunderplugWarning, match="TwoTensor"):
        actual = thunder.jit(fn, executors=thunderplug.discover(quiet=True))(x, mask)
    expected = fn(expected_x, mask)
    assert type(actual) is TwoTensor and torch.equal(actual.a, expected.a) and torch.equal(actual.b, expected.b)
    (grad,), (expected_grad,) = torch.autograd.grad(actual, x), torch.autograd.grad(expected, expected_x)
    assert torch.equal(grad.a, expected_grad.a) and torch.equal(grad.b, expected_grad.b)


def test_warning_names_the_op_and_the_users_line():
    line = masked_sum.__code__.co_firstlineno + 2
    jitted = thunder.jit(masked_sum, executors=thunderplug.discover(quiet=True))
    with pytest.warns(ThunderplugWarning) as caught:
        jitted(*_inputs(0))
    (ours,) = [w for w in caught if issubclass(w.category, ThunderplugWarning)]
    message = str(ours.message)
    assert f"x[mask] (indexing a tensor with a boolean mask) (at {__file__}:{line})" in message
    assert message.startswith("masked_sum:") and "torch.where" in message
    assert ours.filename == __file__  # points at the call of the jitted function


def test_no_grad_calls_return_outputs_without_grad():
    jitted = thunder.jit(masked_sum, executors=thunderplug.discover(quiet=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ThunderplugWarning)
        with torch.no_grad():
            out = jitted(*_inputs(0))
        assert not out.requires_grad and torch.is_grad_enabled()
        assert jitted(*_inputs(1)).requires_grad


def test_with_thunder_transforms_the_error_stands():
    jitted = thunder.jit(masked_sum, executors=thunderplug.discover(quiet=True), transforms=[Transform()])
    line = masked_sum.__code__.co_firstlineno + 2
    with pytest.raises(DataDependentShapeError, match=rf"x\[mask\].*test_graph_breaks.py:{line}\).*torch.where"):
        jitted(*_inputs(0))


def test_first_calls_from_two_threads_break_once():
    jitted = thunder.jit(masked_sum, executors=thunderplug.discover(quiet=True))
    errors = []

    def call(seed):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ThunderplugWarning)
                _assert_same_as_eager(masked_sum, jitted, _inputs(seed))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=call, args=(seed,)) for seed in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors


def test_explain_shows_the_graphs_around_the_break(tmp_path):
    jitted = thunder.jit(masked_sum, executors=thunderplug.discover(quiet=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ThunderplugWarning)
        jitted(*_inputs(0))
    rows = explain(jitted)
    parts = record_of(jitted).graph_parts
    assert rows == [row for part in parts for row in explain(part)]
    assert {row.trace for row in rows} == {"forward", "backward"}

    script = tmp_path / "masked.py"
    script.write_text(
        "import torch, thunder, thunderplug\n"
        "def f(x):\n"
        "    return x[x > 0].sum()\n"
        "thunder.jit(f, executors=thunderplug.discover(quiet=True))(torch.randn(8, requires_grad=True)).backward()\n"
    )
    shown = subprocess.run(
        [sys.executable, "-m", "thunderplug", "explain", str(script)], capture_output=True, text=True, timeout=300
    )
    assert shown.returncode == 0, shown.stderr
    assert "1 thunder.jit function(s) compiled" in shown.stdout
    assert f"graph broken at x[mask] (indexing a tensor with a boolean mask) (at {script}:3)" in shown.stdout
    as_json = subprocess.run(
        [sys.executable, "-m", "thunderplug", "explain", "--json", str(script)],
        capture_output=True, text=True, timeout=300,
    )
    (function,) = json.loads(as_json.stdout)["functions"]
    assert function["graph_break"].startswith("x[mask]") and function["rows"]


class _NotIterated(dict):
    """A dict that fails when iterated: thunder wraps each item of a dict it interprets a lookup in."""

    def items(self):
        raise AssertionError("Dynamo's weak dictionary was iterated")


def test_modules_built_inside_after_dynamo_ran_are_tagged_without_interpreting_dynamo(monkeypatch):
    """Once Dynamo has run (a graph break), its ``nn.Module.__init__`` wrapper tags each new module in a process-wide
    weak dictionary; interpreting that lookup made thunder iterate the dictionary while weakref callbacks removed
    items (``dictionary changed size during iteration``, now and then, in a full CI run)."""
    from torch._dynamo.mutation_guard import GenerationTracker

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ThunderplugWarning)
        thunder.jit(masked_sum, executors=thunderplug.discover(quiet=True))(*_inputs(0))  # Dynamo runs
    tags = GenerationTracker.generation_values
    monkeypatch.setattr(tags, "refs", _NotIterated(tags.refs))

    def builds_a_module(x):
        return torch.nn.ReLU()(x) * 2

    x = torch.randn(3, 4)
    jitted = thunder.jit(builds_a_module, executors=thunderplug.discover(quiet=True))
    assert torch.equal(jitted(x), x.relu() * 2)


def test_a_thunder_symbol_jitted_itself_keeps_thunders_refusal():
    """thunder's test_errors_where jits ``ltorch.where`` itself and expects its error: a symbol cannot run through
    Dynamo, so no graph break is made, and the error says what stock thunder's says (it did not match before)."""
    jitted = thunder.jit(thunder.torch.where, executors=thunderplug.discover(quiet=True))
    with pytest.raises(NotImplementedError, match=r"torch.where\(\) does not support only specifying a condition"):
        jitted(torch.randn(5) > 0)


class _BranchOnItem(torch.nn.Module):
    """A forward that branches in Python on a value read from a tensor (issue 42: silently wrong before)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        if h.sum().item() > 0:
            return (self.b(h) * 2).sum()
        return torch.tanh(self.b(h)).sum()


def _train_branching(make, inputs):
    torch.manual_seed(0)
    model = _BranchOnItem()
    run = make(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, grads = [], []
    for x in inputs:
        optimizer.zero_grad()
        loss = run(x)
        loss.backward()
        losses.append(loss.detach().clone())
        grads.append([p.grad.clone() for p in model.parameters()])
        optimizer.step()
    return losses, grads, [p.detach().clone() for p in model.parameters()]


def test_a_branch_on_an_item_value_takes_eagers_branch_on_every_call():
    """``if h.sum().item() > 0:`` took the else branch on every call, silently (thunder converts the unknown
    number to False, no check): now the compilation graph-breaks at the branch, every step equal to eager."""
    torch.manual_seed(1)
    inputs = [torch.randn(3, 4) * s for s in (1, -1, 1, -1, 1)]
    expected = _train_branching(lambda m: m, inputs)
    jit = lambda m: thunder.jit(m, executors=thunderplug.discover(quiet=True))  # noqa: E731
    with pytest.warns(ThunderplugWarning, match=r"bool\(\) of a number read from a tensor .*test_graph_breaks.py"):
        actual = _train_branching(jit, inputs)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    with pytest.raises(AssertionError):  # stock thunder: the else branch baked in
        torch.testing.assert_close(_train_branching(thunder.jit, inputs)[0], expected[0], rtol=0, atol=0)


def test_an_item_value_used_without_a_branch_stays_in_the_trace():
    def scale(x):
        return x * x.sum().item()

    jitted = thunder.jit(scale, executors=thunderplug.discover(quiet=True))
    x = torch.randn(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ThunderplugWarning)
        torch.testing.assert_close(jitted(x), scale(x), rtol=0, atol=0)
    assert thunder.last_traces(jitted) and not record_of(jitted).graph_parts


class _HookedInForward(torch.nn.Module):
    """Autograd hooks registered inside forward, on each call (issue 42: ignored or refused before)."""

    def __init__(self, kind):
        super().__init__()
        self.a, self.b, self.kind = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), kind

    def forward(self, x):
        h = self.a(x)
        if self.kind == "intermediate":
            h.register_hook(lambda g: g * 10)
        elif self.kind == "parameter":
            self.a.weight.register_hook(lambda g: g * 3)
        elif self.kind == "module":
            handle = self.b.register_full_backward_hook(lambda module, gi, go: (gi[0] * 2,))
            return self.b(h).square().sum(), handle
        return self.b(h).square().sum(), None


def _train_hooked(make, kind):
    torch.manual_seed(0)
    model = _HookedInForward(kind)
    run = make(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(1)
    losses, grads = [], []
    for _ in range(3):
        optimizer.zero_grad()
        loss, handle = run(torch.randn(3, 4))
        loss.backward()
        if handle is not None:
            handle.remove()
        losses.append(loss.detach().clone())
        grads.append([p.grad.clone() for p in model.parameters()])
        optimizer.step()
    return losses, grads


@pytest.mark.parametrize("kind", ["intermediate", "parameter", "module"])
def test_hooks_registered_inside_forward_run_as_in_eager(kind):
    expected = _train_hooked(lambda m: m, kind)
    jit = lambda m: thunder.jit(m, executors=thunderplug.discover(quiet=True))  # noqa: E731
    with pytest.warns(ThunderplugWarning, match="register_"):
        actual = _train_hooked(jit, kind)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    with pytest.raises((AttributeError, RuntimeError, AssertionError)):  # stock thunder: refused or ignored
        torch.testing.assert_close(_train_hooked(thunder.jit, kind), expected, rtol=0, atol=0)


def masked_assignment(x, w):
    """``a[mask] = value`` with a value requiring grad, in a trace (no break): its gradient, ``g[mask]`` summed
    to the value's shape (fixes' ``boolean_mask_setitem_grad``)."""
    z = torch.zeros(5, 6)
    z[x > 0] = w.sum()
    return (z * x).sum()


def intersections(x, w):
    """torchvision's ``_loss_inter_union``: an update of a tensor made before the break (not requiring grad) by
    values requiring grad, read after the graph (graph_breaks' ``_eager_where_inputs_gain_grad``)."""
    lo, hi = (x * w).unbind(-1)[:2]
    inter = torch.zeros_like(lo)
    mask = hi > lo
    inter[mask] = hi[mask] - lo[mask]
    return (inter * 3 + lo).sum()


@pytest.mark.parametrize("fn", [masked_assignment, intersections])
def test_masked_assignments_of_values_requiring_grad(fn):
    jitted = thunder.jit(fn, executors=thunderplug.discover())
    for seed in range(3):
        _assert_same_as_eager(fn, jitted, _inputs(seed))
