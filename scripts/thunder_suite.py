"""Never worse than stock thunder (issue 23): thunder 0.2.6's own shipped tests (``thunder/tests/`` in
its wheel), run stock, with thunderplug's patches installed (executors unchanged), and with
thunderplug's executors injected into every ``thunder.jit``; outcomes compared per test id.

    python scripts/thunder_suite.py                       # the bounded slice (SLICE_BOUNDED below)
    python scripts/thunder_suite.py --slice full          # the CPU slice of issue 23 (about an hour)
    python scripts/thunder_suite.py --slice full --write-docs   # and docs/thunder_suite.md
    python scripts/thunder_suite.py --slice full --modes discover --stock-record scripts/thunder_suite_stock.jsonl
                                  # the default CI run (tests/test_thunder_suite.py): discover against the stored stock
    THUNDER_SUITE=full python -m pytest tests/test_thunder_suite.py   # the full slice, all three modes run afresh
    python scripts/thunder_suite.py --slice full --run-mode stock --work W   # then W/stock.jsonl becomes
                                  # scripts/thunder_suite_stock.jsonl: the stored stock record (new thunder/slice)
    python scripts/thunder_suite.py --slice full --run-mode stock --work W/stock   # one mode per process
    python scripts/thunder_suite.py --slice full --records W/stock W/patches W/discover --write-docs

How each mode runs is in ``scripts/thunder_suite_plugin.py`` (a pytest plugin loaded into thunder's
test session). A *regression* is a test that passes stock and does not pass in a thunderplug mode;
an *improvement* one that fails stock and passes. A stock ``xfailed`` counts as green for regressions (failing
in another way in a mode is one) and as failing for improvements (passing in a mode, also as a strict xfail's
``XPASS(strict)``, is one: recorded, not hidden). A regression listed in :data:`EXPECTED` (stock
thunder wrong against eager, thunderplug right) is reported as expected, with its reason and the
test of eager's behaviour in tests/test_thunder_suite.py; every other one makes the script exit 1.
A test that crashes the process or runs past ``--timeout`` is recorded as ``crashed`` and the run
goes on with the tests after it. thunder's tests need ``pytest-benchmark`` (its conftest) and
``fdm`` (test_grad): the project's ``test`` extra installs them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_DIR = Path(__file__).resolve().parent
DOCUMENT = ROOT / "docs" / "thunder_suite.md"
BOUNDED_IDS = PLUGIN_DIR / "thunder_suite_bounded.txt"
#: stock thunder's outcome of each test of the full slice (a ``--run-mode stock`` record): the default CI run
#: compares discover() with it instead of running stock thunder again (the slice's stock run costs as much again)
STOCK_RECORD = PLUGIN_DIR / "thunder_suite_stock.jsonl"
MODES = ("stock", "patches", "discover")
PASSING = {"passed"}
FAILING = {"failed", "error", "crashed"}
#: a strict xfail that passed: pytest fails the test, but what it tests now works
XPASSED = {"xpassed", "xpassed-strict"}

#: The files of the full slice (issue 23's CPU slice), each with the rule that keeps a collected id.
FULL_FILES = (
    "test_core.py",
    "test_jit_general.py",
    "test_networks.py",
    "test_transforms.py",
    "test_inplace_copy.py",
    "test_update_aliases.py",
    "test_autocast.py",
    "test_dynamo.py",
    "test_interpreter.py",
    "test_extend.py",
    "test_recipes.py",
    "test_ops.py",
    "test_grad.py",
)

#: The ops of test_ops.py and test_grad.py in the full slice (OpInfo names), run in these dtypes.
OPS = (
    "abs", "add", "amax", "avg_pool2d", "batch_norm", "cat_wrapper", "conv2d", "cross_entropy", "cumsum", "div",
    "embedding", "exp", "gather", "gelu", "getitem", "group_norm", "index_add", "index_copy", "interpolate",
    "layer_norm", "linear", "log", "log_softmax", "masked_fill", "matmul", "max_pool1d", "max_pool2d", "max_pool3d",
    "mean", "mul",
    "nll_loss", "permute", "relu", "reshape", "rsqrt", "scaled_dot_product_attention", "scatter_add", "sigmoid",
    "sin", "softmax", "sum", "tanh", "topk", "transpose", "var_mean", "where",
)  # fmt: skip
OP_DTYPES = ("float32", "int64", "bool8")
_OP_TEST = re.compile(
    r"^test_(ops|grad)\.py::(test_core_vs_torch_consistency|test_core_vs_numpy_consistency|test_errors"
    r"|test_phantom_grad_vs_torch_consistency)_(?P<op>\w+)_torch_cpu_thunder\.dtypes\.(?P<dtype>\w+)$"
)
#: test_grad.py's tests that are not per op, on CPU (float32 or no dtype)
_GRAD_TEST = re.compile(
    r"^test_grad\.py::(?!test_vjp_correctness|test_phantom_grad_vs)\w+_torch_cpu_(None|thunder\.dtypes\.float32)$"
)


def in_full_slice(test_id: str) -> bool:
    """Whether a collected test id is in the full slice: every test of the files above, except
    test_dynamo's reproducer and benchmark tests (they write and run scripts, or time things) and,
    in test_ops/test_grad, what is not an op of :data:`OPS` in :data:`OP_DTYPES` on CPU (or one of
    test_grad's non-op tests on CPU)."""
    file = test_id.split("::", 1)[0]
    if file == "test_dynamo.py":
        return not re.search(r"reproducer|benchmark", test_id, re.IGNORECASE)
    if file in ("test_ops.py", "test_grad.py"):
        match = _OP_TEST.match(test_id)
        if match:
            return match["op"] in OPS and match["dtype"] in OP_DTYPES
        return file == "test_grad.py" and bool(_GRAD_TEST.match(test_id))
    return file in FULL_FILES


#: The tests issue 23 found regressed under discover() (all in the bounded slice), by cause:
ONCE_REGRESSED = (
    # 1. outputs marked non-differentiable that eager differentiates (output_grads)
    "test_core.py::test_set_grad_enabled[False-False-True-2-False]",
    "test_core.py::test_set_grad_enabled[False-False-True-2-True]",
    "test_core.py::test_set_grad_enabled[False-True-False-1-True]",
    "test_core.py::test_set_grad_enabled[False-True-True-2-True]",
    "test_jit_general.py::test_autograd_function_apply_with_no_grad",
    "test_update_aliases.py::test_higher_order_inplace_alias_update_torch_cpu_thunder.dtypes.float32",
    # 2. the "claims bound directly" speedup
    "test_ops.py::test_core_vs_torch_consistency_max_pool1d_torch_cpu_thunder.dtypes.float32",
    "test_ops.py::test_core_vs_torch_consistency_max_pool2d_torch_cpu_thunder.dtypes.float32",
    "test_ops.py::test_core_vs_torch_consistency_max_pool3d_torch_cpu_thunder.dtypes.float32",
    "test_jit_general.py::test_matmul_nd_times_2d_runs_2d_gemm[cpu]",
    # 3. the is_compiling lookaside (needs transformers)
    "test_networks.py::test_hf_bert",
    # 4. eager_kernels took SDPA out of the trace
    "test_core.py::test_torch_scaled_dot_product_attention_non_decomposed_torch_cpu_None",
    # 5. discover() added its executors to thunder's registry (also with executors unchanged)
    "test_extend.py::test_get_all_executors_includes_all_native_executors",
    # 6. broadcast_grads read the expanded operand's gradient with get_grad (thunder.core.transforms.grad)
    "test_grad.py::test_phantom_grad_vs_torch_consistency_add_torch_cpu_thunder.dtypes.float32",
    "test_grad.py::test_phantom_grad_vs_torch_consistency_mul_torch_cpu_thunder.dtypes.float32",
    # 7. a model's repeated blocks as regions (issue 26): the root's cache statistics and prologue traces
    #    (also test_tom_overrides_proxy[cpu], parameters replaced on the ThunderModule: left out of the bounded
    #    slice, as it failed once in patches mode and passed when rerun, with "dictionary changed size during
    #    iteration" while thunder traced dynamo's weak module tracker, which the garbage collector changes;
    #    tests/test_whole_model_reuse.py checks the behaviour)
    "test_jit_general.py::test_litgpt",
    "test_jit_general.py::test_litgpt_variants[cpu-llama2-like]",
    # 8. (issue 42) two operators of one name on one executor: the composite's eager_interpolate ran the
    #    interpolate_modes execution of that name
    "test_ops.py::test_core_vs_torch_consistency_interpolate_torch_cpu_thunder.dtypes.float32",
    # 9. (issue 42) ltorch.where jitted itself: thunder's refusal text lost in the graph-break error
    "test_ops.py::test_errors_where_torch_cpu_thunder.dtypes.bool8",
    "test_ops.py::test_errors_where_torch_cpu_thunder.dtypes.float32",
    "test_ops.py::test_errors_where_torch_cpu_thunder.dtypes.int64",
    # 10. (issue 42) graph-broken at MoE's data-dependent ops: no prologue traces (IndexError in the test), and a
    #     strict xfail that now passes (an improvement, no longer a failure to the comparison)
    "test_jit_general.py::test_litgpt_variants[cpu-mixtral-like]",
    "test_jit_general.py::test_litgpt_variants_kvcache[cpu-mixtral-like]",
)


@dataclass(frozen=True)
class Expected:
    """A difference from stock that is right: stock thunder disagrees with eager, thunderplug agrees."""

    reason: str
    eager_test: str  # the test in tests/test_thunder_suite.py that checks eager's behaviour


#: test id -> why its stock outcome is wrong (none so far: every regression found was a thunderplug bug).
EXPECTED: dict[str, Expected] = {}


def thunder_tests_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("thunder")
    if spec is None or spec.origin is None:
        raise SystemExit("thunder is not installed")
    return Path(spec.origin).parent / "tests"


# Variables thunder's suite reads to skip tests on a CI machine (framework.IN_CI, test_networks). They are
# dropped so that a run on CI selects the same tests as the stored stock record made on a workstation;
# otherwise a test stock passed shows up as "skipped" under discover() and reads as a regression.
_SUITE_SELECTING_VARIABLES = ("CI", "SKIP_WITH_GPT_CI")


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SUITE_SELECTING_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PLUGIN_DIR), env.get("PYTHONPATH", "")) if p)
    env.setdefault("THUNDERPLUG_QUIET", "1")
    return env


