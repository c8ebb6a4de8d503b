"""The check the idiom tests share: a model trained a few AdamW steps eagerly and jitted, compared bit for bit.

Each step runs the eager model and the jitted copy from the same seed and compares what a user could observe:
the loss, the output's containers and types, which outputs require grad, the outputs' values, every gradient,
parameter and buffer after the optimizer step, and (``check_rng``) the CPU generator's state after the backward.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import thunder
import torch
from torch import nn
from torch.utils._pytree import tree_flatten

import thunderplug


def assert_exact(a: torch.Tensor | None, b: torch.Tensor | None, tolerance: dict | None = None) -> None:
    """``a`` equals eager's ``b`` bit for bit (or within ``tolerance``); both None counts as equal."""
    assert (a is None) == (b is None), f"{a} where eager has {b}"
    if a is not None:
        torch.testing.assert_close(a, b, **(tolerance or {"rtol": 0, "atol": 0}))


def leaves(output: Any) -> list:
    """The output's leaves, user dataclasses included (pytree does not flatten them)."""
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        return [leaf for f in dataclasses.fields(output) for leaf in leaves(getattr(output, f.name))]
    if isinstance(output, (list, tuple)):
        return [leaf for item in output for leaf in leaves(item)]
    if isinstance(output, dict):
        return [leaf for item in output.values() for leaf in leaves(item)]
    return tree_flatten(output)[0]


def structure(output: Any) -> Any:
    """The output's containers, their types and keys, with tensors as their shapes."""
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        return type(output), [structure(getattr(output, f.name)) for f in dataclasses.fields(output)]
    if isinstance(output, (list, tuple)):
        return type(output), [structure(item) for item in output]
    if isinstance(output, dict):
        return type(output), {key: structure(item) for key, item in output.items()}
    return type(output), getattr(output, "shape", output)


def _loss(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return sum(t.float().square().mean() for t in tensors if t.requires_grad)


def train_like_eager(model: nn.Module, inputs: Sequence[tuple], *, seed: int = 1234, stock: bool = False,
                     flatten: Callable[[Any], Any] = lambda out: out, tolerance: dict | None = None,
                     check_rng: bool = False) -> None:
    """Train ``model`` (eagerly) and a deep copy of it jitted (``discover()``, or stock thunder with ``stock``) one
    AdamW step per element of ``inputs``, and assert after each step that both agree (see the module docstring);
    ``flatten`` maps a forward's output to what is compared."""
    eager, jitted_model = model, copy.deepcopy(model)
    jitted = thunder.jit(jitted_model) if stock else thunder.jit(jitted_model, executors=thunderplug.discover())
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1) for m in (eager, jitted_model)]
    for step, args in enumerate(inputs):
        results = []
        for run, optimizer in zip((eager, jitted), optimizers):
            torch.manual_seed(seed + step)
            output = flatten(run(*args))
            tensors = [t for t in leaves(output) if isinstance(t, torch.Tensor)]
            loss = _loss(tensors)
            loss.backward()
            state = torch.get_rng_state() if check_rng else None
            results.append((loss.detach(), [t.requires_grad for t in tensors], structure(output), tensors, state))
            optimizer.step()
        (loss_e, flags_e, structure_e, out_e, state_e), (loss_j, flags_j, structure_j, out_j, state_j) = results
        assert structure_j == structure_e
        assert flags_j == flags_e, "other outputs require grad than in eager"
        assert_exact(loss_j, loss_e, tolerance)
        for a, b in zip(out_j, out_e):
            assert_exact(a.detach(), b.detach(), tolerance)
        if check_rng:
            assert torch.equal(state_j, state_e), "the generator is not where eager leaves it"
        for p_e, p_j in zip(eager.parameters(), jitted_model.parameters()):
            assert_exact(p_j.grad, p_e.grad, tolerance)
            assert_exact(p_j, p_e, tolerance)
        for b_e, b_j in zip(eager.buffers(), jitted_model.buffers()):
            assert_exact(b_j, b_e, tolerance)
        for optimizer in optimizers:
            optimizer.zero_grad()


def random_inputs(*shape: int, requires_grad: bool = False, steps: int = 3) -> list[tuple]:
    """``steps`` one-tensor argument tuples of ``shape``, from a fixed generator."""
    generator = torch.Generator().manual_seed(7)
    return [(torch.randn(*shape, generator=generator, requires_grad=requires_grad),) for _ in range(steps)]
