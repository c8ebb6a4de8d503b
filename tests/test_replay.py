"""Replaying an unrolled graph copies the bound symbols an earlier replay recorded (subclass.replay):
the copies compute what eager computes, forward and backward, and record in the compilation what
calling the ATen symbols would have recorded."""

from __future__ import annotations

import dataclasses

import thunder
import torch
from torch.testing._internal.two_tensor import TwoTensor

import thunderplug
from thunderplug.subclass import unroll
from thunderplug.tracing.compilation import record_of


def _two(*shape, grad=False):
    a, b = torch.randn(*shape, dtype=torch.float64), torch.randn(*shape, dtype=torch.float64)
    return TwoTensor(a, b).requires_grad_(grad)


def _counting_graph_calls(monkeypatch) -> list:
    calls: list = []
    original = unroll._call_graph

    def counted(graph, leaves, table, display):
        calls.append(display)
        return original(graph, leaves, table, display)

    monkeypatch.setattr(unroll, "_call_graph", counted)
    return calls


def test_ops_with_the_same_metadata_are_copied_and_match_eager_forward_and_backward(monkeypatch):
    calls = _counting_graph_calls(monkeypatch)

    def f(x, y):
        return (torch.sin(x) * 3 + torch.sin(y) * 3).sum()

    x, y = _two(7, 5, grad=True), _two(7, 5, grad=True)
    ex, ey = (t.detach().clone().requires_grad_(True) for t in (x, y))
    jitted = thunder.jit(f, executors=thunderplug.discover(quiet=True))
    out = jitted(x, y)
    expected = f(ex, ey)
    torch.testing.assert_close(out.a, expected.a)
    torch.testing.assert_close(out.b, expected.b)
    out.backward()
    expected.backward()
    for got, want in ((x.grad, ex.grad), (y.grad, ey.grad)):
        torch.testing.assert_close(got.a, want.a)
        torch.testing.assert_close(got.b, want.b)
    sins = [d for d in calls if "sin" in d and "backward" not in d]
    assert len(sins) == 1  # sin(y), its re-emission in autodiff and sin(x)'s: copies of the first replay
    names = [p.name for b in thunder.last_traces(jitted)[0].bound_symbols for p in b.flat_proxy_outs]
    assert len(names) == len(set(names))  # every copy got fresh names


def test_copies_record_fallback_use_in_each_compilation():
    def f(x):
        return torch.ops.aten.exp2.default(x) * 2

    for _ in range(2):  # the second compilation copies what the first recorded
        x = _two(3, 11)
        jitted = thunder.jit(f, executors=thunderplug.discover(quiet=True))
        out = jitted(x)
        torch.testing.assert_close(out.a, torch.exp2(x.a) * 2)
        torch.testing.assert_close(out.b, torch.exp2(x.b) * 2)
        assert "torch.ops.aten.exp2.default" in record_of(jitted).fallbacks


def test_no_grad_calls_are_not_copied_from_grad_mode_recordings():
    def f(x):
        with torch.no_grad():
            y = torch.cos(x) * 2
        return torch.cos(x) * 2 + y

    x = _two(4, 9, grad=True)
    ex = x.detach().clone().requires_grad_(True)
    out = thunder.jit(f, executors=thunderplug.discover(quiet=True))(x)
    expected = f(ex)
    torch.testing.assert_close(out.a, expected.a)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(x.grad.a, ex.grad.a)
    torch.testing.assert_close(x.grad.b, ex.grad.b)


@dataclasses.dataclass(frozen=True)
class _ScaleConfig:
    factor: float


