"""The ``thunderplug`` command: help, version, plugins and explain, with snapshots of what users read.

Snapshots live in tests/snapshots/; after an intended change of the output, rewrite them with
``THUNDERPLUG_UPDATE_SNAPSHOTS=1 pytest tests/test_cli.py`` and review the diff.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from thunderplug.commands.cli import main

SNAPSHOTS = Path(__file__).parent / "snapshots"
ON_CPU = pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="snapshot recorded on CPU (thunder's defaults differ with CUDA)"
)


def assert_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if os.environ.get("THUNDERPLUG_UPDATE_SNAPSHOTS") == "1":
        path.write_text(text)
    assert path.exists(), f"no snapshot {path}; run with THUNDERPLUG_UPDATE_SNAPSHOTS=1"
    assert text == path.read_text()


def run_cli(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "COLUMNS": "100", **env}
    environ.pop("THUNDERPLUG_UPDATE_SNAPSHOTS", None)
    return subprocess.run(
        [sys.executable, "-m", "thunderplug", *args], capture_output=True, text=True, env=environ, cwd=cwd, check=False
    )


def test_help_is_plain_text_and_lists_every_command(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out and ":func:" not in out
    for command in ("plugins", "explain", "demo", "--version"):
        assert command in out
    assert_snapshot("help.txt", out)


def test_version(capsys):
    import thunderplug

    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out == f"thunderplug {thunderplug.__version__}\n"


def test_plugins_table_snapshot_and_no_thunder_import_warning():
    result = run_cli("plugins", THUNDERPLUG_PLUGINS="aten_ops,float8")
    assert result.returncode == 0, result.stderr
    assert "transformer_engine module not found" not in result.stderr
    table, _, order = result.stdout.rpartition("\ndiscover() returns, in this order: ")
    assert order.startswith(
        "thunderplug, thunderplug_broadcast_grads, float8, eager_backward_kernels, eager_kernels, aten"
    )
    assert_snapshot("plugins.txt", table + "\n")


@ON_CPU
def test_plugins_describes_each_executor_and_marks_thunders_own():
    result = run_cli("plugins", THUNDERPLUG_PLUGINS="aten_ops,float8")
    assert result.returncode == 0, result.stderr
    executors = result.stdout.rpartition("\ndiscover() returns, in this order: ")[2].split("\n", 2)[2]
    assert_snapshot("plugins_executors.txt", executors)
    lines = {line.split()[1]: line for line in executors.splitlines()[1:] if line.strip()}
    assert "thunderplug (built in)" in lines["thunderplug"] and "1000" in lines["thunderplug"]
    assert "plugin aten_ops" in lines["aten"] and "runs ATen symbols as the overloads themselves" in lines["aten"]
    for own in ("sdpa", "torchcompile_xentropy"):
        assert "thunder " in lines[own] and "one of thunder's own default executors" in lines[own]


def test_plugins_json_has_statuses_hooks_and_the_executor_order():
    result = run_cli("plugins", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    by_name = {r["name"]: r for r in report["plugins"]}
    assert by_name["aten_ops"]["executors"] == ["aten", "eager_kernels", "eager_backward_kernels"]
    assert by_name["aten_ops"]["module"] == "thunderplug_aten_ops.hooks"
    assert "register_aten_ops" in by_name["aten_ops"]["hooks"]
    assert by_name["thunderplug"]["builtin"] and by_name["thunderplug"]["status"] == "active"
    assert report["executors"][:2] == ["thunderplug", "thunderplug_broadcast_grads"]
    assert report["executors"][-1] != "torch"  # thunder appends its always-executors itself
    details = {d["name"]: d for d in report["executor_details"]}
    assert [d["name"] for d in report["executor_details"]] == report["executors"]
    assert details["aten"]["description"] and details["aten"]["provided_by"] == "plugin aten_ops"
    assert details["sdpa"]["provided_by"] == "thunder" and details["sdpa"]["priority"] is None


SCRIPT_THAT_EXITS = """
import sys
import torch, thunder, thunderplug
from torch.testing._internal.two_tensor import TwoTensor


