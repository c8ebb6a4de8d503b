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
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)  # after the last step (BatchNorm's running stats)


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
    run.buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
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
    assert actual.buffers.keys() == expected.buffers.keys(), sorted(actual.buffers.keys() ^ expected.buffers.keys())
    # every buffer (BatchNorm's running means and variances, its step counter, position ids...), after the last step
    groups.append([(f"final buffer {n}", actual.buffers[n], b) for n, b in expected.buffers.items()])
    bit_identical, worst, where = True, 0.0, ""
    for group in groups:
        scale = max((float(e.abs().max()) for _, _, e in group if e.numel() and e.is_floating_point()),
                    default=0.0) or 1.0
        for name, a, e in group:
            assert a.shape == e.shape and a.dtype == e.dtype, f"{name}: {a.shape} {a.dtype} vs {e.shape} {e.dtype}"
            bit_identical &= torch.equal(a, e)
            if not e.is_floating_point():  # counters, ids, masks: equal or infinitely far
                difference = 0.0 if torch.equal(a, e) else float("inf")
            else:
                difference = float((a.double() - e.double()).abs().max()) / scale if e.numel() else 0.0
            if difference > worst or not where:
                worst, where = difference, name
    return Agreement(bit_identical, worst, where)


def fresh(model: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(model)


def leaves(value: Any, path: str = "output") -> list[tuple[str, Any]]:
    """Every value a model's output holds, by path, with the type of each container on the way
    (``ModelOutput``, tuples, caches and their layers): two outputs agree only if their leaves do."""
    found: list[tuple[str, Any]] = [(f"{path} type", type(value))]
    if isinstance(value, torch.Tensor) or value is None or isinstance(value, (bool, int, float, str, torch.device,
                                                                              torch.dtype)):
        return [*found, (path, value)]
    if isinstance(value, dict):  # ModelOutput is an OrderedDict
        items: Any = value.items()
    elif isinstance(value, (tuple, list)):
        items = enumerate(value)
    else:  # a cache object: its attributes
        items = vars(value).items()
    for key, item in items:
        found += leaves(item, f"{path}[{key!r}]" if not isinstance(value, (tuple, list, dict)) else f"{path}[{key}]")
    return found


def _grad_of_everything(output: Any) -> torch.Tensor:
    """A scalar that every floating-point tensor of the output reaches, each weighted by a fixed random
    tensor (its gradients are those of the loss, the logits and the cache's keys and values at once)."""
    generator = torch.Generator().manual_seed(2)
    total = torch.zeros(())
    for _, leaf in leaves(output):
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
            total = total + (leaf * torch.randn(leaf.shape, generator=generator, dtype=leaf.dtype)).sum()
    return total


def output_and_grads(model: torch.nn.Module, compile_with: str, batch: dict[str, Any],
                     **options: Any) -> tuple[list[tuple[str, Any]], dict[str, torch.Tensor]]:
    """One call of ``model(**batch, **options)`` under ``compile_with``: the output's leaves and, in training
    mode, the gradient of every parameter from all of its floating-point tensors."""
    fn = compiler(compile_with)(model)
    if model.training:
        output = fn(**batch, **options)
        _grad_of_everything(output).backward()
    else:
        with torch.no_grad():
            output = fn(**batch, **options)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return leaves(output), grads


def assert_same_output(actual: tuple[list, dict], expected: tuple[list, dict], tolerance: float = 0.0) -> None:
    """Every leaf of the output (types, values, dtypes, whether it requires grad) and every gradient: bit for bit,
    or within ``tolerance`` of the largest value of its kind (the output's tensors, the gradients)."""
    (leaves_a, grads_a), (leaves_e, grads_e) = actual, expected
    assert [p for p, _ in leaves_a] == [p for p, _ in leaves_e], "the outputs differ in structure"

    def check(name: str, a: torch.Tensor, e: torch.Tensor, scale: float) -> None:
        assert a.shape == e.shape and a.dtype == e.dtype, f"{name}: {a.shape} {a.dtype} vs {e.shape} {e.dtype}"
        difference = float((a.double() - e.double()).abs().max()) if e.numel() else 0.0
        assert torch.equal(a, e) or difference <= tolerance * scale, f"{name}: {difference:.2e} (scale {scale:.2e})"

    tensors = [e for _, e in leaves_e if isinstance(e, torch.Tensor) and e.numel()]
    scale = max((float(e.abs().max()) for e in tensors), default=1.0)
    for (path, a), (_, e) in zip(leaves_a, leaves_e, strict=True):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor) and a.requires_grad == e.requires_grad, path
            check(path, a, e, scale)
        else:
            assert a == e, f"{path}: {a!r} vs {e!r}"
    assert grads_a.keys() == grads_e.keys(), sorted(grads_a.keys() ^ grads_e.keys())
    scale = max((float(g.abs().max()) for g in grads_e.values() if g.numel()), default=1.0)
    for name, grad in grads_e.items():
        check(f"grad {name}", grads_a[name], grad, scale)