class _Scaled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, config):
        ctx.factor = config.factor
        return x * config.factor

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def test_an_op_with_a_dataclass_argument_is_traced_once_for_interpretation_and_autodiff(monkeypatch):
    """thunder's pytree flattens a dataclass only after some pass registered its type, so autodiff
    re-emits the op with the config flattened where interpretation saw it whole (torchao's
    Float8LinearConfig): still one traced graph, and its replay copied."""
    traced: list = []
    original = unroll._trace

    def counted(display, *args):
        traced.append(display)
        return original(display, *args)

    monkeypatch.setattr(unroll, "_trace", counted)
    calls = _counting_graph_calls(monkeypatch)

    def f(x):
        return (_Scaled.apply(torch.sin(x), _ScaleConfig(3.0)) * 2).sum()

    x = _two(6, 4, grad=True)
    ex = x.detach().clone().requires_grad_(True)
    out = thunder.jit(f, executors=thunderplug.discover(quiet=True))(x)
    expected = f(ex)
    torch.testing.assert_close(out.a, expected.a)
    torch.testing.assert_close(out.b, expected.b)
    out.backward()
    expected.backward()
    torch.testing.assert_close(x.grad.a, ex.grad.a)
    torch.testing.assert_close(x.grad.b, ex.grad.b)
    assert traced.count("_Scaled.apply") == 1
    assert calls.count("_Scaled.apply") == 1  # the re-emission in autodiff copies the first replay


def _aten_ops(bsym):
    """The ATen ops inside a subclass op (at any depth of nested subclass ops)."""
    found = []
    for sub in bsym.subsymbols:
        if str(sub.sym.id).startswith("torch.ops.aten."):
            found.append(sub)
        else:
            found += _aten_ops(sub)
    return found


def test_copies_leave_out_the_decompositions_of_ops_an_operator_runs_whole(monkeypatch):
    monkeypatch.setenv("THUNDERPLUG_KEEP_DECOMPOSITIONS", "1")  # kept traces as compiled

    def f(x, y):
        return (torch.sin(x) * 3 + torch.sin(y) * 3).sum()

    x, y = _two(13, 3, grad=True), _two(13, 3, grad=True)  # shapes no other test records
    ex, ey = (t.detach().clone().requires_grad_(True) for t in (x, y))
    jitted = thunder.jit(f, executors=thunderplug.discover(quiet=True))
    out, expected = jitted(x, y), f(ex, ey)
    out.backward()
    expected.backward()
    for got, want in ((out, expected), (x.grad, ex.grad), (y.grad, ey.grad)):
        torch.testing.assert_close(got.a, want.a, rtol=0, atol=0)
        torch.testing.assert_close(got.b, want.b, rtol=0, atol=0)
    sins = [b for b in thunder.last_traces(jitted)[0].bound_symbols if "sin" in str(b.sym.id)]
    first, copy = (_aten_ops(b) for b in sins[:2])
    assert [str(b.sym.id) for b in first] == [str(b.sym.id) for b in copy] == ["torch.ops.aten.sin.default"] * 2
    assert all(b.subsymbols for b in first)  # the replay that called the symbols
    assert not any(b.subsymbols for b in copy)  # the aten executor runs them: nothing reads their prims


class _SinFuser(thunder.extend.FusionExecutor):
    """Takes ``aten.sin`` ahead of the aten executor and runs its prims (with thunder's torch executor)."""

    def __init__(self):
        super().__init__("test_sin_fuser", version="0")
        self.fused: list = []

    def can_fuse(self, bsym):
        return bsym.sym.id == "torch.ops.aten.sin.default"

    def fusion_pass(self, trace):
        from thunder.executors.torchex import ex as torch_executor

        from thunderplug.thunder_compat import transform_for_operator_executor_execution

        result = thunder.core.trace.from_trace(trace)
        for bsym in trace.bound_symbols:
            if self.can_fuse(bsym):
                self.fused.append(bsym)
                result.bound_symbols += bsym.subsymbols
            else:
                result.bound_symbols.append(bsym)
        return transform_for_operator_executor_execution(result, [torch_executor])


def test_copies_keep_the_decompositions_a_fuser_ahead_of_the_aten_executor_takes():
    def f(x, y):
        return (torch.sin(x) * 3 + torch.sin(y) * 3).sum()

    fuser = _SinFuser()
    executors = thunderplug.discover(quiet=True)
    executors.insert(1, fuser)  # after thunderplug's own executor, before the aten executor
    x, y = _two(6, 4), _two(6, 4)
    out = thunder.jit(f, executors=executors)(x, y)
    expected = f(x, y)
    torch.testing.assert_close(out.a, expected.a)
    torch.testing.assert_close(out.b, expected.b)
    assert len(fuser.fused) == 4  # sin of x.a, x.b, y.a, y.b: copies among them, each with its prims
    assert all(bsym.subsymbols for bsym in fuser.fused)