def main():
    f = thunder.jit(lambda x: (x * 2).sin(), executors=thunderplug.discover())
    x = TwoTensor(torch.randn(3), torch.randn(3)).requires_grad_()
    f(x).sum().backward()
    return 3


if __name__ == "__main__":
    sys.exit(main())
"""


@ON_CPU
def test_explain_a_script_that_ends_in_sys_exit(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT_THAT_EXITS))
    result = run_cli("explain", "train.py", cwd=tmp_path, THUNDERPLUG_PLUGINS="aten_ops")
    assert result.returncode == 3, result.stderr
    assert_snapshot("explain_summary.txt", result.stdout)


def test_explain_a_script_that_raises_json(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text(
        "import torch, thunder, thunderplug\n"
        "f = thunder.jit(lambda x: x.cos() + 1, executors=thunderplug.discover())\n"
        "f(torch.randn(4))\n"
        "raise ValueError('the script failed after compiling')\n"
    )
    result = run_cli("explain", "--json", str(script))
    assert result.returncode == 1
    assert "ValueError: the script failed after compiling" in result.stderr  # the traceback, for the user
    assert "transformer_engine module not found" not in result.stderr
    report = json.loads(result.stdout)
    assert (report["exit_code"], report["error"]) == (1, "ValueError: the script failed after compiling")
    (function,) = report["functions"]
    assert {row["trace"] for row in function["rows"]} == {"forward"}
    assert sum(t["ops"] for t in function["summary"]) == len(function["rows"])


FALLBACK_SCRIPT = """
import torch, thunder, thunderplug
from torch.testing._internal.two_tensor import TwoTensor

f = thunder.jit(lambda x: (x * 2).sin(), executors=thunderplug.discover())
f(TwoTensor(torch.randn(3), torch.randn(3)).requires_grad_()).sum().backward()
"""


def test_explain_has_a_legend_and_counts_and_explains_fallback_ops(tmp_path):
    (tmp_path / "train.py").write_text(FALLBACK_SCRIPT)
    result = run_cli("explain", "train.py", cwd=tmp_path, THUNDERPLUG_PLUGINS="")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "ops: the trace's operations the executor runs; claimed:" in out and "fallback: of those" in out
    summary = [line.split() for line in out.splitlines() if line.startswith(("forward ", "backward "))]
    assert sum(int(cells[-2]) for cells in summary) > 0  # fallback column counts the fallback_aten_* ops
    assert "ran through the fallback" in out and "install thunderplug-aten (pip install ./plugins/aten_ops)" in out
    with_aten = run_cli("explain", "train.py", cwd=tmp_path, THUNDERPLUG_PLUGINS="aten_ops")
    assert "ran through the fallback" not in with_aten.stdout


def test_demo_trains_a_float8_gpt_like_eager_and_reports_step_time_spread(capsys):
    pytest.importorskip("torchao.float8")
    from thunderplug.commands.demo import run_demo

    assert run_demo(steps=6, progress=False) == 0
    out = capsys.readouterr().out
    assert "Training the GPT 2 layers" in out
    assert "first call s" in out and "step ms: median" in out and "(25%-75%)" in out
    assert "every run's loss fell below half its first value: True" in out
    assert "parameters after training match fp8 eager (1e-4): True" in out
    assert "max relative loss difference over 6 steps: 0.00e+00" in out


def test_demo_plot_without_matplotlib_fails_before_training(capsys, monkeypatch, tmp_path):
    from thunderplug.commands.demo import run_demo

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    assert run_demo(plot=str(tmp_path / "loss.png"), progress=False) == 2
    captured = capsys.readouterr()
    assert "--plot needs matplotlib: pip install matplotlib" in captured.err
    assert "Training" not in captured.out and not (tmp_path / "loss.png").exists()


def test_demo_plot_draws_losses_and_step_time_spread(tmp_path):
    pytest.importorskip("matplotlib")
    from thunderplug.commands.demo import Run, _plot

    labels = ("fp32 eager", "fp8 eager", "fp8 thunderplug")
    runs = [Run(label, None, [4.0, 2.0, 1.0], [3.0, 0.1, 0.2]) for label in labels]
    _plot(str(tmp_path / "demo.png"), runs)
    assert (tmp_path / "demo.png").stat().st_size > 0
