"""Cases run on each rank by test_data_parallel.py: float8 training under DDP and thunder's own
ddp/fsdp transforms, each next to the eager run it must reproduce."""

from __future__ import annotations

import copy

import thunder
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from training import Blocks, batches, canonical, plain, train

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


def stock_jit_around_ddp_is_refused(rank, world_size):
    model = DDP(float8_mlp())
    try:
        thunder.jit(model)(torch.randn(4, 32))
    except Exception as error:  # noqa: BLE001 - the text is what the test checks
        return f"{type(error).__name__}: {error}"
    return None


class Logged(torch.nn.Module):
    """Two float8 linears; records when the gradient of each one's output arrives (its backward
    starts next) into ``events``, next to DDP's bucket all-reduces (:func:`logging_allreduce`)."""

    def __init__(self, events: list):
        super().__init__()
        from torchao.float8 import convert_to_float8_training

        self.l1 = torch.nn.Linear(32, 64)
        self.l2 = torch.nn.Linear(64, 16)
        convert_to_float8_training(self)
        self.events = events

    def _mark(self, t: torch.Tensor, name: str) -> torch.Tensor:
        if t.requires_grad:
            t.register_hook(lambda grad: self.events.append(("backward of", name)))
        return t

    def forward(self, x):
        h = self._mark(self.l1(x), "l1")
        return self._mark(self.l2(torch.relu(h)), "l2")


def logging_allreduce(events: list, names: dict[int, str]):
    """A DDP comm hook that averages like DDP's default and records each bucket's parameters."""
    import torch.distributed as dist

    def hook(state, bucket):
        events.append(("allreduce", tuple(sorted(names[id(p)] for p in bucket.parameters()))))
        buffer = bucket.buffer().div_(dist.get_world_size())
        return dist.all_reduce(buffer, async_op=True).get_future().then(lambda fut: fut.value()[0])

    return hook


def jit_around_ddp_float8(rank, world_size):
    """``thunder.jit(DDP(model))``: each child with parameters is a compiled region, DDP runs eagerly.
    One bucket per parameter (from the second step: DDP all-reduces the first in one bucket, before it
    knows the order gradients come in); the order of the buckets' all-reduces and of the regions'
    backwards."""
    from thunderplug.caching.regions import compiled_regions

    runs = {}
    for key, compile_root in (("eager", lambda m: m), ("compiled", jit)):
        events: list = []
        torch.manual_seed(0)
        model = Logged(events)
        ddp = DDP(model, bucket_cap_mb=1e-6)
        ddp.register_comm_hook(None, logging_allreduce(events, {id(p): n for n, p in model.named_parameters()}))
        compiled = compile_root(ddp)
        runs[key] = train(compiled, batches(rank, 32, 16), before_step=lambda events=events: events.append(("step",)))
        runs[f"{key} events"] = events
        if key == "compiled":
            runs["regions"] = sorted(compiled_regions(compiled))
            runs["float8"] = all("_scaled_mm" in str(trace) for trace in thunder.last_traces(compiled))
    model = float8_mlp()  # nn.Sequential: each Linear a region, default buckets
    runs["sequential eager"] = train(DDP(copy.deepcopy(model)), batches(rank, 32, 16))
    runs["sequential"] = train(jit(DDP(model)), batches(rank, 32, 16))
    return runs


def _accumulate(module, data, micro_batches: int = 2):
    """Gradient accumulation with DDP's ``no_sync()``: all micro-batches but the last unsynchronized."""
    import torch.nn.functional as F

    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    record: dict = {"losses": [], "grads": [], "unsynced": []}
    for x, target in data:
        xs, targets = x.chunk(micro_batches), target.chunk(micro_batches)
        with module.no_sync():
            for xm, tm in zip(xs[:-1], targets[:-1]):
                F.mse_loss(module(xm), tm).backward()
        record["unsynced"].append({canonical(n): plain(p.grad) for n, p in module.named_parameters()})
        loss = F.mse_loss(module(xs[-1]), targets[-1])
        loss.backward()
        record["losses"].append(plain(loss))
        record["grads"].append({canonical(n): plain(p.grad) for n, p in module.named_parameters()})
        optimizer.step()
        optimizer.zero_grad()
    return record


def jit_around_ddp_no_sync_float8(rank, world_size):
    model = float8_mlp()
    data = batches(rank, 32, 16)
    return {"eager": _accumulate(DDP(copy.deepcopy(model)), data), "compiled": _accumulate(jit(DDP(model)), data)}


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


def jit_around_ddp_without_grad(rank, world_size):
    """``thunder.jit(DDP(model))`` first called under ``torch.no_grad()`` (evaluation), then trained;
    the blocks of a ``ModuleList`` are the regions, the residual adds between them run eagerly."""
    from torchao.float8 import convert_to_float8_training

    from thunderplug.caching.regions import compiled_regions

    model = convert_to_float8_training(Blocks(32))
    x = torch.randn(8, 32)
    eager, compiled = DDP(copy.deepcopy(model)), jit(DDP(model))
    with torch.no_grad():
        outputs = [m(x) for m in (eager, compiled)]
    return {
        "outputs": outputs,
        "requires_grad": [o.requires_grad for o in outputs],
        "eager": train(eager, batches(rank, 32, 32)),
        "compiled": train(compiled, batches(rank, 32, 32)),
        "regions": sorted(compiled_regions(compiled)),
    }
