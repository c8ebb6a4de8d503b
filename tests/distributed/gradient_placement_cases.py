"""Cases run on each rank by test_gradient_placements.py: DTensor gradients whose placements eager
autograd picks, under eager, stock ``thunder.jit`` and ``thunder.jit(..., executors=discover())``.

Eager autograd converts no gradient: each backward op takes the gradient as the op after it made
it, and DTensor's sharding propagation picks the placements of what it computes from that. So a
``Shard(0)`` weight of ``F.linear`` gets a ``Replicate()`` gradient when the loss's gradient
arrives replicated, a ``Partial(sum)`` bias gradient comes out of ``out.to_local().sum()``, and
so on; the optimizer step then runs on those placements.
"""

from __future__ import annotations

import copy
import traceback

import thunder
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from training import canonical, layout_of, plain

import thunderplug

STEPS = 3
PLACEMENTS = {"shard0": [Shard(0)], "shard1": [Shard(1)], "replicate": [Replicate()]}


def sharded_mlp(device_mesh, placement: str) -> torch.nn.Module:
    """Linear-ReLU-Linear whose weights are ``distribute_tensor(w, mesh, placement)`` and biases
    replicated."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    for linear in (model[0], model[2]):
        weight = distribute_tensor(linear.weight.detach(), device_mesh, PLACEMENTS[placement])
        linear.weight = torch.nn.Parameter(weight)
        linear.bias = torch.nn.Parameter(distribute_tensor(linear.bias.detach(), device_mesh, [Replicate()]))
    return model


class WithLoss(torch.nn.Module):
    """The model and its loss in one module, so the loss's backward is compiled too."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x, target):
        return (self.model(x) - target).pow(2).mean()


#: losses computed outside the compiled module: the gradient of its output comes from eager ops
OUTSIDE = {
    "mse": lambda out, target: (out - target).pow(2).mean(),  # Replicate gradient of a Shard(1) output
    "sum": lambda out, target: out.sum(),
    "local": lambda out, target: out.to_local().sum(),  # the output's own placements, Partial included
}


def _train(module: torch.nn.Module, loss_of, data) -> dict:
    named = [(canonical(n), p) for n, p in module.named_parameters()]
    optimizer = torch.optim.SGD([p for _, p in named], lr=0.1)
    record: dict = {"losses": [], "grads": [], "layouts": []}
    for x, target in data:
        loss = loss_of(module, x, target)
        loss.backward()
        record["losses"].append(plain(loss))
        record["grads"].append({name: plain(p.grad) for name, p in named})
        record["layouts"].append({name: layout_of(p.grad) for name, p in named})
        optimizer.step()  # on eager's placements: what a different placement would change
        optimizer.zero_grad()
    return record


def _attempt(run) -> dict:
    try:
        return run()
    except Exception:  # noqa: BLE001 - reported by the test
        return {"error": traceback.format_exc()[-4000:]}


def _data(device_mesh) -> list:
    g = torch.Generator().manual_seed(3)
    return [
        tuple(distribute_tensor(torch.randn(4, n, generator=g), device_mesh, [Replicate()]) for n in (16, 8))
        for _ in range(STEPS)
    ]


def _modes(build, loss_of) -> dict:
    """The same program run eagerly, under stock thunder.jit and under discover()."""
    device_mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    torch.manual_seed(0)
    model = build(device_mesh)
    data = _data(device_mesh)
    return {
        "eager": _train(copy.deepcopy(model), loss_of, data),
        "stock": _attempt(lambda: _train(thunder.jit(copy.deepcopy(model)), loss_of, data)),
        "discover": _attempt(
            lambda: _train(thunder.jit(copy.deepcopy(model), executors=thunderplug.discover()), loss_of, data)
        ),
    }


def _mlp_case(placement: str, loss: str):
    def case(rank, world_size):
        if loss == "inside":
            return _modes(lambda m: WithLoss(sharded_mlp(m, placement)), lambda module, x, t: module(x, t))
        return _modes(lambda m: sharded_mlp(m, placement), lambda module, x, t: OUTSIDE[loss](module(x), t))

    return case


#: the issue's program: a Shard(0) weight, the loss compiled with the model
mlp_shard0_loss_inside = _mlp_case("shard0", "inside")
#: the loss outside: the output's gradient arrives with other placements than the traced guess
mlp_shard0_mse = _mlp_case("shard0", "mse")
mlp_shard0_sum = _mlp_case("shard0", "sum")
mlp_shard1_local = _mlp_case("shard1", "local")
mlp_replicate_mse = _mlp_case("replicate", "mse")


def input_gradients(rank, world_size):
    """Gradients of DTensor inputs of a jitted function (a Shard(0) activation, a Shard(1) weight)."""
    device_mesh = init_device_mesh("cpu", (world_size,))

    def f(x, w):
        return F.linear(x, w).relu().sum()

    def run(fn):
        record: dict = {"losses": [], "grads": [], "layouts": []}
        for step in range(STEPS):
            g = torch.Generator().manual_seed(step)
            x = distribute_tensor(torch.randn(4, 6, generator=g), device_mesh, [Shard(0)]).requires_grad_()
            w = distribute_tensor(torch.randn(8, 6, generator=g), device_mesh, [Shard(1)]).requires_grad_()
            loss = fn(x, w)
            loss.backward()
            record["losses"].append(plain(loss))
            record["grads"].append({"x": plain(x.grad), "w": plain(w.grad)})
            record["layouts"].append({"x": layout_of(x.grad), "w": layout_of(w.grad)})
        return record

    return {
        "eager": run(f),
        "stock": _attempt(lambda: run(thunder.jit(f))),
        "discover": _attempt(lambda: run(thunder.jit(f, executors=thunderplug.discover()))),
    }
