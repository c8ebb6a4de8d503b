"""First-call and step times of distributed float8 training on 2 CPU gloo ranks: eager,
``torch.compile(backend="aot_eager")`` and thunderplug, each compiled where the user would.

    python benchmarks/distributed.py [--steps 10] [--width 128] [--batch 64] [--cases ddp,fsdp2-jit-first,...]

Cases (torchao ``convert_to_float8_training``, tensorwise; ``c`` = the variant's compiler):
    ddp               DDP(c(mlp))
    thunder-ddp       thunder.distributed.ddp(c(mlp)) (thunderplug only; eager DDP is the reference)
    thunder-fsdp      thunder.distributed.fsdp(c(mlp)) (thunderplug only)
    fsdp2-jit-first   torchtitan's order: c(block), then fully_shard(block), then fully_shard(root)
    fsdp2-shard-first fully_shard(block), then c(block)
    fsdp2-fp8-gather  fsdp2-jit-first with enable_fsdp_float8_all_gather and precomputed scales
    tp                parallelize_module(Float8ColwiseParallel, Float8RowwiseParallel), then c(model)

One interleaved run: each timed step runs every variant of the case once, in turn, so that load
on the (shared) machine affects them alike. first s = the first step (tracing and compilation
included); step ms = median of ``--steps`` steps after 2 warm-up steps. Rank 0 prints one markdown
table; a variant that raises shows its error in its cell. Two ranks on 127.0.0.1 (FileStore), one
thread each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "distributed"))
from training import Blocks  # noqa: E402 - the model the distributed tests train

CASES = ["ddp", "thunder-ddp", "thunder-fsdp", "fsdp2-jit-first", "fsdp2-shard-first", "fsdp2-fp8-gather", "tp"]
VARIANTS = ["eager", "aot_eager", "thunderplug"]


def compiler(variant):
    if variant == "eager":
        return lambda m: m
    if variant == "aot_eager":
        return lambda m: torch.compile(m, backend="aot_eager")
    import thunder

    import thunderplug

    return lambda m: thunder.jit(m, executors=thunderplug.discover(quiet=True))


def build(case, variant, width):
    """The model of ``case`` compiled by ``variant``, or None where the case is thunderplug-only."""
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    c = compiler(variant)
    torch.manual_seed(0)
    gather = case == "fsdp2-fp8-gather"
    model = convert_to_float8_training(Blocks(width), config=Float8LinearConfig(enable_fsdp_float8_all_gather=gather))
    if case == "ddp":
        return DDP(c(model))
    if case in ("thunder-ddp", "thunder-fsdp"):
        if variant != "thunderplug":
            return DDP(c(model))
        from thunder.distributed import ddp, fsdp

        return ddp(c(model)) if case == "thunder-ddp" else fsdp(c(model), device=torch.device("cpu"))
    if case.startswith("fsdp2"):
        for i, layer in enumerate(model.layers):
            if case != "fsdp2-shard-first":
                layer = c(layer)
            fully_shard(layer)
            if case == "fsdp2-shard-first":
                layer = c(layer)
            model.layers[i] = layer
        fully_shard(model)
        return model
    if case == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module
        from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        plan = {}
        for i in range(len(model.layers)):
            plan[f"layers.{i}.0"] = Float8ColwiseParallel()
            plan[f"layers.{i}.2"] = Float8RowwiseParallel()
        return c(parallelize_module(model, mesh, plan))
    raise ValueError(case)


class Runner:
    """One variant of one case: its optimizer, its step times, or the error it raised."""

    def __init__(self, case, variant, width):
        self.case, self.variant, self.error, self.times = case, variant, None, []
        try:
            self.model = build(case, variant, width)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        except Exception as error:  # noqa: BLE001 - reported in the table
            self.error = error

    def step(self, x, target):
        if self.error is not None:
            return
        start = time.perf_counter()
        try:
            loss = F.mse_loss(self.model(x), target)
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
            if self.case == "fsdp2-fp8-gather":
                from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

                precompute_float8_dynamic_scale_for_fsdp(self.model)
        except Exception as error:  # noqa: BLE001 - reported in the table
            self.error = error
            if os.environ.get("THUNDERPLUG_BENCH_TRACEBACK"):
                traceback.print_exc()
            return
        self.times.append(time.perf_counter() - start)

    def cells(self):
        if self.error is not None:
            return [f"error: {type(self.error).__name__}: {str(self.error).splitlines()[0][:60]}", ""]
        return [f"{self.times[0]:.2f}", f"{1000 * statistics.median(self.times[3:]):.1f}"]


def rank_main(rank, world_size, store, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world_size), rank=rank, world_size=world_size)
    header = [
        "case",
        "eager first s",
        "eager step ms",
        "aot_eager first s",
        "aot_eager step ms",
        "aot_eager/eager",
        "thunderplug first s",
        "thunderplug step ms",
        "thunderplug/eager",
    ]
    if rank == 0:
        print(f"\n2 gloo ranks, width {args.width}, batch {args.batch}/rank, {args.steps} timed steps\n")
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header), flush=True)
    try:
        g = torch.Generator().manual_seed(rank)
        for case in args.cases:
            runners = [Runner(case, variant, args.width) for variant in VARIANTS]
            for _ in range(args.steps + 3):
                x = torch.randn(args.batch, args.width, generator=g)
                target = torch.randn(args.batch, args.width, generator=g)
                for runner in runners:
                    runner.step(x, target)
            if rank == 0:  # each row as soon as its case is done
                eager_ms = statistics.median(runners[0].times[3:]) if runners[0].error is None else None
                ratios = [
                    f"{statistics.median(r.times[3:]) / eager_ms:.2f}" if r.error is None and eager_ms else ""
                    for r in runners[1:]
                ]
                row = [case, *runners[0].cells(), *runners[1].cells(), ratios[0], *runners[2].cells(), ratios[1]]
                print("| " + " | ".join(row) + " |", flush=True)
    finally:
        dist.destroy_process_group()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args(argv)
    args.cases = args.cases.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank_main, args=(2, os.path.join(tmp, "store"), args), nprocs=2, join=True)


if __name__ == "__main__":
    sys.exit(main())