def _pytest(tests: Path, work: Path, mode: str, extra_env: dict[str, str], args: list[str]) -> int:
    """One pytest process over thunder's tests (its own conftest, none of this project's options)."""
    ini = work / "pytest.ini"
    ini.write_text("[pytest]\n")
    command = [
        sys.executable, "-m", "pytest", "-c", str(ini), "--rootdir", str(tests), "-p", "no:cacheprovider",
        "-p", "thunder_suite_plugin", "-q", "--no-header", "--continue-on-collection-errors", *args,
    ]  # fmt: skip
    env = {**_environment(), "THUNDER_SUITE_MODE": mode, **extra_env}
    with open(work / f"{mode}.log", "a") as log:
        return subprocess.call(command, cwd=tests, env=env, stdout=log, stderr=subprocess.STDOUT)


def collect(tests: Path, work: Path, files: list[str]) -> list[str]:
    """Every test id pytest collects in ``files``."""
    out = work / "collected.txt"
    _pytest(tests, work, "stock", {"THUNDER_SUITE_COLLECTED": str(out)}, ["--collect-only", *files])
    if not out.exists():
        raise SystemExit(f"collection failed: see {work / 'stock.log'}")
    return [line.rstrip("\n") for line in out.read_text().splitlines() if line.strip()]


