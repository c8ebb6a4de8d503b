"""Speed stays (issue 42, item 4): the benchmark GPT's first call and training step under ``discover()``,
this checkout against an earlier revision, in one interleaved run.

Each revision's core and plugin sources (this checkout's working tree, and ``git archive`` of the base) go
first on the ``PYTHONPATH`` of fresh worker processes of ``benchmarks/gpt_float8.py`` (this checkout's
script, so both revisions run the same benchmark code). Worker processes alternate between the revisions,
the order rotating every round, so that the machine's load falls on both alike; the table gives medians
over the rounds and the ratio this/base (below 1.00: faster now). The losses of every step are compared:
a change of speed must not be a change of numbers.

Wall time on a shared 2-core machine moves by +-15% from run to run; ``--calls`` adds, per revision and variant,
the first step's Python function calls (cProfile, one more fresh process each): a count that does not depend on
the machine's load, so a change of the first call's work shows even where its time is noise.

    python benchmarks/revisions.py --base dc1188d [--rounds 3] [--layers 2] [--steps 6] [--calls]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import pathlib
import statistics
import subprocess
import sys
import tarfile
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import gpt_float8  # noqa: E402

SOURCES = ("core/src", "plugins/aten_ops/src", "plugins/float8/src", "plugins/nvfuser/src",
           "plugins/transformer_engine/src")


def export(revision: str, into: pathlib.Path) -> pathlib.Path:
    """The revision's tree, extracted from ``git archive`` (no worktree left behind)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, *SOURCES], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    # bytecode now, so that the base's first call does not include compiling its sources (this checkout's are)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(into)], check=True)
    return into


@contextlib.contextmanager
def sources_of(tree: pathlib.Path):
    """Workers started inside import thunderplug and its plugins from ``tree``."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(tree / s) for s in SOURCES] + ([before] if before else []))
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def measure(trees: dict[str, pathlib.Path], args) -> dict[str, dict[str, dict[str, list]]]:
    """Per revision and variant: first-call seconds, step medians (ms) and losses, one list entry per round."""
    options = ["--layers", str(args.layers), "--mem-warmup", "0", "--timeout", str(args.timeout)]
    worker_args = gpt_float8.parse(options + (["--quick"] if args.quick else []))
    worker_args.steps, worker_args.warmup = args.steps, 1
    names = list(trees)
    results = {name: {v: {"first_s": [], "step_ms": [], "losses": []} for v in args.variants} for name in names}
    for round_ in range(args.rounds):
        order = names[round_ % len(names):] + names[:round_ % len(names)]
        for name in order:
            with sources_of(trees[name]):
                for variant in args.variants:
                    print(f"... round {round_ + 1}/{args.rounds}: {name} first call of {variant}", file=sys.stderr,
                          flush=True)
                    first = gpt_float8.run_worker("first", args.layers, worker_args, ["--variant", variant])
                    results[name][variant]["first_s"].append(first.get("first_s"))
                print(f"... round {round_ + 1}/{args.rounds}: {name} steps", file=sys.stderr, flush=True)
                steady = gpt_float8.run_worker("steady", args.layers, worker_args,
                                               ["--variants", ",".join(args.variants)])
            for variant in args.variants:
                ok = steady.get("ok", {}).get(variant)
                results[name][variant]["step_ms"].append(ok["median_ms"] if ok else None)
                results[name][variant]["losses"].append(ok["losses"] if ok else None)
    if args.calls:
        for name in names:
            with sources_of(trees[name]):
                for variant in args.variants:
                    print(f"... {name} Python calls of {variant}'s first step", file=sys.stderr, flush=True)
                    counted = gpt_float8.run_worker("first", args.layers, worker_args,
                                                    ["--variant", variant, "--count-calls"])
                    results[name][variant]["python_calls"] = [counted.get("python_calls")]
    return results


def median(values: list) -> float | None:
    return statistics.median(values) if values and all(v is not None for v in values) else None


def table(results, base: str, args) -> str:
    this, before = results["this checkout"], results[base]
    size = "tiny model (--quick)" if args.quick else "gpt_float8.py's defaults otherwise"
    columns = [("first_s", "{:.2f}", "first call", "s"), ("step_ms", "{:.1f}", "step", "ms")]
    if args.calls:
        columns.append(("python_calls", "{:,}", "first call's Python calls", "count"))
    header = "".join(f" {what} {base} ({unit}) | {what} now ({unit}) | now/{base} |" for _, _, what, unit in columns)
    lines = [f"GPT of benchmarks/gpt_model.py, {args.layers} layers ({size}), AdamW; medians of {args.rounds} "
             f"interleaved rounds (first call: a fresh process; step: median of {args.steps} steps after 1 warm-up)",
             "", "| variant |" + header + " losses equal |", "|---|" + "---:|" * (3 * len(columns)) + "---|"]
    for variant in args.variants:
        cells = []
        for key, scale, _, _ in columns:
            a, b = median(before[variant][key]), median(this[variant][key])
            cells += [scale.format(a) if a else "FAIL", scale.format(b) if b else "FAIL",
                      f"{b / a:.2f}" if a and b else "—"]
        equal = before[variant]["losses"] == this[variant]["losses"] and None not in this[variant]["losses"]
        lines.append(f"| {gpt_float8.LABELS[variant]} | " + " | ".join(cells) + f" | {'yes' if equal else 'NO'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the earlier revision (a commit, tag or branch)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--variants", default="fp32-thunderplug,fp8-thunderplug")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per worker process")
    parser.add_argument("--quick", action="store_true", help="smoke run: gpt_float8.py's tiny model")
    parser.add_argument("--calls", action="store_true", help="also count the first step's Python calls (cProfile)")
    args = parser.parse_args(argv)
    args.variants = args.variants.split(",")
    with tempfile.TemporaryDirectory(prefix="thunderplug-base-") as tmp:
        trees = {"this checkout": ROOT, args.base: export(args.base, pathlib.Path(tmp))}
        print(table(measure(trees, args), args.base, args))


if __name__ == "__main__":
    main()
