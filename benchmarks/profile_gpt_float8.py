"""Where the first call (compilation + one step) and the steady-state step of the GPT go: cProfile
plus a phase breakdown (issue 14, "report where the remaining time goes").

    python benchmarks/profile_gpt_float8.py [--layers 2] [--variant fp8-thunderplug] [--steps 5]
                                            [--top 25] [--save first.prof] [--ops]

Same model, settings and variants as ``benchmarks/gpt_float8.py`` (one torch thread, oneDNN off).
Prints, for the first call: the cumulative time of thunder's and thunderplug's phases (a function's
cumulative time, so nested phases overlap: interpretation contains the unrolling it triggers), the
time spent in garbage collection (``gc.callbacks``), how many unrolled ops were traced by ``make_fx``
(``_trace`` calls) against all unroll calls, then the top functions by cumulative and by own time.
For the step: the top list by own time over ``--steps`` steps, the final traces' bound symbols per
executor and, with ``--ops``, the steps' ATen ops by self CPU time (torch.profiler).
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import gc
import pathlib
import pstats
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

#: phase name -> (path fragment, function name); cumulative times, outermost call only
PHASES = {
    "thunder.jit first call, total": ("thunder/__init__.py", "fn_"),
    "  interpretation (thunder_general_jit)": ("thunder/core/jit_ext.py", "thunder_general_jit"),
    "  after interpretation (transforms, codegen)": ("thunder/__init__.py", "apply_transforms_and_build_cache_entry"),
    "  autodiff (grad_transform_on_trace)": ("thunder/transforms/autodiff.py", "grad_transform_on_trace"),
    "  claiming + fusion (transform_for_execution)": ("thunder/executors/passes.py", "transform_for_execution"),
    "    operator claiming": ("thunder/executors/passes.py", "_transform_for_operator_executor_execution"),
    "  forward/backward split": ("thunder/transforms/autodiff.py", "split_into_forward_and_backward"),
    "  del_last_used": ("thunder/executors/passes.py", "del_last_used"),
    "  codegen (python_callable)": ("thunder/core/trace.py", "python_callable"),
    "thunderplug unroll (all calls)": ("thunderplug/subclass/unroll.py", "unroll"),
    "  make_fx on fakes (_trace)": ("thunderplug/subclass/unroll.py", "_trace"),
    "  replay into thunder symbols (_replay)": ("thunderplug/subclass/unroll.py", "_replay"),
    "  make_fx's decomposition table": ("thunderplug/aten.py", "decompositions"),
    "  decomposition checks by fake kernels": ("thunderplug/aten.py", "_check_against_torch"),
    "thunderplug fusion pass": ("thunderplug/subclass/executor.py", "fusion_pass"),
    "run: forward (ThunderFunction)": ("thunder/executors/torch_autograd.py", "forward"),
    "run: backward (ThunderFunction)": ("thunder/executors/torch_autograd.py", "backward"),
    "optimizer step": ("torch/optim/adamw.py", "step"),
}


class GcTimer:
    """Total time inside the garbage collector, from ``gc.callbacks``."""

    def __init__(self):
        self.total = 0.0
        self.collections = 0
        self._start = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._start
            self.collections += 1


def phase_times(stats: pstats.Stats) -> dict[str, tuple[int, float]]:
    found: dict[str, tuple[int, float]] = {}
    for (path, _line, name), (_cc, ncalls, _tt, cumulative, _callers) in stats.stats.items():
        for phase, (fragment, function) in PHASES.items():
            if name == function and fragment in path.replace("\\", "/"):
                calls, total = found.get(phase, (0, 0.0))
                found[phase] = (calls + ncalls, total + cumulative)
    return found


def print_phases(stats: pstats.Stats, wall: float, gc_timer: GcTimer) -> None:
    found = phase_times(stats)
    print(f"{'phase':<48} {'calls':>7} {'cum s':>8} {'% wall':>7}")
    for phase in PHASES:
        if phase in found:
            calls, total = found[phase]
            print(f"{phase:<48} {calls:>7} {total:>8.2f} {100 * total / wall:>6.1f}%")
    print(f"{'garbage collection (gc.callbacks)':<48} {gc_timer.collections:>7} {gc_timer.total:>8.2f} "
          f"{100 * gc_timer.total / wall:>6.1f}%")
    print(f"{'wall':<48} {'':>7} {wall:>8.2f}")


def executor_counts(jitted) -> str:
    import collections

    import thunder

    lines = []
    for kind, traces in (("forward", thunder.last_traces(jitted)), ("backward", thunder.last_backward_traces(jitted))):
        if not traces:
            continue
        count = collections.Counter(
            (b.sym.executor.name if b.sym.executor is not None else "(none)") for b in traces[-1].bound_symbols
        )
        lines.append(f"{kind}: {len(traces[-1].bound_symbols)} bound symbols; " +
                     ", ".join(f"{name} {n}" for name, n in count.most_common()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--variant", default="fp8-thunderplug")
    parser.add_argument("--steps", type=int, default=5, help="profiled steady-state steps (default 5)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--save", type=pathlib.Path, help="write the first call's profile here (pstats format)")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--ops", action="store_true", help="also the steps' ATen ops by self time (torch.profiler)")
    args = parser.parse_args(argv)

    import gpt_float8
    from gpt_model import GPTConfig, build

    gpt_float8.setup_torch(1)
    model, tokens, targets = build(GPTConfig(layers=args.layers, d_model=args.d_model))
    gc_timer = GcTimer()
    gc.callbacks.append(gc_timer)
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    trainer = gpt_float8.Trainer(args.variant, copy.deepcopy(model), tokens, targets)
    trainer.step()
    profile.disable()
    wall = time.perf_counter() - start
    gc.callbacks.remove(gc_timer)
    if args.save:
        profile.dump_stats(str(args.save))
    stats = pstats.Stats(profile)
    print(f"== first call: {args.variant}, {args.layers} layers, d_model {args.d_model} ==")
    print_phases(stats, wall, gc_timer)
    print()
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top)

    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    for _ in range(args.steps):
        trainer.step()
    profile.disable()
    wall = time.perf_counter() - start
    print(f"== {args.steps} steady-state steps: {wall / args.steps * 1e3:.1f} ms a step ==")
    if hasattr(trainer.fn, "_lc_cd"):
        print(executor_counts(trainer.fn))
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime").print_stats(args.top)
    if args.ops:
        import torch

        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                trainer.step()
        print(f"== ATen ops of {args.steps} steps (torch.profiler, self CPU time) ==")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