def read_records(record: Path) -> tuple[dict[str, dict], str | None]:
    """The outcomes a record file holds, and the test that started last without ending (if any)."""
    results: dict[str, dict] = {}
    started = None
    for line in record.read_text().splitlines() if record.exists() else ():
        entry = json.loads(line)
        if "start" in entry:
            started = entry["start"]
        else:
            results[entry["id"]] = entry
            started = None
    return results, started if started not in results else None


def from_records(directories: list[Path], modes: tuple[str, ...] = MODES) -> dict[str, dict[str, dict]]:
    """Results assembled from the record files of runs made separately (``<mode>.jsonl`` and the
    ``select.txt`` of each directory; the first directory that has a mode wins), e.g. modes run in
    parallel processes."""
    results: dict[str, dict[str, dict]] = {}
    for directory in directories:
        ids = [i for i in (directory / "select.txt").read_text().splitlines() if i]
        for mode in modes:
            if mode in results or not (directory / f"{mode}.jsonl").exists():
                continue
            found, _ = read_records(directory / f"{mode}.jsonl")
            results[mode] = {i: found.get(i, {"id": i, "outcome": "not run", "message": "not run"}) for i in ids}
    return results


def run_mode(tests: Path, work: Path, mode: str, ids: list[str], timeout: float) -> dict[str, dict]:
    """Outcome of each id in ``mode``; a process that dies in a test is restarted after it."""
    select = work / "select.txt"
    select.write_text("".join(i + "\n" for i in ids))
    record, done = work / f"{mode}.jsonl", work / f"{mode}.done"
    record.unlink(missing_ok=True)
    done.write_text("")
    files = sorted({i.split("::", 1)[0] for i in ids})
    results: dict[str, dict] = {}
    for _ in range(len(ids) + 1):
        env = {
            "THUNDER_SUITE_RECORD": str(record),
            "THUNDER_SUITE_SELECT": str(select),
            "THUNDER_SUITE_DONE": str(done),
            "THUNDER_SUITE_TIMEOUT": str(timeout),
        }
        rc = _pytest(tests, work, mode, env, files)
        results, started = read_records(record)
        if started is not None:  # the process ended inside this test
            results[started] = {
                "id": started,
                "outcome": "crashed",
                "message": f"the process ended during the test (crash, or over {timeout:g} s; rc {rc})",
                "seconds": None,
            }
            with open(record, "a") as f:
                f.write(json.dumps(results[started]) + "\n")
        done.write_text("".join(i + "\n" for i in results))
        if started is None:
            break
    for missing in set(ids) - set(results):
        results[missing] = {"id": missing, "outcome": "not run", "message": "not collected in this mode"}
    return results


