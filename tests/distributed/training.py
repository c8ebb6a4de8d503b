"""What each case does on a rank: a few SGD steps, recording every loss and every gradient.

The eager run and the compiled run of a case see the same initial weights (built under the same
seed) and the same per-rank batches, so their records must agree: bit for bit where thunderplug
runs eager's own kernels, within a stated tolerance where thunder decomposes an op differently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F

STEPS = 3


class Blocks(torch.nn.Module):
    """A stack of residual MLP blocks, sharded per block as torchtitan shards transformer layers."""

    def __init__(self, width: int = 32, depth: int = 2):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.ReLU(), torch.nn.Linear(2 * width, width))
            for _ in range(depth)
        )

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


def batches(rank: int, in_features: int, out_features: int, *, steps: int = STEPS, batch: int = 16):
    """Different data on each rank (so gradient averaging matters), identical between runs."""
    g = torch.Generator().manual_seed(1000 + rank)
    return [
        (torch.randn(batch, in_features, generator=g), torch.randn(batch, out_features, generator=g))
        for _ in range(steps)
    ]


def plain(t: torch.Tensor | None) -> torch.Tensor | None:
    """A gradient as a plain full tensor (a DTensor's full value, a subclass's dense value)."""
    if t is None:
        return None
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.full_tensor()
    if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
        t = t.to_local() if hasattr(t, "to_local") else t
    return t.detach().clone().as_subclass(torch.Tensor)


def layout_of(t: torch.Tensor | None) -> str | None:
    """What a gradient is besides its values: its type and, for a DTensor, its placements
    (eager's are the specification too: the optimizer step and later redistributes see them)."""
    if t is None:
        return None
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return f"DTensor{tuple(t.placements)}"
    return type(t).__name__


_WRAPPERS = {"module", "_model", "_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"}


def canonical(name: str) -> str:
    """A parameter's name without the wrappers' components (DDP's ``module.``, ThunderModule's
    ``_model.``), so the eager and compiled records use the same keys."""
    return ".".join(part for part in name.split(".") if part not in _WRAPPERS)


def train(
    module: torch.nn.Module,
    data: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    params: Callable[[], list[tuple[str, torch.Tensor]]] | None = None,
    grad_of: Callable[[str, torch.Tensor], torch.Tensor | None] = lambda name, p: plain(p.grad),
    before_step: Callable[[], None] = lambda: None,
    loss: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] = lambda m, x, t: F.mse_loss(m(x), t),
    lr: float = 0.1,
) -> dict[str, Any]:
    """SGD steps of ``module`` on ``data``; returns ``{"losses": [...], "grads": [{name: grad}, ...]}``.

    ``params`` names what the optimizer trains (default ``module.named_parameters()``) and is read
    once, before the first step, as a user's optimizer would; ``grad_of`` turns a parameter's
    gradient into a comparable tensor (e.g. the slice of a sharded gradient); ``loss`` computes
    the loss of a batch (default: MSE of ``module(x)``).
    """
    named = [(canonical(n), p) for n, p in (params() if params is not None else module.named_parameters())]
    optimizer = torch.optim.SGD([p for _, p in named], lr=lr)
    record: dict[str, Any] = {"losses": [], "grads": [], "layouts": []}
    for x, target in data:
        value = loss(module, x, target)
        value.backward()
        record["losses"].append(plain(value))
        record["grads"].append({name: grad_of(name, p) for name, p in named})
        record["layouts"].append({name: layout_of(p.grad) for name, p in named})
        optimizer.step()
        optimizer.zero_grad()
        before_step()
    return record
