"""Run one idiom program under one compiler and compare it with eager, the specification.

Modes: ``eager``, ``discover`` (``thunder.jit(model, executors=thunderplug.discover())``), ``stock``
(``thunder.jit(model)``) and ``aot_eager`` (``torch.compile(model, backend="aot_eager")``). A run
records, with a label each, what the program computes step by step (outputs, loss, every gradient,
hook records, buffers), the final parameters and buffers, and the next draw of the global random
stream. The comparison gives an :class:`Outcome`: ``equal`` (bit for bit), ``close`` (within the
program's stated tolerance), ``drift`` (within rtol=atol=1e-3), ``SILENT`` (other values, or other
structure: a gradient or hook record missing, another requires_grad, type or shape) or ``loud`` (it
raised).
"""

from __future__ import annotations

import dataclasses
import re
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import thunder
import torch

import thunderplug

from .program import Idiom

MODES = ("eager", "discover", "stock", "aot_eager")
#: what ``drift`` allows: differences of rounding order, not of meaning
DRIFT = {"rtol": 1e-3, "atol": 1e-3}
_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    """What one mode computed (labelled values), or the error it raised, and its timings."""

    values: list[tuple[str, Any]] = field(default_factory=list)
    error: BaseException | None = None
    first_call_s: float | None = None
    total_s: float = 0.0


@dataclass(frozen=True)
class Outcome:
    """``kind`` is one of equal, close, drift, SILENT, loud; ``detail`` says what differed or what was raised."""

    kind: str
    detail: str = ""
    max_diff: float = 0.0

    def __str__(self) -> str:
        return self.kind if not self.detail else f"{self.kind}: {self.detail}"


def compile_for(mode: str, model: torch.nn.Module) -> Callable[..., Any]:
    if mode == "eager":
        return model
    if mode == "discover":
        return thunder.jit(model, executors=thunderplug.discover(quiet=True))
    if mode == "stock":
        return thunder.jit(model)
    if mode == "aot_eager":
        torch.compiler.reset()
        return torch.compile(model, backend="aot_eager")
    raise ValueError(f"unknown mode {mode!r}")


def run(entry: Idiom, mode: str) -> Run:
    """Build the program fresh under seed 0 and run it under ``mode``."""
    result = Run()
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            program = entry.build()
            fn = compile_for(mode, program.model)
            (_train if entry.train else _evaluate)(entry, program, fn, result)
            result.values.append(("random stream after the run", torch.randn(8)))
    except Exception as error:  # noqa: BLE001 -- a failure is an outcome: the comparison reports it
        result.error = error
    result.total_s = time.perf_counter() - start
    return result


def _call(fn: Callable[..., Any], inputs: tuple, result: Run) -> Any:
    start = time.perf_counter()
    out = fn(*inputs)
    if result.first_call_s is None:
        result.first_call_s = time.perf_counter() - start
    return out


def _record_step(step: int, model: torch.nn.Module, out: Any, result: Run) -> None:
    result.values.append((f"step {step} output type", type(out).__name__))
    result.values.extend((f"step {step} output {i}", t) for i, t in enumerate(tensors(out)))
    record = getattr(model, "idiom_record", None)
    if record is not None:
        result.values.append((f"step {step} hook records", list(record)))
        record.clear()


def _train(entry: Idiom, program, fn, result: Run) -> None:
    model = program.model
    model.train()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([p for _, p in named], lr=1e-2)
    for step in range(entry.steps):
        optimizer.zero_grad(set_to_none=True)
        out = _call(fn, program.inputs, result)
        loss = program.loss(out) if program.loss else sum(t.sum() for t in tensors(out) if t.is_floating_point())
        loss.backward()
        _record_step(step, model, out, result)
        result.values.append((f"step {step} loss", loss))
        if program.after_backward is not None:
            program.after_backward(model)
        result.values.extend((f"step {step} grad of {n}", p.grad) for n, p in named)
        optimizer.step()
        result.values.extend((f"step {step} buffer {n}", b) for n, b in model.named_buffers())
    result.values.extend((f"final {n}", p) for n, p in model.named_parameters())


