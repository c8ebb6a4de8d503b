"""Cases run on each rank by test_data_parallel.py: float8 training under DDP and thunder's own
ddp/fsdp transforms, each next to the eager run it must reproduce."""

from __future__ import annotations

import copy

import thunder
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from training import batches, train

import thunderplug


def float8_mlp() -> torch.nn.Module:
    """The same initial weights on every rank and in every run (the harness seeds each case)."""
    from torchao.float8 import convert_to_float8_training

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
    return convert_to_float8_training(model)


def jit(module: torch.nn.Module) -> torch.nn.Module:
    return thunder.jit(module, executors=thunderplug.discover())


def ran_scaled_mm(jitted: torch.nn.Module) -> bool:
    """The compiled program really computes in float8 (not a plain-tensor fallback)."""
    return "_scaled_mm" in str(thunder.last_traces(jitted)[-1])


def ddp_around_jitted_float8(rank, world_size):
    model = float8_mlp()
    data = batches(rank, 32, 16)
    eager = train(DDP(copy.deepcopy(model)), data)
    jitted = jit(copy.deepcopy(model))
    compiled = train(DDP(jitted), data)
    return {"eager": eager, "compiled": compiled, "float8": ran_scaled_mm(jitted)}


def jit_around_ddp_is_refused(rank, world_size):
    model = DDP(float8_mlp())
    try:
        jit(model)(torch.randn(4, 32))
    except Exception as error:  # noqa: BLE001 - the text is what the test checks
        return f"{type(error).__name__}: {error}"
    return None


def thunder_ddp_float8(rank, world_size):
    from thunder.distributed import ddp

    model = float8_mlp()
    data = batches(rank, 32, 16)
    eager = train(DDP(copy.deepcopy(model)), data)
    jitted = ddp(jit(copy.deepcopy(model)))
    compiled = train(jitted, data)
    return {"eager": eager, "compiled": compiled, "float8": ran_scaled_mm(jitted)}


def thunder_fsdp_float8(rank, world_size):
    """thunder's fsdp shards each parameter on dim 0: its gradient is that slice of DDP's."""
    from thunder.distributed import fsdp

    model = float8_mlp()
    data = batches(rank, 32, 16)
    eager = train(DDP(copy.deepcopy(model)), data)
    eager["grads"] = [{n: g.chunk(world_size)[rank] for n, g in step.items()} for step in eager["grads"]]
    jitted = fsdp(jit(copy.deepcopy(model)), device=torch.device("cpu"))
    compiled = train(jitted, data)
    return {"eager": eager, "compiled": compiled, "float8": ran_scaled_mm(jitted)}
