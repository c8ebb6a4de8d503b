"""Run one case under one mode and compare runs: the shared runner of the real-program suite.

A run records, in order, every output, every gradient and (for training cases) the parameters
after the last optimizer step, each with a label; two runs are equal when their labels are and
every value has the same type, flatten context, requires_grad and (within the case's tolerance)
values. Eager PyTorch is the reference.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import thunder
import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

import thunderplug
from real_programs.case import Case

MODES = ("eager", "stock", "aot_eager", "discover")


@dataclass
class Run:
    """What one mode computed, or the error it raised (``error``), and its first call's time."""

    values: list[tuple[str, Any]] = field(default_factory=list)
    error: BaseException | None = None
    first_call_s: float | None = None


def compile_for(mode: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    if mode == "eager":
        return fn
    if mode == "stock":
        return thunder.jit(fn)
    if mode == "aot_eager":
        torch.compiler.reset()
        return torch.compile(fn, backend="aot_eager")
    if mode == "discover":
        return thunder.jit(fn, executors=thunderplug.discover())
    raise ValueError(f"unknown mode {mode!r}")


def run(case: Case, mode: str) -> Run:
    """Build the case fresh (same seed for every mode) and run it under ``mode``."""
    result = Run()
    try:
        torch.manual_seed(0)
        program = case.build()
        fn = compile_for(mode, program.fn)
        if case.trains:
            _train(case, program, fn, result)
        else:
            _once(case, program, fn, result)
    except Exception as error:  # noqa: BLE001 -- any failure is a result: the comparison reports it
        result.error = error
    return result


def _timed_call(fn: Callable[..., Any], inputs: tuple, result: Run) -> Any:
    start = time.perf_counter()
    out = fn(*inputs)
    if result.first_call_s is None:
        result.first_call_s = time.perf_counter() - start
    return out


def _once(case: Case, program, fn, result: Run) -> None:
    out = _timed_call(fn, program.inputs, result)
    result.values.append(("output", out))
    leaves = [x for x in program.inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    if isinstance(program.fn, torch.nn.Module):
        leaves += [p for p in program.fn.parameters() if p.requires_grad]
    outputs = [o for o in _tensors(out) if o.requires_grad]
    if not leaves or not outputs:
        return
    cotangents = [case.cotangent(o) if case.cotangent else torch.ones_like(o) for o in outputs]
    grads = torch.autograd.grad(outputs, leaves, cotangents, allow_unused=True)
    result.values.extend((f"grad of input/parameter {i}", g) for i, g in enumerate(grads))


def _train(case: Case, program, fn, result: Run) -> None:
    module = program.fn
    params = [p for p in module.parameters() if p.requires_grad]
    if case.trains == "sgd":
        optimizer = torch.optim.SGD(params, lr=0.1)
    else:
        optimizer = torch.optim.AdamW(params, lr=1e-2)
    names = [n for n, p in module.named_parameters() if p.requires_grad]
    for step in range(case.steps):
        optimizer.zero_grad(set_to_none=True)
        out = _timed_call(fn, program.inputs, result)
        result.values.append((f"step {step} output", out))
        loss = sum((case.loss or torch.sum)(o) for o in _tensors(out) if o.requires_grad)
        loss.backward(torch.ones_like(loss))
        result.values.extend((f"step {step} grad of {n}", p.grad) for n, p in zip(names, params))
        optimizer.step()
    result.values.extend((f"final {n}", p.detach()) for n, p in zip(names, params))


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def assert_equal_runs(actual: Run, expected: Run, tolerance: dict[str, float], mode: str) -> None:
    """``actual`` computed what eager did: same labels, types, flatten contexts, values."""
    if actual.error is not None:
        raise AssertionError(f"{mode} raised {type(actual.error).__name__}: {actual.error}") from actual.error
    assert [label for label, _ in actual.values] == [label for label, _ in expected.values]
    for (label, a), (_, e) in zip(actual.values, expected.values):
        try:
            assert_same(a, e, tolerance)
        except AssertionError as error:
            raise AssertionError(f"{mode}: {label} differs from eager: {error}") from error


def assert_same(actual: Any, expected: Any, tolerance: dict[str, float]) -> None:
    """Equal values, the same types, requires_grad and flatten context, recursively."""
    assert type(actual) is type(expected), f"type {type(actual).__name__} != eager's {type(expected).__name__}"
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, tolerance)
        return
    if isinstance(expected, dict):
        assert actual.keys() == expected.keys()
        for key in expected:
            assert_same(actual[key], expected[key], tolerance)
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == expected
        return
    assert actual.requires_grad == expected.requires_grad, "requires_grad differs"
    assert (actual.shape, actual.dtype) == (expected.shape, expected.dtype), "shape/dtype differ"
    if is_traceable_wrapper_subclass(expected):
        attrs, ctx = expected.__tensor_flatten__()
        actual_attrs, actual_ctx = actual.__tensor_flatten__()
        assert actual_attrs == attrs, f"inner tensors {actual_attrs} != {attrs}"
        assert _same_ctx(actual_ctx, ctx), f"flatten context {actual_ctx!r} != eager's {ctx!r}"
        for name in attrs:
            assert_same(getattr(actual, name).detach(), getattr(expected, name).detach(), tolerance)
        return
    a, e = actual.detach(), expected.detach()
    if a.dtype.is_floating_point and a.dtype.itemsize == 1:  # float8: compare the values they stand for
        a, e = a.float(), e.float()
    torch.testing.assert_close(a, e, **tolerance)


def _same_ctx(actual: Any, expected: Any) -> bool:
    if isinstance(expected, torch.Tensor):
        return isinstance(actual, torch.Tensor) and torch.equal(actual, expected)
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and actual.keys() == expected.keys()
            and all(_same_ctx(actual[k], expected[k]) for k in expected)
        )
    if isinstance(expected, (list, tuple)):
        return (
            type(actual) is type(expected)
            and len(actual) == len(expected)
            and all(_same_ctx(a, e) for a, e in zip(actual, expected))
        )
    return actual == expected