def _evaluate(entry: Idiom, program, fn, result: Run) -> None:
    model = program.model
    model.eval()
    with torch.no_grad():
        for step in range(entry.steps):
            out = _call(fn, program.inputs, result)
            _record_step(step, model, out, result)
            result.values.extend((f"step {step} buffer {n}", b) for n, b in model.named_buffers())


def tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of an output, depth first: tuples (NamedTuples), lists, dicts (HF outputs), dataclasses."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors(v)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [t for f in dataclasses.fields(value) for t in tensors(getattr(value, f.name))]
    return []


def compare(actual: Run, expected: Run, tolerance: dict[str, float]) -> Outcome:
    """How ``actual`` relates to eager's ``expected`` (which must not have raised)."""
    if expected.error is not None:
        raise AssertionError(f"eager raised {type(expected.error).__name__}: {expected.error}") from expected.error
    if actual.error is not None:
        return Outcome("loud", describe(actual.error))
    labels, expected_labels = [label for label, _ in actual.values], [label for label, _ in expected.values]
    if labels != expected_labels:
        missing = next((a, e) for a, e in zip(labels + [None], expected_labels + [None]) if a != e)
        return Outcome("SILENT", f"computed {missing[0]!r} where eager computed {missing[1]!r}", float("inf"))
    worst, worst_label = 0.0, ""
    for label, a, e in ((label, a, e) for (label, a), (_, e) in zip(actual.values, expected.values)):
        problem = _structure(a, e)
        if problem:
            return Outcome("SILENT", f"{label}: {problem}", float("inf"))
        diff = _max_diff(a, e)
        if diff > worst:
            worst, worst_label = diff, label
    if worst == 0.0:
        return Outcome("equal")
    within = lambda tol: all(_close(a, e, tol) for (_, a), (_, e) in zip(actual.values, expected.values))  # noqa: E731
    kind = "close" if tolerance and within(tolerance) else "drift" if within(DRIFT) else "SILENT"
    return Outcome(kind, f"max diff {worst:.1e} ({worst_label})", worst)


def describe(error: BaseException) -> str:
    """The error's type and first line, without this checkout's path or object addresses (stable text)."""
    text = str(error).strip().splitlines()
    first = re.sub(r" at 0x[0-9a-f]+", "", (text[0] if text else "").replace(f"{_ROOT}/", ""))
    return f"{type(error).__name__}: {first[:160]}"


def _pairs(a: Any, e: Any):
    if isinstance(e, (list, tuple)):
        for x, y in zip(a, e):
            yield from _pairs(x, y)
    else:
        yield a, e


def _structure(a: Any, e: Any) -> str:
    if type(a) is not type(e) and not (isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor)):
        return f"{type(a).__name__} where eager has {type(e).__name__}"
    if isinstance(e, (list, tuple)):
        if len(a) != len(e):
            return f"{len(a)} items where eager has {len(e)}"
        return next((p for x, y in zip(a, e) if (p := _structure(x, y))), "")
    if isinstance(e, torch.Tensor):
        if a.requires_grad != e.requires_grad:
            return f"requires_grad={a.requires_grad} where eager's is {e.requires_grad}"
        if (a.shape, a.dtype) != (e.shape, e.dtype):
            return f"{a.dtype}{list(a.shape)} where eager has {e.dtype}{list(e.shape)}"
        return ""
    return "" if a == e else f"{a!r} where eager has {e!r}"


def _max_diff(a: Any, e: Any) -> float:
    worst = 0.0
    for x, y in _pairs(a, e):
        if isinstance(y, torch.Tensor) and y.numel():
            x, y = x.detach(), y.detach()
            if y.is_floating_point() or y.is_complex():
                same = (x == y) | (torch.isnan(x) & torch.isnan(y))
                if not bool(same.all()):
                    d = (x.to(torch.complex128 if y.is_complex() else torch.float64) - y).abs()
                    worst = max(worst, float(d[~same].max()) if not torch.isnan(d[~same]).any() else float("inf"))
            elif not torch.equal(x, y):
                worst = max(worst, float((x.long() - y.long()).abs().max()))
    return worst


def _close(a: Any, e: Any, tol: dict[str, float]) -> bool:
    for x, y in _pairs(a, e):
        if isinstance(y, torch.Tensor):
            try:
                torch.testing.assert_close(x.detach(), y.detach(), equal_nan=True, **tol)
            except AssertionError:
                return False
    return True
