"""``thunderplug demo``: train a small float8 MLP with ``discover()``, next to eager PyTorch.

Three runs from the same initial weights on the same fixed regression task (a frozen random
"teacher" MLP to imitate, so the loss has somewhere to fall): fp32 eager, float8 eager (torchao
``convert_to_float8_training``, tensorwise scaling) and that float8 model under
``thunder.jit(model, executors=discover())``. The float8 runs must agree; the fp32 run shows
what float8 costs in accuracy.
"""

from __future__ import annotations

import copy
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

_RULE = "-" * 78
RECIPE = "torchao float8 tensorwise"
MODEL = "MLP 64-128-64 (Linear, GELU, Linear)"


@dataclass
class Run:
    label: str
    model: Any  # a module, or thunder.jit of one
    losses: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)


def _section(title: str) -> None:
    print(f"\n{_RULE}\n{title}\n{_RULE}")


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))


def task(samples: int = 512, batch: int = 64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed minibatches of a learnable regression: imitate a frozen random MLP."""
    generator = torch.Generator().manual_seed(1234)
    teacher = _mlp()
    with torch.no_grad():
        for parameter in teacher.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
        x = torch.randn(samples, 64, generator=generator)
        y = teacher(x)
    return [(x[i : i + batch], y[i : i + batch]) for i in range(0, samples, batch)]


def _step(run: Run, optimizer: torch.optim.Optimizer, x: torch.Tensor, target: torch.Tensor) -> None:
    start = time.perf_counter()
    loss = torch.nn.functional.mse_loss(run.model(x), target)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    run.losses.append(loss.item())
    run.seconds.append(time.perf_counter() - start)


def _progress(done: int, total: int, runs: list[Run]) -> None:
    """A bar redrawn in place on a terminal; every tenth of the run as a line in a log."""
    width = 30
    filled = width * done // total
    losses = "  ".join(f"{run.label} {run.losses[-1]:.4f}" for run in runs)
    line = f"  [{'#' * filled}{'.' * (width - filled)}] step {done}/{total}  loss: {losses}"
    if sys.stderr.isatty():
        sys.stderr.write("\r" + line + ("\n" if done == total else ""))
    elif done == total or done % max(total // 10, 1) == 0:
        sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _compact(trace: object) -> str:
    """Top-level lines of a trace, without comments: one line per operation."""
    lines = [
        line
        for line in str(trace).splitlines()
        if line.startswith("  ") and not line.lstrip().startswith(("#", "del "))
    ]
    return "\n".join(lines)


def run_demo(steps: int = 60, plot: str | None = None, progress: bool = True) -> int:
    import thunder

    import thunderplug
    from thunderplug.explain import explain, format_summary
    from thunderplug.report import format_table

    try:
        from torchao.float8 import convert_to_float8_training
    except ImportError:
        print("the demo needs torchao (pip install ./plugins/float8)")
        return 1

    _section("Plugins (thunderplug plugins)")
    executors = thunderplug.discover(quiet=True)
    print(format_table(thunderplug.report()))
    print("\nexecutors=discover():", ", ".join(str(executor.name) for executor in executors))

    torch.manual_seed(0)
    fp32 = _mlp()
    runs = [
        Run("fp32 eager", fp32),
        Run("fp8 eager", convert_to_float8_training(copy.deepcopy(fp32))),
        Run("fp8 thunderplug", thunder.jit(convert_to_float8_training(copy.deepcopy(fp32)), executors=executors)),
    ]
    optimizers = [torch.optim.SGD(run.model.parameters(), lr=0.5, momentum=0.9) for run in runs]
    batches = task()

    _section(f"Training the {MODEL} ({RECIPE}) for {steps} SGD steps (momentum 0.9) on a fixed regression task")
    for step in range(steps):
        x, target = batches[step % len(batches)]
        for run, optimizer in zip(runs, optimizers, strict=True):
            _step(run, optimizer, x, target)
        if progress:
            _progress(step + 1, steps, runs)
    print(f"{'':<16} {'first loss':>11} {'last loss':>11} {'first step ms':>14} {'median step ms':>15}")
    for run in runs:
        median = sorted(run.seconds[1:] or run.seconds)[len(run.seconds[1:] or run.seconds) // 2]
        print(
            f"{run.label:<16} {run.losses[0]:>11.5f} {run.losses[-1]:>11.5f} {run.seconds[0] * 1e3:>14.1f} "
            f"{median * 1e3:>15.2f}"
        )
    print("(the first thunderplug step includes compilation)")

    compiled = runs[2].model
    _section("What was compiled (thunderplug explain's summary)")
    print(format_summary(explain(compiled)))
    _section("Final forward trace (what runs: float8 casts and _scaled_mm as ATen ops, no subclass object)")
    print(_compact(thunder.last_traces(compiled)[-1]))

    eager8, plug8 = runs[1], runs[2]
    max_relative = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(eager8.losses, plug8.losses, strict=True))
    weights_match = all(
        torch.allclose(p, q, atol=1e-4, rtol=1e-4)
        for p, q in zip(eager8.model.parameters(), plug8.model.parameters(), strict=True)
    )
    fell = all(run.losses[-1] < 0.5 * run.losses[0] for run in runs)
    _section("Agreement with eager PyTorch")
    print(f"fp8 thunderplug vs fp8 eager, max relative loss difference over {steps} steps: {max_relative:.2e}")
    print(f"parameters after training match fp8 eager (1e-4): {weights_match}")
    print(f"every run's loss fell below half its first value: {fell}")
    if plot:
        _plot(plot, runs)
    return 0 if max_relative < 1e-4 and weights_match and fell else 1


def _plot(path: str, runs: list[Run]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        print(f"--plot needs matplotlib (pip install matplotlib); {path} not written")
        return
    figure, (loss_axes, time_axes) = plt.subplots(1, 2, figsize=(11, 4))
    styles = {
        "fp32 eager": {"marker": "o"},
        "fp8 eager": {"marker": "s"},
        "fp8 thunderplug": {"linestyle": "--", "marker": "x"},
    }
    for run in runs:
        steps = range(1, len(run.losses) + 1)
        loss_axes.plot(steps, run.losses, label=run.label, markersize=3, **styles[run.label])
        time_axes.plot(steps, [s * 1e3 for s in run.seconds], label=run.label, markersize=3, **styles[run.label])
    loss_axes.set(xlabel="step", ylabel="MSE loss", yscale="log", title="training loss")
    time_axes.set(
        xlabel="step", ylabel="ms per step (log)", yscale="log", title="step time (step 1 includes compilation)"
    )
    for axes in (loss_axes, time_axes):
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.legend()
    figure.suptitle(f"{MODEL}, {RECIPE}: eager vs thunder.jit(executors=thunderplug.discover())")
    figure.tight_layout()
    figure.savefig(path)
    print(f"loss curves and step times written to {path}")
