"""Cases run on each rank by test_mesh_2d.py: two-dimensional device meshes (2 x world_size / 2,
4 ranks), eager and compiled with ``thunder.jit(..., executors=discover())``."""

from __future__ import annotations

import copy

import torch
from dtensor_cases import attempt, jit
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from training import Blocks, batches, plain, train


def distribute_tensor_2d_mesh(rank, world_size):
    """``distribute_tensor`` on a 2 x (world_size / 2) mesh inside the jitted function: every
    combination of Shard and Replicate on both mesh dimensions, uneven chunks, no source rank, a weight that
    differs on every rank (each rank's local tensor comes from the rank at coordinate (0, 0)), and a
    gradient through ``from_local`` and ``redistribute`` on the same mesh."""
    device_mesh = init_device_mesh("cpu", (2, world_size // 2))
    row = device_mesh.get_coordinate()[0]
    placements = [[Shard(0), Replicate()], [Replicate(), Shard(1)], [Shard(0), Shard(1)], [Shard(1), Shard(1)]]

    def f(x, w):
        d = DTensor.from_local(x, device_mesh, [Shard(0), Replicate()])
        full = d.redistribute(device_mesh, [Replicate(), Replicate()])
        y = torch.relu(full @ distribute_tensor(w, device_mesh, [Replicate(), Shard(1)]))
        parts = [distribute_tensor(w, device_mesh, p).to_local() for p in placements]
        # no source rank: each rank keeps its own chunk (no collective); a negative Shard dimension
        parts.append(distribute_tensor(w, device_mesh, [Shard(0), Shard(-1)], src_data_rank=None).to_local())
        return y.to_local() * 2, parts + [w * 1]  # eager's Replicate broadcasts also overwrite w

    def run(fn):
        record = {"losses": [], "grads": []}
        for step in range(3):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(10 * step + row), requires_grad=True)
            w = torch.randn(8, 6, generator=torch.Generator().manual_seed(100 * step + rank))
            out, parts = fn(x, w)
            loss = (out * out).sum()
            loss.backward()
            record["losses"].append(loss.detach())
            record["grads"].append(
                {"x": plain(x.grad), "out": out.detach(), "w after": w.clone()}
                | {f"part{i}": p for i, p in enumerate(parts)}
            )
        return record

    return {"eager": run(f), "compiled": attempt(lambda: run(jit(f)))}


def fsdp_tp_float8(rank, world_size):
    """torchtitan's 2-D recipe: float8 tensor parallelism inside each block on the mesh's ``tp``
    dimension (torchao's float8 parallel styles), FSDP2 over its ``dp`` dimension, each block
    jitted before ``fully_shard``; each ``dp`` row trains on its own data."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module
    from torchao.float8 import convert_to_float8_training
    from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel

    device_mesh = init_device_mesh("cpu", (2, world_size // 2), mesh_dim_names=("dp", "tp"))
    model = convert_to_float8_training(Blocks())
    plan = {}
    for i in range(len(model.layers)):
        plan[f"layers.{i}.0"] = Float8ColwiseParallel()
        plan[f"layers.{i}.2"] = Float8RowwiseParallel()
    data = batches(device_mesh.get_coordinate()[0], 32, 32)

    def build(compile_block):
        sharded = parallelize_module(copy.deepcopy(model), device_mesh["tp"], plan)
        for i, layer in enumerate(sharded.layers):
            layer = compile_block(layer)
            fully_shard(layer, mesh=device_mesh["dp"])
            sharded.layers[i] = layer
        fully_shard(sharded, mesh=device_mesh["dp"])
        return sharded

    eager = train(build(lambda block: block), data)
    return {"eager": eager, "compiled": attempt(lambda: train(build(jit), data))}
