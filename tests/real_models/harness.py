"""Run a case under one compiler and compare with eager: losses of every step, every gradient, final weights."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import thunder
import torch

import thunderplug

STEPS = 3


def compiler(name: str) -> Callable[[torch.nn.Module], Any]:
    if name == "eager":
        return lambda module: module
    if name == "stock":
        return thunder.jit
    if name == "discover":
        return lambda module: thunder.jit(module, executors=thunderplug.discover(quiet=True))
    if name == "aot_eager":
        def aot_eager(module: torch.nn.Module) -> Any:
            torch._dynamo.reset()  # each model compiled afresh, never past Dynamo's recompile limit
            return torch.compile(module, backend="aot_eager")

        return aot_eager
    raise ValueError(name)


@dataclass
class Run:
    losses: list[torch.Tensor] = field(default_factory=list)
    grads: list[dict[str, torch.Tensor]] = field(default_factory=list)
    weights: dict[str, torch.Tensor] = field(default_factory=dict)


def train(model: torch.nn.Module, batch: dict[str, Any], compile_with: str, steps: int = STEPS) -> Run:
    """``steps`` AdamW steps on one batch; the model is changed in place."""
    fn = compiler(compile_with)(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    run = Run()
    for _ in range(steps):
        loss = fn(batch)
        loss.backward()
        run.losses.append(loss.detach().clone())
        run.grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    run.weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    return run


@dataclass(frozen=True)
class Agreement:
    bit_identical: bool
    worst: float  # the largest difference, relative to the largest value of its kind (losses, one step's
    where: str  # gradients, the final weights): a gradient that is zero in exact arithmetic is rounding noise


def compare(actual: Run, expected: Run) -> Agreement:
    groups: list[list[tuple[str, torch.Tensor, torch.Tensor]]] = []
    groups.append([(f"loss of step {i}", a, e) for i, (a, e) in enumerate(zip(actual.losses, expected.losses,
                                                                               strict=True))])
    for step, (ga, ge) in enumerate(zip(actual.grads, expected.grads, strict=True)):
        assert ga.keys() == ge.keys(), f"step {step}: gradients of {sorted(ga.keys() ^ ge.keys())} differ in presence"
        groups.append([(f"grad {n} at step {step}", ga[n], ge[n]) for n in ge])
    groups.append([(f"final {n}", actual.weights[n], w) for n, w in expected.weights.items()])
    bit_identical, worst, where = True, 0.0, ""
    for group in groups:
        scale = max(float(e.abs().max()) for _, _, e in group if e.numel()) or 1.0
        for name, a, e in group:
            assert a.shape == e.shape and a.dtype == e.dtype, f"{name}: {a.shape} {a.dtype} vs {e.shape} {e.dtype}"
            bit_identical &= torch.equal(a, e)
            difference = float((a.double() - e.double()).abs().max()) / scale if e.numel() else 0.0
            if difference > worst or not where:
                worst, where = difference, name
    return Agreement(bit_identical, worst, where)


def fresh(model: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(model)
