"""Smoke test of benchmarks/float8_training.py: it runs and prints its table (no timing asserts)."""

import importlib.util
import pathlib
import subprocess
import sys

import pytest
from benchmark_scripts import load

pytest.importorskip("torchao.float8")

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "float8_training.py"


def test_float8_training_quick_prints_a_table():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--threads", "1", "--variants", "fp32-eager,fp8-thunderplug",
         "--interleaved", "fp8-eager,fp8-thunderplug"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("| model | variant |") for line in lines), proc.stdout
    rows = [line for line in lines if line.startswith("| small |")]
    assert len(rows) == 4, proc.stdout  # two cells, then two interleaved variants
    assert rows[2].startswith("| small | fp8 eager (torchao) |") and rows[2].endswith("| 1.00 | — |"), proc.stdout


GPT_SCRIPT = SCRIPT.with_name("gpt_float8.py")


def test_gpt_float8_quick_prints_tables_and_writes_its_docs_section(tmp_path):
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\nkept text\n")
    proc = subprocess.run(
        [sys.executable, str(GPT_SCRIPT), "--quick", "--first-call", "fp8-thunderplug",
         "--variants", "fp8-eager,fp8-thunderplug", "--write-docs", "--docs", str(docs)],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| fp8 ")]
    assert [row.split(" | ")[0] for row in rows] == ["| fp8 thunder.jit(executors=discover())", "| fp8 eager (torchao)"]
    assert "FAIL" not in proc.stdout and "crash" not in proc.stdout, proc.stdout
    written = docs.read_text()
    assert written.startswith("# Benchmarks\n\nkept text\n") and rows[0] in written


def test_gpt_float8_docs_section_is_replaced_not_appended():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpt_float8_script", GPT_SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    once = script.replace_section("# Benchmarks\n\nbefore\n", "table 1")
    twice = script.replace_section(once + "\nafter\n", "table 2")
    assert twice.count(script.BEGIN) == 1 and "table 1" not in twice
    assert twice.index("before") < twice.index("table 2") < twice.index("after")


def test_compile_memory_prints_its_heap_and_rss_tables():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT.with_name("compile_memory.py")), "--layers", "1", "--variants", "fp8-thunderplug",
         "--rss-variants", "fp8-thunderplug,fp8-eager", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {}
    for line in proc.stdout.splitlines():
        if line.startswith("| "):
            label, *cells = (cell.strip() for cell in line.strip().strip("|").split("|"))
            rows[label] = cells
    for phase in ("interpretation", "autodiff (joint trace)", "claiming + fusion", "compilation, total"):
        assert phase in rows, proc.stdout
    held, peak = (float(v) for v in rows["compilation, total"][0].split(" / "))
    assert 0 < held <= peak, proc.stdout
    compiled, first_step = (float(v) for v in rows["fp8 thunder.jit(executors=discover())"])
    assert 0 < compiled < first_step, proc.stdout
    assert rows["fp8 eager (torchao)"][0] == "—" and float(rows["fp8 eager (torchao)"][1]) > 0, proc.stdout


COMPILE_TIME_SCRIPT = SCRIPT.with_name("compile_time.py")


