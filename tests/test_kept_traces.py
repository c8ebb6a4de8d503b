"""What a discover() compilation keeps in ``thunder.last_traces``: the ATen ops inside subclass ops
without their decompositions (issue 14's first-step memory). The final traces print as before, the
others as before down to those ATen ops; the program runs as eager does;
``THUNDERPLUG_KEEP_DECOMPOSITIONS=1`` keeps everything."""

from __future__ import annotations

import thunder
import torch
from thunder.core.transform_common import Transform
from torch.testing._internal.two_tensor import TwoTensor

import thunderplug
from thunderplug.subclass.values import is_subclass_op


class SnapshotOfKeptTraces(Transform):
    """Prints the computation traces kept so far, when thunder asks for its post-optimization
    transform: the compilation has not ended yet, so nothing has been dropped."""

    def __init__(self) -> None:
        self.jitted = None
        self.printed: list[str] | None = None  # in full
        self.shallow: list[str] | None = None  # one level of subsymbols: the subclass ops' ATen ops
        self.decomposed = -1

    def transform_trace_post_optimization(self, computation_trace, **kwargs):
        if self.printed is None:
            traces = thunder.compile_stats(self.jitted).last_traces
            self.printed = [str(trace) for trace in traces]
            self.shallow = [trace.python(print_depth=1) for trace in traces]
            self.decomposed = _decomposed_under_subclass_ops(traces)
        return computation_trace


def _decomposed_under_subclass_ops(traces) -> int:
    """How many ATen ops directly inside a subclass op still hold subsymbols."""
    count, stack = 0, [bsym for trace in traces for bsym in trace.bound_symbols]
    while stack:
        bsym = stack.pop()
        if is_subclass_op(bsym.sym):
            count += sum(1 for sub in bsym.subsymbols if sub.subsymbols)
        stack.extend(bsym.subsymbols)
    return count


def _compile_and_check(monkeypatch, keep: str | None) -> tuple[list, SnapshotOfKeptTraces]:
    if keep is None:
        monkeypatch.delenv("THUNDERPLUG_KEEP_DECOMPOSITIONS", raising=False)
    else:
        monkeypatch.setenv("THUNDERPLUG_KEEP_DECOMPOSITIONS", keep)

    def fn(x, w):
        return (torch.mm(x, w).sin() * 2).sum()

    x = TwoTensor(torch.randn(4, 5), torch.randn(4, 5)).requires_grad_()
    w = torch.randn(5, 3, requires_grad=True)
    snapshot = SnapshotOfKeptTraces()
    jitted = thunder.jit(fn, executors=thunderplug.discover(quiet=True), transforms=[snapshot])
    snapshot.jitted = jitted
    actual = jitted(x, w)
    actual_grads = torch.autograd.grad(actual, [x, w])
    expected = fn(x, w)
    expected_grads = torch.autograd.grad(expected, [x, w])

    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    for got, want in zip(actual_grads, expected_grads):
        assert type(got) is type(want)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert snapshot.printed is not None and snapshot.decomposed > 0  # there was something to drop
    return thunder.last_traces(jitted), snapshot


def test_kept_traces_drop_decompositions_under_subclass_ops_only(monkeypatch):
    kept, snapshot = _compile_and_check(monkeypatch, keep=None)
    assert _decomposed_under_subclass_ops(kept) == 0
    assert [trace.python(print_depth=1) for trace in kept[: len(snapshot.shallow)]] == snapshot.shallow
    final = kept[len(snapshot.printed) - 1]
    assert "subclass_flatten" in str(final) and str(final) == snapshot.printed[-1]
    assert [str(trace) for trace in kept[: len(snapshot.printed)]] != snapshot.printed  # the earlier ones lost lines


def test_kept_traces_keep_everything_when_asked(monkeypatch):
    kept, snapshot = _compile_and_check(monkeypatch, keep="1")
    assert _decomposed_under_subclass_ops(kept) == snapshot.decomposed
    assert [str(trace) for trace in kept[: len(snapshot.printed)]] == snapshot.printed


def test_a_second_compilation_of_the_same_ops_is_not_affected():
    """The first compilation's traces lose decompositions that later ones (recorded replays, cached
    graphs) must still see: the second function compiles and runs as eager does."""

    def fn(x):
        return (x * 3).cos().sum()

    for _ in range(2):
        x = TwoTensor(torch.randn(6), torch.randn(6)).requires_grad_()
        jitted = thunder.jit(fn, executors=thunderplug.discover(quiet=True))
        actual = jitted(x)
        (actual_grad,) = torch.autograd.grad(actual, [x])
        expected = fn(x)
        (expected_grad,) = torch.autograd.grad(expected, [x])
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
        torch.testing.assert_close(actual_grad, expected_grad, rtol=0, atol=0)
        assert _decomposed_under_subclass_ops(thunder.last_traces(jitted)) == 0