@dataclass
class Comparison:
    mode: str
    regressions: list[str]
    expected: list[str]
    improvements: list[str]


def compare(stock: dict[str, dict], other: dict[str, dict], mode: str) -> Comparison:
    regressions, expected, improvements = [], [], []
    for test_id in sorted(stock):
        before, after = stock[test_id]["outcome"], other.get(test_id, {}).get("outcome", "not run")
        if (before in PASSING and after not in PASSING) or (before == "xfailed" and after in FAILING):
            (expected if test_id in EXPECTED else regressions).append(test_id)
        elif before in FAILING | {"xfailed"} and after in PASSING | XPASSED:
            improvements.append(test_id)
    return Comparison(mode, regressions, expected, improvements)


def report(results: dict[str, dict[str, dict]], comparisons: list[Comparison]) -> str:
    lines = []
    for mode, outcomes in results.items():
        counts = Counter(r["outcome"] for r in outcomes.values())
        lines.append(f"{mode:9} {len(outcomes)} tests: " + ", ".join(f"{n} {k}" for k, n in counts.most_common()))
    for c in comparisons:
        lines.append(
            f"{c.mode}: {len(c.regressions)} regressions, {len(c.expected)} expected differences, "
            f"{len(c.improvements)} improvements"
        )
        for test_id in c.regressions:
            lines.append(f"  REGRESSION {test_id}: {results[c.mode][test_id]['outcome']}: "
                         f"{results[c.mode][test_id]['message']}")  # fmt: skip
        for test_id in c.expected:
            lines.append(f"  expected   {test_id}: {EXPECTED[test_id].reason} ({EXPECTED[test_id].eager_test})")
        for test_id in c.improvements:
            lines.append(f"  improved   {test_id} (stock: {results['stock'][test_id]['message']})")
    return "\n".join(lines)


def always_active_patches() -> list[str]:
    from thunderplug.wiring import patches

    return [patch.name for patch in patches.PATCHES if "always" in patch.active]


