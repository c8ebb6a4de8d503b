"""First-call time (tracing + compilation + the call) of each real-program case
(tests/real_programs) under ``thunder.jit(executors=discover())`` vs ``torch.compile(backend="aot_eager")``,
and which of aot_eager, stock ``thunder.jit`` and discover() compute what eager does.

One process, cases in suite order, the two compilers alternating which goes first per case. The
first call of a training case is its first forward; of any other case its forward. Both
compilers keep process-wide caches (dynamo is reset per case; thunderplug's unrolled-graph cache
is not, so a case whose ops repeat an earlier case's metadata starts warmer: noted, not hidden).

    python benchmarks/first_call.py [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "tests"))
os.environ.setdefault("THUNDERPLUG_QUIET", "1")
warnings.filterwarnings("ignore")

from real_programs import all_cases  # noqa: E402
from real_programs.runner import assert_equal_runs, run  # noqa: E402


def _cell(result) -> str:
    if result.error is not None:
        return f"error ({type(result.error).__name__})"
    return f"{result.first_call_s:.2f}"


def _equals_eager(result, eager, case) -> bool:
    try:
        assert_equal_runs(result, eager, case.tolerance, "")
    except AssertionError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only cases whose name contains this")
    args = parser.parse_args()
    ratios = []
    counts = {"aot_eager": 0, "stock": 0, "discover": 0}
    total = 0
    print(
        "| case | eager (s) | aot_eager (s) | discover() (s) | discover / aot_eager "
        "| equal to eager: aot_eager / stock / discover |"
    )
    print("|---|---:|---:|---:|---:|---|")
    for index, case in enumerate(c for c in all_cases() if args.only in c.name):
        eager = run(case, "eager")
        if eager.error is not None:
            print(f"| {case.name} | eager fails on CPU: {type(eager.error).__name__} | | | |")
            continue
        order = ("aot_eager", "discover") if index % 2 == 0 else ("discover", "aot_eager")
        results = {mode: run(case, mode) for mode in (*order, "stock")}
        aot, ours = results["aot_eager"], results["discover"]
        equal = {mode: _equals_eager(results[mode], eager, case) for mode in counts}
        total += 1
        for mode, ok in equal.items():
            counts[mode] += ok
        marks = " / ".join("yes" if equal[mode] else "no" for mode in ("aot_eager", "stock", "discover"))
        ratio = ""
        if aot.error is None and ours.error is None:
            ratios.append(ours.first_call_s / aot.first_call_s)
            ratio = f"{ratios[-1]:.2f}"
        print(f"| {case.name} | {eager.first_call_s:.3f} | {_cell(aot)} | {_cell(ours)} | {ratio} | {marks} |")
    print(f"\nequal to eager, of {total} cases eager runs: " + ", ".join(f"{m} {n}" for m, n in counts.items()))
    if ratios:
        print(
            f"\n{len(ratios)} cases: median discover/aot_eager first-call ratio {statistics.median(ratios):.2f} "
            f"(min {min(ratios):.2f}, max {max(ratios):.2f})"
        )


if __name__ == "__main__":
    main()
