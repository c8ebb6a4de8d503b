"""Where a compilation's own memory goes: the Python heap (tracemalloc) at each of thunder's phases
while it compiles the GPT of ``benchmarks/gpt_float8.py`` (issue 14's first-step memory).

    python benchmarks/compile_memory.py [--layers 2,8] [--variants fp8-thunderplug,fp32-thunder,fp32-thunderplug]

Each (depth, variant) compiles in a fresh process, without running a step (``_get_computation_and_inputs``
of thunder's CompileData traces and transforms exactly as the first call does). For each phase the table
gives the heap held when it ends and the most held at once while it ran (its nested phases included).
"compilation, total" held is what the compilation keeps: traces (``thunder.last_traces``), generated code, caches.
The first step's resident memory stacks the step's tensors on top of the compilation's peak, since
freed Python objects stay in CPython's and glibc's free lists; ``gpt_float8.py`` measures that whole.
tracemalloc sees only Python's allocations (not tensors, not library pages) and slows compilation.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import pathlib
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


def worker(layers: int, variant: str) -> dict:
    import gpt_float8
    import thunder
    from gpt_model import GPTConfig, build

    gpt_float8.setup_torch(1)
    model, tokens, targets = build(GPTConfig(layers=layers, d_model=256, heads=4, seq=128, batch=4, vocab=512))
    trainer = gpt_float8.Trainer(variant, model, tokens, targets)
    recorder = PhaseRecorder()
    for label, module_name, name in PHASES:
        module = importlib.import_module(module_name)
        setattr(module, name, recorder.wrap(label, getattr(module, name)))
    tracemalloc.start(1)
    recorder.wrap("compilation, total", thunder.compile_data(trainer.fn)._get_computation_and_inputs)(tokens, targets)
    return {"layers": layers, "variant": variant, "rows": recorder.rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="2,8")
    parser.add_argument("--variants", default="fp8-thunderplug,fp32-thunder,fp32-thunderplug")
    parser.add_argument("--worker", nargs=2, metavar=("LAYERS", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(int(args.worker[0]), args.worker[1])))
        return
    variants = args.variants.split(",")
    for layers in [int(n) for n in args.layers.split(",")]:
        results = {}
        for variant in variants:
            proc = subprocess.run([sys.executable, __file__, "--worker", str(layers), variant], capture_output=True,
                                  text=True, env={**os.environ, "THUNDERPLUG_QUIET": "1"})
            if proc.returncode != 0:
                sys.exit(f"{variant} at {layers} layers failed:\n{proc.stderr[-3000:]}")
            results[variant] = json.loads(proc.stdout.strip().splitlines()[-1])["rows"]
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


def gpt_float8_label(variant: str) -> str:
    import gpt_float8

    return gpt_float8.LABELS[variant]


if __name__ == "__main__":
    main()
