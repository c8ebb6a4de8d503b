"""Smoke test of benchmarks/float8_training.py: it runs and prints its table (no timing asserts)."""

import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torchao.float8")

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "float8_training.py"


def test_float8_training_quick_prints_a_table():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--threads", "1", "--variants", "fp32-eager,fp8-thunderplug"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("| model | variant |") for line in lines), proc.stdout
    rows = [line for line in lines if line.startswith("| small |")]
    assert len(rows) == 2, proc.stdout
