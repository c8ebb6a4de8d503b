"""``thunderplug demo``: train a small float8 GPT with ``discover()``, next to eager PyTorch.

What the project is for, in under a minute on a CPU: a torchao float8 model (``convert_to_float8_training``,
tensorwise scaling) that stock thunder cannot compile trains under
``thunder.jit(model, executors=discover())`` with the losses of eager float8. Three runs from the same
initial weights learn the same fixed batch of token sequences: fp32 eager, float8 eager and float8
under thunderplug. The float8 runs must agree; the fp32 run shows what float8 costs in accuracy.
Step times are reported as medians with their spread, the first call (which compiles) apart.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import statistics
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

_RULE = "-" * 78
RECIPE = "torchao float8 tensorwise"
LAYERS, D_MODEL, HEADS, SEQ, BATCH, VOCAB = 2, 64, 2, 32, 4, 128
MODEL = f"GPT {LAYERS} layers, d_model {D_MODEL}, {HEADS} heads, seq {SEQ}, batch {BATCH}, vocab {VOCAB}"


class _Block(nn.Module):
    """Pre-LayerNorm decoder block: causal self-attention (q/k/v/out Linears), GELU MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.q, self.k, self.v, self.out = (nn.Linear(D_MODEL, D_MODEL) for _ in range(4))
        self.fc, self.proj = nn.Linear(D_MODEL, 4 * D_MODEL), nn.Linear(4 * D_MODEL, D_MODEL)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.ln1(x)

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, HEADS, d // HEADS).transpose(1, 2)

        y = F.scaled_dot_product_attention(heads(self.q(h)), heads(self.k(h)), heads(self.v(h)), is_causal=True)
        x = x + self.out(y.transpose(1, 2).reshape(b, t, d))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """``forward(tokens, targets)``: the mean next-token cross-entropy."""

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, D_MODEL), nn.Embedding(SEQ, D_MODEL)
        self.blocks = nn.ModuleList(_Block() for _ in range(LAYERS))
        self.ln_f, self.head = nn.LayerNorm(D_MODEL), nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


@dataclass
class Run:
    label: str
    model: Any  # a module, or thunder.jit of one
    losses: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    @property
    def steady(self) -> list[float]:
        """Step times after the first call (which compiles, for thunderplug)."""
        return self.seconds[1:] or self.seconds


def _section(title: str) -> None:
    print(f"\n{_RULE}\n{title}\n{_RULE}")


def task() -> tuple[torch.Tensor, torch.Tensor]:
    """One fixed batch of random token sequences and their next tokens, to be learned by heart."""
    generator = torch.Generator().manual_seed(1234)
    sequence = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=generator)
    return sequence[:, :-1].contiguous(), sequence[:, 1:].contiguous()


def _step(run: Run, optimizer: torch.optim.Optimizer, tokens: torch.Tensor, targets: torch.Tensor) -> None:
    start = time.perf_counter()
    loss = run.model(tokens, targets)
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


@contextlib.contextmanager
def _without_onednn() -> Iterator[None]:
    """oneDNN's fp8 GEMM on CPUs with AMX takes seconds where torch's emulation takes milliseconds."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")  # said on every toggle
        with torch.backends.mkldnn.flags(enabled=False):
            yield


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    """25th, 50th and 75th percentiles (the median alone for fewer than two values)."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    low, median, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, median, high


def run_demo(steps: int = 15, plot: str | None = None, progress: bool = True) -> int:
    if plot and importlib.util.find_spec("matplotlib") is None:  # before minutes of training, not after
        print("--plot needs matplotlib: pip install matplotlib", file=sys.stderr)
        return 2
    try:
        from torchao.float8 import convert_to_float8_training
    except ImportError:
        print("the demo needs torchao (pip install ./plugins/float8)", file=sys.stderr)
        return 1
    import thunder

    import thunderplug
    from thunderplug.commands.explain import explain, format_summary
    from thunderplug.plugin_api.report import format_table

    _section("Plugins (thunderplug plugins)")
    executors = thunderplug.discover(quiet=True)
    print(format_table(thunderplug.report()))
    print("\nexecutors=discover():", ", ".join(str(executor.name) for executor in executors))

    torch.manual_seed(0)
    fp32 = GPT()
    runs = [
        Run("fp32 eager", fp32),
        Run("fp8 eager", convert_to_float8_training(copy.deepcopy(fp32))),
        Run("fp8 thunderplug", thunder.jit(convert_to_float8_training(copy.deepcopy(fp32)), executors=executors)),
    ]
    optimizers = [torch.optim.AdamW(run.model.parameters(), lr=1e-2) for run in runs]
    tokens, targets = task()

    _section(f"Training the {MODEL} ({RECIPE}) for {steps} AdamW steps on a fixed batch")
    with _without_onednn():
        for step in range(steps):
            for run, optimizer in zip(runs, optimizers, strict=True):
                _step(run, optimizer, tokens, targets)
            if progress:
                _progress(step + 1, steps, runs)
    columns = ("first loss", "last loss", "first call s", "step ms: median", "(25%-75%)")
    print(f"{'':<16} " + " ".join(f"{name:>{width}}" for name, width in zip(columns, (10, 10, 12, 16, 15))))
    for run in runs:
        low, median, high = _quartiles(run.steady)
        print(
            f"{run.label:<16} {run.losses[0]:>10.4f} {run.losses[-1]:>10.4f} {run.seconds[0]:>12.2f} "
            f"{median * 1e3:>16.1f} {f'({low * 1e3:.1f}-{high * 1e3:.1f})':>15}"
        )
    print("(the first call includes thunderplug's compilation; on a CPU, float8 matmuls are emulated)")

    compiled = runs[2].model
    _section("What was compiled (thunderplug explain's summary)")
    print(format_summary(explain(compiled)))

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
    """Losses (fp8 thunderplug drawn over fp8 eager) and median step times with their spread."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, (loss_axes, time_axes) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    styles = {
        "fp32 eager": {"color": "tab:gray", "linewidth": 1.5},
        "fp8 eager": {"color": "tab:blue", "linewidth": 4, "alpha": 0.4},
        "fp8 thunderplug": {"color": "tab:orange", "linestyle": "--", "marker": "x", "markersize": 4},
    }
    for run in runs:
        loss_axes.plot(range(1, len(run.losses) + 1), run.losses, label=run.label, **styles[run.label])
    loss_axes.set(xlabel="step", ylabel="cross-entropy (log)", yscale="log")
    loss_axes.set_title("training loss (fp8 thunderplug drawn on fp8 eager)")
    loss_axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    loss_axes.legend()
    positions = range(len(runs))
    for position, run in zip(positions, runs, strict=True):
        low, median, high = _quartiles(run.steady)
        color = styles[run.label]["color"]
        time_axes.bar(position, median * 1e3, color=color, alpha=0.8)
        time_axes.errorbar(position, median * 1e3, yerr=[[(median - low) * 1e3], [(high - median) * 1e3]], color="k")
        time_axes.annotate(
            f"first call {run.seconds[0]:.1f} s", (position, high * 1e3), ha="center", va="bottom", fontsize=8
        )
    time_axes.set_xticks(list(positions), [run.label for run in runs])
    time_axes.set(ylabel="ms per step", title="step time: median, 25%-75% (first call apart)")
    figure.suptitle(f"{MODEL}, {RECIPE}: eager vs thunder.jit(executors=thunderplug.discover())", fontsize=10)
    figure.tight_layout()
    figure.savefig(path)
    print(f"loss curves and step times written to {path}")