def test_compile_time_quick_prints_its_tables_and_writes_its_docs_section(tmp_path):
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\nkept text\n")
    proc = subprocess.run(
        [sys.executable, str(COMPILE_TIME_SCRIPT), "--quick", "--variants", "eager,thunderplug-blocks",
         "--write-docs", "--docs", str(docs)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    label = "| thunder.jit(block, executors=discover()) on each block |"
    per_block = [line for line in lines if line.startswith(label)]
    assert len(per_block) == 4, proc.stdout  # by depth, the ratio table, then one row per depth
    assert all(row.endswith("| bit-identical (3 steps) |") for row in per_block[2:]), proc.stdout
    assert "FAIL" not in proc.stdout and "timeout" not in proc.stdout, proc.stdout
    written = docs.read_text()
    assert written.startswith("# Benchmarks\n\nkept text\n") and per_block[0] in written


def test_compile_time_pairs_each_round_with_the_targets_round():
    spec = importlib.util.spec_from_file_location("compile_time_under_test", COMPILE_TIME_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = {16: {"aot-eager-blocks": {"first_rounds": [2.0, 4.0, 2.2]},
                    "thunderplug": {"first_rounds": [1.8, 4.4, 2.2]}}}
    rows = module.paired_tables(results, [16], ["aot-eager-blocks", "thunderplug"])
    row = next(r for r in rows if r.startswith(f"| {module.LABELS['thunderplug']} |"))
    assert row.endswith("| 1.00 [0.90, 1.10] | 0.90 |"), row
    assert module.paired_tables({16: {"thunderplug": {"first_rounds": [1.0]}}}, [16], ["thunderplug"]) == []


REAL_MODELS_SCRIPT = SCRIPT.with_name("real_models.py")


def test_real_models_prints_its_table_and_writes_its_docs_section(tmp_path):
    pytest.importorskip("litgpt")
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\nkept text\n")
    proc = subprocess.run(
        [sys.executable, str(REAL_MODELS_SCRIPT), "--only", "litgpt_pythia", "--steps", "1", "--threads", "1",
         "--write-docs", "--docs", str(docs)],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| litgpt_pythia |")]
    assert len(rows) == 1 and rows[0].count("|") == 10 and "fails" not in rows[0], proc.stdout
    written = docs.read_text()
    assert written.startswith("# Benchmarks\n\nkept text\n") and rows[0] in written


GPU_SCRIPT = SCRIPT.with_name("gpu.py")


def test_gpu_benchmark_smoke_run_prints_its_tables_and_writes_its_docs_section(tmp_path):
    """benchmarks/gpu.py's CPU smoke run (tiny models, torch.compile with aot_eager): the same code the
    lent GPU runs, so that scripts/gpu_check.sh does not meet its first error there."""
    docs = tmp_path / "gpu.md"
    docs.write_text("# GPU checks\n\nkept text\n")
    proc = subprocess.run(
        [sys.executable, str(GPU_SCRIPT), "--smoke", "--models", "gpt",
         "--variants", "eager bf16,eager fp8,torch.compile fp8,discover() fp8",
         "--generate", "--generation-variants", "eager,discover()", "--write-docs", "--docs", str(docs)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in proc.stdout.splitlines() if line.startswith("| ")}
    assert "failed" not in proc.stdout, proc.stdout
    assert rows["discover() fp8"].endswith("| bit-identical |"), proc.stdout  # float8 on CPU: eager's losses
    assert rows["eager fp8"].endswith("| (reference) |")
    assert rows["discover()"].endswith("| equal |"), proc.stdout  # greedy tokens as eager's
    assert "discover() fp8 step / torch.compile fp8 step" in proc.stdout
    written = docs.read_text()
    assert written.startswith("# GPU checks\n\nkept text\n") and rows["discover() fp8"] in written


REVISIONS_SCRIPT = SCRIPT.with_name("revisions.py")


def test_revisions_exports_the_base_and_flags_changed_losses(tmp_path):
    """The before/after benchmark (issue 42, item 4): the base tree is the revision's sources, and a run whose
    losses differ from the base's says so rather than reporting a speed alone."""
    spec = importlib.util.spec_from_file_location("revisions_script", REVISIONS_SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    tree = script.export("HEAD", tmp_path)
    assert (tree / "core/src/thunderplug/__init__.py").is_file()
    assert not (tree / "tests").exists()
    args = script.argparse.Namespace(layers=1, rounds=1, steps=2, quick=True, variants=["fp32-thunderplug"],
                                     calls=False)
    run = {"first_s": [1.0], "step_ms": [10.0], "losses": [[2.0, 1.5]]}
    same = {"this checkout": {"fp32-thunderplug": run}, "HEAD": {"fp32-thunderplug": run}}
    assert script.table(same, "HEAD", args).splitlines()[-1].endswith("| 1.00 | 10.0 | 10.0 | 1.00 | yes |")
    moved = {**same, "this checkout": {"fp32-thunderplug": {**run, "losses": [[2.0, 1.25]]}}}
    assert script.table(moved, "HEAD", args).splitlines()[-1].endswith("| NO |")
    args.calls = True
    counted = {"this checkout": {"fp32-thunderplug": {**run, "python_calls": [1100]}},
               "HEAD": {"fp32-thunderplug": {**run, "python_calls": [1000]}}}
    assert script.table(counted, "HEAD", args).splitlines()[-1].endswith("| 1,000 | 1,100 | 1.10 | yes |")


def test_first_call_python_calls_are_counted_in_a_worker():
    """``revisions.py --calls``: a first-call worker with ``--count-calls`` reports the first step's Python calls."""
    spec = importlib.util.spec_from_file_location("gpt_float8_counting", GPT_SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    counted = script.run_worker("first", 1, script.parse(["--quick"]), ["--variant", "fp32-thunderplug",
                                                                        "--count-calls"])
    assert counted.get("python_calls", 0) > 10_000, counted


CUDA_PLAN_SCRIPT = SCRIPT.with_name("cuda_plan.py")


def test_cuda_plan_benchmark_smoke_run_prints_its_table_and_writes_its_docs_section(tmp_path):
    """benchmarks/cuda_plan.py (issue 43 item 3) on a tiny GPT: every variant's row, the targets, and the
    regions by aot_eager (ATen's kernels) giving eager's losses bit for bit, as discover() does."""
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\nkept text\n")
    proc = subprocess.run(
        [sys.executable, str(CUDA_PLAN_SCRIPT), "--smoke", "--write-docs", "--docs", str(docs)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in proc.stdout.splitlines() if line.startswith("| ")}
    assert rows["eager"].endswith("| (reference) |"), proc.stdout
    assert rows["discover()"].endswith("| bit-identical |"), proc.stdout
    assert rows["CUDA plan (aot_eager regions)"].endswith("| bit-identical |"), proc.stdout
    assert "torch.compile inductor" in rows and "CUDA plan (inductor regions)" in rows
    assert "CUDA plan (inductor) first call / torch.compile's (<= 0.7)" in proc.stdout
    written = docs.read_text()
    assert written.startswith("# Benchmarks\n\nkept text\n") and rows["discover()"] in written


DYNAMIC_SHAPES_SCRIPT = SCRIPT.with_name("dynamic_shapes.py")


def test_dynamic_shapes_quick_prints_its_table_and_writes_its_docs_section(tmp_path):
    """benchmarks/dynamic_shapes.py on the tiny GPT, 3 steps of varying lengths (batch 2: no partial batch), eager
    and discover() in their fresh workers: the table's rows, discover()'s losses bit-identical, two full compilations
    and one re-specialization for the three lengths."""
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\nkept text\n")
    proc = subprocess.run(
        [sys.executable, str(DYNAMIC_SHAPES_SCRIPT), "--quick", "--models", "gpt", "--variants", "eager,discover",
         "--steps", "3", "--no-generate", "--write-docs", "--docs", str(docs)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split(" | ")[0]: line for line in proc.stdout.splitlines() if line.startswith("| ")}
    assert rows["| losses equal to eager"].endswith("| (reference) | yes (bit-identical) |"), proc.stdout
    # symbolic sizes: the 2nd length compiles again with that dim symbolic, the 3rd re-specializes it
    assert rows["| full compilations"].endswith("| — | 2 |"), proc.stdout
    assert rows["| re-specializations"].endswith("| — | 1 |"), proc.stdout
    assert "FAIL" not in proc.stdout, proc.stdout
    written = docs.read_text()
    assert written.startswith("# Benchmarks\n\nkept text\n") and rows["| full compilations"] in written


def test_fresh_process_reports_the_workers_result_or_why_it_has_none():
    fresh_process = load("fresh_process")
    ok = fresh_process.run([sys.executable, "-c", "print('noise'); print('{\"x\": 1}')"], 60, "smoke")
    assert ok.result() == {"x": 1}
    raised = fresh_process.run([sys.executable, "-c", "raise ValueError('boom')"], 60, "smoke")
    assert raised.result(model="m") == {"model": "m", "error": "FAIL (rc 1) `ValueError: boom`"}
    crashed = fresh_process.run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"],
                                60, "smoke")
    assert crashed.error == "crash (SIGSEGV)"
    slow = fresh_process.run([sys.executable, "-c", "import time; time.sleep(30)"], 1, "smoke")
    assert slow.error == "timeout after 1 s"
