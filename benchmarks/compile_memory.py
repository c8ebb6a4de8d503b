"""Where a compilation's own memory goes: the Python heap (tracemalloc) at each of thunder's phases
while it compiles the GPT of ``benchmarks/gpt_float8.py`` (issue 14's first-step memory).

    python benchmarks/compile_memory.py [--layers 2,8] [--variants fp8-thunderplug,fp32-thunder,fp32-thunderplug]
                                        [--rss-variants fp8-thunderplug,fp32-thunder,fp8-aot-eager,fp8-eager]
                                        [--repeats 3]

Each (depth, variant) compiles in a fresh process, without running a step (``_get_computation_and_inputs``
of thunder's CompileData traces and transforms exactly as the first call does). For each phase the table
gives the heap held when it ends and the most held at once while it ran (its nested phases included).
"compilation, total" held is what the compilation keeps: traces (``thunder.last_traces``), generated code, caches.
tracemalloc sees only Python's allocations (not tensors, not library pages) and slows compilation.

A second table gives resident memory (no tracemalloc): how much RSS the compilation alone adds, and how
much RSS grows at most during the whole first step (compilation included), with glibc's mmap threshold
fixed so that the figure is not bimodal (see docs/benchmarks.md). The first step's tensors come on top of
the compilation's peak, since freed Python objects stay in CPython's and glibc's free lists.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tracemalloc

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

#: (label, module, attribute): the functions thunder's first call runs the phases through
PHASES = [
    ("interpretation", "thunder", "thunder_general_jit"),
    ("claiming + fusion", "thunder.executors.passes", "transform_for_execution"),
    ("autodiff (joint trace)", "thunder.transforms.autodiff", "grad_transform_on_trace"),
    ("forward/backward split", "thunder.transforms.autodiff", "split_into_forward_and_backward"),
    ("del_last_used", "thunder.executors.passes", "del_last_used"),
]
MIB = 2**20


class PhaseRecorder:
    """Wraps thunder's phase functions; each phase's peak is the most the heap held at once between
    its start and its end (tracemalloc keeps one peak, so it is read and reset at every boundary and
    folded into every phase still open)."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self._open: list[list[float]] = []  # per open phase: [peak so far]

    def _fold_peak(self) -> int:
        held, peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for running in self._open:
            running[0] = max(running[0], peak)
        return held

    def wrap(self, label: str, fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            self._fold_peak()
            self._open.append([0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                held = self._fold_peak()
                (peak,) = self._open.pop()
                self.rows.append({"phase": label, "held": held / MIB, "peak": peak / MIB})

        return call


def _trainer(layers: int, variant: str):
    import gpt_float8
    from gpt_model import GPTConfig, build

    gpt_float8.setup_torch(1)
    model, tokens, targets = build(GPTConfig(layers=layers, d_model=256, heads=4, seq=128, batch=4, vocab=512))
    return gpt_float8.Trainer(variant, model, tokens, targets)


def heap_worker(layers: int, variant: str) -> list[dict]:
    """The phases' Python heap while ``variant`` compiles (no step)."""
    import thunder

    trainer = _trainer(layers, variant)
    recorder = PhaseRecorder()
    for label, module_name, name in PHASES:
        module = importlib.import_module(module_name)
        setattr(module, name, recorder.wrap(label, getattr(module, name)))
    tracemalloc.start(1)
    compile_only = thunder.compile_data(trainer.fn)._get_computation_and_inputs
    recorder.wrap("compilation, total", compile_only)(trainer.tokens, trainer.targets)
    return recorder.rows


def rss_worker(layers: int, variant: str) -> dict:
    """RSS growth (``/proc/self/status``, MiB) of the compilation alone (thunder variants) and the most
    RSS grew during the first step, compilation included (the high-water mark reset just before)."""
    import gpt_float8

    trainer = _trainer(layers, variant)
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM := VmRSS
    (start,) = gpt_float8.proc_status_kib("VmRSS")
    result = {}
    if "thunder" in variant:
        import thunder

        thunder.compile_data(trainer.fn)._get_computation_and_inputs(trainer.tokens, trainer.targets)
        result["compilation"] = (gpt_float8.proc_status_kib("VmRSS")[0] - start) / 1024
    trainer.step()
    result["first step"] = (gpt_float8.proc_status_kib("VmHWM")[0] - start) / 1024
    return result


def run_worker(mode: str, layers: int, variant: str, env: dict[str, str]) -> object:
    proc = subprocess.run([sys.executable, __file__, "--worker", mode, str(layers), variant], capture_output=True,
                          text=True, env={**os.environ, "THUNDERPLUG_QUIET": "1", **env})
    if proc.returncode != 0:
        sys.exit(f"{variant} at {layers} layers failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def heap_table(layers: int, variants: list[str]) -> None:
    results = {variant: run_worker("heap", layers, variant, {}) for variant in variants}
    print(f"\n#### {layers} layers: Python heap during compilation, MiB held at the end of each phase / peak "
          "while it ran\n")
    print("| phase (in order) | " + " | ".join(gpt_float8_label(v) for v in variants) + " |")
    print("|---|" + "---:|" * len(variants))
    for index, row in enumerate(results[variants[0]]):
        cells = []
        for variant in variants:
            other = results[variant][index] if index < len(results[variant]) else None
            same = other is not None and other["phase"] == row["phase"]
            cells.append(f"{other['held']:.1f} / {other['peak']:.1f}" if same else "—")
        print(f"| {row['phase']} | " + " | ".join(cells) + " |")


def rss_table(layers: int, variants: list[str], repeats: int) -> None:
    """Medians of ``repeats`` fresh processes per variant, run round-robin, glibc's mmap threshold fixed."""
    runs: dict[str, list[dict]] = {variant: [] for variant in variants}
    for _ in range(repeats):
        for variant in variants:
            runs[variant].append(run_worker("rss", layers, variant, {"MALLOC_MMAP_THRESHOLD_": "131072"}))
    print(f"\n#### {layers} layers: RSS growth, MiB (median of {repeats} fresh processes, glibc mmap threshold "
          "fixed at 128 KiB)\n")
    print("| variant | compilation alone | first step, compilation included |")
    print("|---|---:|---:|")
    for variant, results in runs.items():
        cells = [statistics.median(r[key] for r in results) if key in results[0] else None
                 for key in ("compilation", "first step")]
        print(f"| {gpt_float8_label(variant)} | " + " | ".join("—" if c is None else f"{c:.1f}" for c in cells) + " |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="2,8")
    parser.add_argument("--variants", default="fp8-thunderplug,fp32-thunder,fp32-thunderplug")
    parser.add_argument("--rss-variants", default="fp8-thunderplug,fp32-thunder,fp8-aot-eager,fp8-eager",
                        help="variants of the RSS table ('' for none)")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per RSS cell (median)")
    parser.add_argument("--worker", nargs=3, metavar=("MODE", "LAYERS", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        mode, layers, variant = args.worker
        print(json.dumps((heap_worker if mode == "heap" else rss_worker)(int(layers), variant)))
        return
    for layers in [int(n) for n in args.layers.split(",")]:
        if args.variants:
            heap_table(layers, args.variants.split(","))
        if args.rss_variants:
            rss_table(layers, args.rss_variants.split(","), args.repeats)


def gpt_float8_label(variant: str) -> str:
    import gpt_float8

    return gpt_float8.LABELS[variant]


if __name__ == "__main__":
    main()
