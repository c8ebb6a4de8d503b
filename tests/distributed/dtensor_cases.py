"""Cases run on each rank by test_dtensor.py: DTensor programs and tensor parallelism, eager and
compiled with ``thunder.jit(..., executors=discover())``."""

from __future__ import annotations

import copy

import thunder
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
from training import batches, layout_of, plain, train

import thunderplug


def jit(fn):
    return thunder.jit(fn, executors=thunderplug.discover())


def attempt(run):
    """The compiled run's record, or the error it raised (so the eager record still comes back)."""
    try:
        return run()
    except Exception:  # noqa: BLE001 - reported by the test
        import traceback

        return {"error": traceback.format_exc()[-6000:]}


def mesh(world_size):
    return init_device_mesh("cpu", (world_size,))


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))


class ShardedBatch(torch.nn.Module):
    """Data parallelism with DTensor: each rank's batch is its shard of the global batch, the
    parameters are replicated DTensors, and the loss is computed on DTensors."""

    def __init__(self, module, device_mesh):
        super().__init__()
        self.module = module
        self.mesh = device_mesh

    def forward(self, x):
        return self.module(DTensor.from_local(x, self.mesh, [Shard(0)]))


def _dtensor_loss_train(model, data, device_mesh):
    def loss_of(module, x, target):
        # DTensor has no sharding rule for mse_loss; the same loss from elementwise ops and a mean
        return (module(x) - DTensor.from_local(target, device_mesh, [Shard(0)])).pow(2).mean()

    return train(model, data, loss=loss_of)


def dtensor_mlp(rank, world_size):
    device_mesh = mesh(world_size)
    model = distribute_module(mlp(), device_mesh)  # parameters: replicated DTensors
    data = batches(rank, 16, 8)
    eager = _dtensor_loss_train(ShardedBatch(copy.deepcopy(model), device_mesh), data, device_mesh)
    compiled_model = jit(ShardedBatch(copy.deepcopy(model), device_mesh))
    compiled = attempt(lambda: _dtensor_loss_train(compiled_model, data, device_mesh))
    return {"eager": eager, "compiled": compiled}


def distribute_module_with_input_fn(rank, world_size):
    device_mesh = mesh(world_size)

    def shard_input(module, inputs, device_mesh):
        return tuple(DTensor.from_local(t, device_mesh, [Shard(0)]) for t in inputs)

    def local_output(module, outputs, device_mesh):
        return outputs.to_local()

    model = distribute_module(mlp(), device_mesh, input_fn=shard_input, output_fn=local_output)
    data = batches(rank, 16, 8)
    eager = train(copy.deepcopy(model), data)
    compiled = attempt(lambda: train(jit(copy.deepcopy(model)), data))
    return {"eager": eager, "compiled": compiled}


def _tensor_parallel(rank, world_size, float8):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    device_mesh = mesh(world_size)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    if float8:
        from torchao.float8 import convert_to_float8_training
        from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel

        model = convert_to_float8_training(model)
        plan = {"0": Float8ColwiseParallel(), "2": Float8RowwiseParallel()}
    else:
        plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
    # tensor parallelism: every rank sees the same batch
    data = batches(0, 32, 32)
    runs = {}
    runs["eager"] = train(parallelize_module(copy.deepcopy(model), device_mesh, plan), data)
    runs["compiled"] = attempt(lambda: train(jit(parallelize_module(copy.deepcopy(model), device_mesh, plan)), data))
    return runs


def tensor_parallel(rank, world_size):
    return _tensor_parallel(rank, world_size, float8=False)


def tensor_parallel_float8(rank, world_size):
    return _tensor_parallel(rank, world_size, float8=True)