def markdown(results: dict[str, dict[str, dict]], comparisons: list[Comparison], slice_name: str,
             timing: str, generated_by: str) -> str:  # fmt: skip
    import thunder
    import torch

    modes = list(results)
    files = sorted({i.split("::", 1)[0] for i in results["stock"]})
    by_mode = {c.mode: c for c in comparisons}
    header = ["file", "tests", *(f"{m} passed" for m in modes), *(f"{c.mode} regressions" for c in comparisons),
              *(f"{c.mode} improvements" for c in comparisons)]  # fmt: skip
    lines = [
        "# thunder's own test suite under thunderplug",
        "",
        f"Generated by `{generated_by}` (issue 23); do not edit",
        "by hand. thunder's shipped tests (lightning-thunder "
        f"{thunder.__version__}, torch {torch.__version__}, CPU) run in three modes: **stock**; **patches**",
        "(`discover()` called, so thunderplug's patches are installed and its executors built, but `thunder.jit`",
        "unchanged); **discover** (every `thunder.jit` given thunderplug's executors: `executors=None` becomes",
        "`discover()`, a list `L` becomes `discover(include_defaults=False) + L`). A regression passes stock and",
        "not in that mode; an improvement fails stock and passes. The slice and the rule of each mode are in",
        "`scripts/thunder_suite.py` and `scripts/thunder_suite_plugin.py`.",
        "",
        f"Slice `{slice_name}`: {len(results['stock'])} tests; {timing}.",
        "",
        *_cost_lines(results),
        "The default CI run (`bash .ci/run` -> `scripts/test.sh` -> pytest: `tests/test_thunder_suite.py::"
        "test_thunder_suite_has_no_unexpected_regressions`) runs the full slice under **discover** only and compares",
        "it with the stored stock record `scripts/thunder_suite_stock.jsonl` (committed; regenerated with `--run-mode "
        "stock` when thunder, torch or the slice rule change); `THUNDER_SUITE=full` runs all three modes afresh,",
        "`THUNDER_SUITE=bounded` the bounded slice. No test of the slice is left out of the default run.",
        "",
        'The patches active outside `discover()` compilations ("always" in docs/patches.md), which the',
        f"**patches** mode checks: {', '.join(f'`{name}`' for name in always_active_patches())}.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    totals = [0] * (len(header) - 1)
    for file in files:
        ids = [i for i in results["stock"] if i.split("::", 1)[0] == file]
        row = [len(ids)]
        row += [sum(results[m][i]["outcome"] in PASSING for i in ids) for m in modes]
        row += [sum(i.split("::", 1)[0] == file for i in by_mode[c.mode].regressions) for c in comparisons]
        row += [sum(i.split("::", 1)[0] == file for i in by_mode[c.mode].improvements) for c in comparisons]
        totals = [t + v for t, v in zip(totals, row)]
        lines.append(f"| {file} | " + " | ".join(str(v) for v in row) + " |")
    lines.append("| **all** | " + " | ".join(f"**{v}**" for v in totals) + " |")
    for c in comparisons:
        lines += ["", f"## {c.mode}: regressions", ""]
        lines += [f"- `{i}`: {results[c.mode][i]['outcome']}: {results[c.mode][i]['message']}" for i in c.regressions]
        lines += [] if c.regressions else ["None."]
        if c.expected:
            lines += ["", f"Expected differences ({c.mode}):", ""]
            lines += [f"- `{i}`: {EXPECTED[i].reason} (eager: `{EXPECTED[i].eager_test}`)" for i in c.expected]
        if c.improvements:
            lines += ["", f"Improvements ({c.mode}):", ""]
            lines += [f"- `{i}` (stock: {results['stock'][i]['message']})" for i in c.improvements]
    return "\n".join(lines) + "\n"


def _cost_lines(results: dict[str, dict[str, dict]], slowest: int = 8) -> list[str]:
    """The CPU cost of each mode and its slowest tests, where the records carry it: user+sys seconds of the pytest
    process (all its threads) and of its finished children over each test (``resource.getrusage``, in
    scripts/thunder_suite_plugin.py), which other processes' load on a shared machine does not inflate as it does
    wall time."""
    costs = {m: [r for r in outcomes.values() if r.get("cpu") is not None] for m, outcomes in results.items()}
    if not any(costs.values()):
        return []
    lines = ["CPU time in tests (user+sys per test, `resource.getrusage` of the pytest process and its children; wall",
             "time on a machine shared with other jobs is longer): " + ", ".join(
                 f"{m} {sum(r['cpu'] for r in rs) / 60:.1f} min ({sum(r['seconds'] or 0 for r in rs) / 60:.0f} wall)"
                 for m, rs in costs.items() if rs) + ". The slowest tests (CPU s, per mode):", ""]  # fmt: skip
    ranked = sorted({i for rs in costs.values() for i in (r["id"] for r in rs)},
                    key=lambda i: -max(results[m].get(i, {}).get("cpu") or 0.0 for m in results))[:slowest]  # fmt: skip
    for test_id in ranked:
        per_mode = ", ".join(f"{m} {results[m][test_id]['cpu']:.1f}" for m in results
                             if results[m].get(test_id, {}).get("cpu") is not None)  # fmt: skip
        lines.append(f"- `{test_id}`: {per_mode}")
    return [*lines, ""]


def pick_bounded(results: dict[str, dict[str, dict]], seconds: float) -> list[str]:
    """The bounded slice: :data:`ONCE_REGRESSED`, and from each file of a full run an evenly spaced
    sample (every k-th id) of the tests that took under 5 s in every mode, each file's share of
    ``seconds`` (the slowest mode's time, summed) in proportion to its number of tests."""
    ids = sorted(results["stock"])
    slowest = {i: max((results[m][i].get("seconds") or 60.0) for m in results) for i in ids}
    picked = list(ONCE_REGRESSED)
    files = sorted({i.split("::", 1)[0] for i in ids})
    for file in files:
        candidates = [i for i in ids if i.split("::", 1)[0] == file and slowest[i] < 5.0 and i not in picked]
        share = seconds * len([i for i in ids if i.split("::", 1)[0] == file]) / len(ids)
        mean = sum(slowest[i] for i in candidates) / max(len(candidates), 1)
        count = min(len(candidates), max(1, int(share / max(mean, 0.05))))
        stride = max(1, len(candidates) // count) if count else 1
        picked += candidates[::stride][:count]
    return picked


def slice_ids(tests: Path, work: Path, slice_name: str) -> list[str]:
    """The ids of a slice: the full one collected from thunder's files, the bounded one from its list."""
    if slice_name == "full":
        return [i for i in collect(tests, work, list(FULL_FILES)) if in_full_slice(i)]
    return [line for line in BOUNDED_IDS.read_text().splitlines() if line.strip() and not line.startswith("#")]


def stored_stock(record: Path, ids: list[str]) -> dict[str, dict]:
    """Stock outcomes of ``ids`` from a stored record; every id must be in it (a test the record lacks, e.g. after
    a thunder upgrade, would be compared with nothing: the record is regenerated instead)."""
    found, _ = read_records(record)
    missing = [i for i in ids if i not in found]
    if missing:
        raise SystemExit(
            f"{len(missing)} tests of the slice are not in the stored stock record {record} (first: {missing[0]}): "
            "regenerate it (see this script's docstring)"
        )
    return {i: found[i] for i in ids}


def run(slice_name: str, modes: list[str], timeout: float, work: Path,
        stock_record: Path | None = None) -> tuple[dict, list[Comparison], float]:  # fmt: skip
    """Run the slice in ``modes`` (and stock, unless its outcomes come from ``stock_record``) and compare."""
    tests = thunder_tests_dir()
    work.mkdir(parents=True, exist_ok=True)
    for log in work.glob("*.log"):
        log.unlink()
    started = time.monotonic()
    ids = slice_ids(tests, work, slice_name)
    if stock_record is not None:
        results = {"stock": stored_stock(stock_record, ids)}
    else:
        results = {"stock": run_mode(tests, work, "stock", ids, timeout)}
    results.update({mode: run_mode(tests, work, mode, ids, timeout) for mode in modes})
    comparisons = [compare(results["stock"], results[mode], mode) for mode in modes]
    wall = time.monotonic() - started
    (work / "results.json").write_text(json.dumps({"slice": slice_name, "wall": wall, "results": results}, indent=1))
    return results, comparisons, wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slice", choices=("bounded", "full"), default=os.environ.get("THUNDER_SUITE", "bounded"))
    parser.add_argument("--modes", default="patches,discover", help="compared with stock (comma-separated)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one test may take")
    parser.add_argument("--work", type=Path, default=None, help="where logs and results go (default: a temp dir)")
    parser.add_argument("--write-docs", action="store_true", help=f"write {DOCUMENT.relative_to(ROOT)}")
    parser.add_argument(
        "--stock-record", type=Path, default=None,
        help=f"stock outcomes from this record instead of a stock run (the default CI run: {STOCK_RECORD.name})",
    )  # fmt: skip
    parser.add_argument("--from-results", type=Path, default=None, help="report a finished run's results.json")
    parser.add_argument("--records", type=Path, nargs="+", default=None, help="report the record files in DIRS")
    parser.add_argument(
        "--run-mode", choices=MODES, default=None,
        help="run only this mode of the slice into --work (no report): one process per mode, then --records",
    )  # fmt: skip
    parser.add_argument(
        "--pick-bounded", type=float, default=None, metavar="SECONDS",
        help=f"with --from-results of a full run: write {BOUNDED_IDS.name}, a sample taking about SECONDS per mode",
    )  # fmt: skip
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in MODES[1:] for m in modes):
        parser.error(f"--modes takes {', '.join(MODES[1:])}")
    if args.run_mode is not None:  # one mode alone, e.g. the three in parallel processes
        if args.work is None:
            parser.error("--run-mode needs --work")
        args.work.mkdir(parents=True, exist_ok=True)
        tests = thunder_tests_dir()
        ids = slice_ids(tests, args.work, args.slice)
        outcomes = run_mode(tests, args.work, args.run_mode, ids, args.timeout)
        print(
            f"{args.run_mode}: "
            + ", ".join(f"{n} {k}" for k, n in Counter(r["outcome"] for r in outcomes.values()).most_common())
        )
        return 0
    if args.records:  # modes run separately
        if args.stock_record is not None:  # stock from the stored record, over the first directory's slice
            selected = [i for i in (args.records[0] / "select.txt").read_text().splitlines() if i]
            results = {"stock": stored_stock(args.stock_record, selected), **from_records(args.records, tuple(modes))}
        else:
            results = from_records(args.records, ("stock", *modes))
        slice_size = len(results["stock"])
        in_slice = Counter(i.split("::", 1)[0] for i in results["stock"])
        finished = [i for i in results["stock"] if all(r[i]["outcome"] != "not run" for r in results.values())]
        results = {mode: {i: outcomes[i] for i in finished} for mode, outcomes in results.items()}
        comparisons = [compare(results["stock"], results[mode], mode) for mode in results if mode != "stock"]
        seconds = {m: sum(r.get("seconds") or 0.0 for r in outcomes.values()) for m, outcomes in results.items()}
        timing = "time in tests, per mode (run separately): " + ", ".join(
            f"{m} {t / 60:.0f} min" for m, t in seconds.items()
        )
        if len(finished) < slice_size:
            timing += f"; **partial**: the {len(finished)} of the slice's {slice_size} tests that had run in every mode"
            run_so_far = Counter(i.split("::", 1)[0] for i in finished)
            timing += (
                " (files not complete: "
                + ", ".join(
                    f"{file} {run_so_far[file]} of {n}" for file, n in sorted(in_slice.items()) if run_so_far[file] < n
                )
                + ")"
            )
        work = args.records[0]
    elif args.from_results is not None:  # the report (and document) of a finished run
        saved = json.loads(args.from_results.read_text())
        results, args.slice = saved["results"], saved["slice"]
        timing = f"all modes together took {saved['wall'] / 60:.0f} min"
        comparisons = [compare(results["stock"], results[mode], mode) for mode in results if mode != "stock"]
        work = args.from_results.parent
    else:
        work = args.work or Path(tempfile.mkdtemp(prefix=f"thunder_suite_{args.slice}_"))
        results, comparisons, wall = run(args.slice, modes, args.timeout, work, args.stock_record)
        timing = f"all modes together took {wall / 60:.0f} min"
        if args.stock_record is not None:
            timing = f"{', '.join(modes)} took {wall / 60:.0f} min (stock: the stored record {args.stock_record.name})"
    if args.pick_bounded is not None:
        picked = pick_bounded(results, args.pick_bounded)
        header = f"# scripts/thunder_suite.py --from-results FULL_RESULTS --pick-bounded {args.pick_bounded:g}\n"
        BOUNDED_IDS.write_text(header + "".join(i + "\n" for i in picked))
        print(f"wrote {BOUNDED_IDS} ({len(picked)} tests)")
    print(report(results, comparisons))
    print(f"{timing}; logs and results in {work}")
    if args.write_docs:
        generated_by = f"python scripts/thunder_suite.py --slice {args.slice} --write-docs"
        if args.records:
            generated_by = (
                f"python scripts/thunder_suite.py --slice {args.slice} --run-mode MODE --work W/MODE` for each mode, "
                f"then `python scripts/thunder_suite.py --slice {args.slice} --records W/... --write-docs"
            )
            if args.stock_record is not None:
                generated_by = (
                    f"python scripts/thunder_suite.py --slice {args.slice} --run-mode discover --work W`, then "
                    f"`python scripts/thunder_suite.py --slice {args.slice} --modes {','.join(modes)} --records W "
                    f"--stock-record scripts/{args.stock_record.name} --write-docs"
                )
        DOCUMENT.write_text(markdown(results, comparisons, args.slice, timing, generated_by))
        print(f"wrote {DOCUMENT}")
    return 1 if any(c.regressions for c in comparisons) else 0


if __name__ == "__main__":
    sys.exit(main())