class NormBlock(torch.nn.Module):
    """A residual block with a LayerNorm, as transformer blocks have."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.ff = torch.nn.Sequential(
            torch.nn.Linear(width, 2 * width), torch.nn.ReLU(), torch.nn.Linear(2 * width, width)
        )

    def forward(self, x):
        return x + self.ff(self.norm(x))


def sequence_parallel(rank, world_size):
    """torchtitan's plan with sequence parallelism: the norm on sequence shards, an all-gather
    into the column-parallel linear, a reduce-scatter out of the row-parallel one."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    device_mesh = mesh(world_size)
    plan = {
        "norm": SequenceParallel(),
        "ff": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "ff.0": ColwiseParallel(),
        "ff.2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    }
    g = torch.Generator().manual_seed(5)  # the same global batch on every rank; each takes its sequence shard
    data = [(torch.randn(2, 8, 32, generator=g), torch.randn(2, 8, 32, generator=g)) for _ in range(3)]

    def loss_of(module, x, target):
        def shard(t):
            return DTensor.from_local(t.chunk(world_size, dim=1)[rank], device_mesh, [Shard(1)])

        return (module(shard(x)) - shard(target)).pow(2).mean()

    model = NormBlock()
    eager = train(parallelize_module(copy.deepcopy(model), device_mesh, plan), data, loss=loss_of)
    compiled = attempt(
        lambda: train(jit(parallelize_module(copy.deepcopy(model), device_mesh, plan)), data, loss=loss_of)
    )
    return {"eager": eager, "compiled": compiled}


def dtensor_api_inside_jit(rank, world_size):
    """from_local, redistribute, to_local and distribute_tensor inside the jitted function."""
    device_mesh = mesh(world_size)

    def f(x, w):
        d = DTensor.from_local(x, device_mesh, [Shard(0)])
        full = d.redistribute(device_mesh, [Replicate()])
        wd = distribute_tensor(w, device_mesh, [Replicate()])
        y = torch.relu(full @ wd).sum(dim=0)
        return y.to_local() * 2

    def run(fn):
        record = {"losses": [], "grads": []}
        g = torch.Generator().manual_seed(rank)
        for _ in range(3):
            x = torch.randn(4, 8, generator=g, requires_grad=True)
            w = torch.randn(8, 6, generator=torch.Generator().manual_seed(7), requires_grad=True)
            out = fn(x, w)
            loss = (out * out).sum()
            loss.backward()
            record["losses"].append(loss.detach())
            record["grads"].append({"x": plain(x.grad), "w": plain(w.grad), "out": out.detach()})
        return record

    return {"eager": run(f), "compiled": attempt(lambda: run(jit(f)))}


def dtensor_inputs(rank, world_size):
    """DTensors made outside, passed to the jitted function: ops, a reduction, gradients."""
    device_mesh = mesh(world_size)

    def f(x, w):
        return torch.relu(x @ w).sum()

    def run(fn):
        record = {"losses": [], "grads": [], "layouts": []}
        for step in range(3):
            g = torch.Generator().manual_seed(10 * rank + step)
            x = DTensor.from_local(torch.randn(4, 8, generator=g), device_mesh, [Shard(0)]).detach().requires_grad_()
            w = torch.randn(8, 6, generator=torch.Generator().manual_seed(7))
            w = distribute_tensor(w, device_mesh, [Replicate()])
            w.requires_grad_()
            loss = fn(x, w)
            loss.backward()
            record["losses"].append(plain(loss))
            record["grads"].append({"x": plain(x.grad), "w": plain(w.grad)})
            record["layouts"].append({"x": layout_of(x.grad), "w": layout_of(w.grad)})
        return record

    return {"eager": run(f), "compiled": attempt(lambda: run(jit(f)))}


# -- functional collectives (what DTensor's redistributions and funcol emit) --------------------


def _collective_steps(fn, rank, *, grad: bool):
    record = {"losses": [], "grads": []}
    for step in range(3):
        g = torch.Generator().manual_seed(10 * rank + step)
        x = torch.randn(2, 3, generator=g, requires_grad=grad)
        w = torch.randn(3, 2, generator=torch.Generator().manual_seed(step), requires_grad=grad)
        loss = fn(x, w)
        if grad:
            loss.backward()
        record["losses"].append(plain(loss))
        record["grads"].append({"x": plain(x.grad), "w": plain(w.grad)})
    return record


def _compare_collectives(rank, f, *, grad: bool):
    jitted = jit(f)
    runs = {"eager": _collective_steps(f, rank, grad=grad)}
    runs["compiled"] = attempt(lambda: _collective_steps(jitted, rank, grad=grad))
    if "error" not in runs["compiled"]:
        runs["trace"] = str(thunder.last_traces(jitted)[-1])
    return runs


def functional_collective_overloads(rank, world_size):
    group = torch.distributed.group.WORLD.group_name
    ops = torch.ops._c10d_functional

    def f(x, w):
        a = ops.all_reduce.default(x * 2, "sum", group)
        g = ops.all_gather_into_tensor.default(x @ w, world_size, group)
        r = ops.reduce_scatter_tensor.default(x.repeat(world_size, 1), "sum", world_size, group)
        a, g, r = ops.wait_tensor.default(a), ops.wait_tensor.default(g), ops.wait_tensor.default(r)
        return a.sum() + (g * g).sum() + (r * 3).sum()

    return _compare_collectives(rank, f, grad=False)


def functional_collective_packets(rank, world_size):
    """The packet form (``torch.ops._c10d_functional.wait_tensor(t)``), which thunder maps to an identity."""
    group = torch.distributed.group.WORLD.group_name
    ops = torch.ops._c10d_functional

    def f(x, w):
        a = ops.all_reduce(x * 2, "sum", group)
        g = ops.all_gather_into_tensor(x @ w, world_size, group)
        return ops.wait_tensor(a).sum() + (ops.wait_tensor(g) * 3).sum()

    return _compare_collectives(rank, f, grad=False)


def funcol_with_gradients(rank, world_size):
    """torch.distributed._functional_collectives (AsyncCollectiveTensor results), with autograd."""
    import torch.distributed._functional_collectives as funcol

    group = torch.distributed.group.WORLD

    def f(x, w):
        reduced = funcol.all_reduce(x * 2, "sum", group)  # no derivative in torch: no gradient flows here
        gathered = funcol.all_gather_tensor_autograd(x @ w, 0, group)
        return reduced.sum() + (gathered * gathered).sum()

    return _compare_collectives(rank, f, grad=True)
