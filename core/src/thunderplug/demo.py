"""``thunderplug demo``: compile and train a small model with ``discover()``, next to eager PyTorch."""

from __future__ import annotations

import copy
import time

import torch

_RULE = "-" * 78


def _section(title: str) -> None:
    print(f"\n{_RULE}\n{title}\n{_RULE}")


class TinyMLP(torch.nn.Module):
    """Linear-GELU-Linear whose hidden scaling goes through ATen overloads, as fx graphs would."""

    def __init__(self, width: int = 32, hidden: int = 64):
        super().__init__()
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.nn.functional.gelu(self.up(x))
        hidden = torch.ops.aten.mul.Tensor(hidden, torch.ops.aten.add.Tensor(hidden, 1.0))
        return self.down(hidden)


def _train(model: torch.nn.Module, batches: list, steps: int) -> tuple[list[float], list[float]]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses, times = [], []
    for step in range(steps):
        x, target = batches[step]
        start = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    return losses, times


def run_demo(steps: int = 5, plot: str | None = None) -> int:
    import thunder

    import thunderplug
    from thunderplug.report import format_table

    _section("Plugins (thunderplug plugins)")
    executors = thunderplug.discover()
    print(format_table(thunderplug.report()))
    print("\nexecutors=discover():", [executor.name for executor in executors])

    torch.manual_seed(0)
    eager_model = TinyMLP()
    compiled_model = thunder.jit(copy.deepcopy(eager_model), executors=executors)
    batches = [(torch.randn(16, 32), torch.randn(16, 32)) for _ in range(steps)]

    _section(f"Training {steps} steps: eager vs thunder.jit(model, executors=discover())")
    eager_losses, eager_times = _train(eager_model, batches, steps)
    compiled_losses, compiled_times = _train(compiled_model, batches, steps)
    print(f"{'step':>4}  {'eager loss':>12}  {'thunderplug loss':>16}  {'eager ms':>9}  {'thunderplug ms':>14}")
    for step in range(steps):
        print(
            f"{step:>4}  {eager_losses[step]:>12.6f}  {compiled_losses[step]:>16.6f}  "
            f"{eager_times[step] * 1e3:>9.2f}  {compiled_times[step] * 1e3:>14.2f}"
        )

    _section("Final forward trace (who executes what)")
    print(thunder.last_traces(compiled_model)[-1])
    _section("Final backward trace")
    print(thunder.last_backward_traces(compiled_model)[-1])

    max_diff = max(abs(a - b) for a, b in zip(eager_losses, compiled_losses))
    weights_match = all(
        torch.allclose(p, q, atol=1e-5, rtol=1e-4)
        for p, q in zip(eager_model.parameters(), compiled_model.parameters())
    )
    _section("Agreement with eager PyTorch")
    print(f"max |loss difference| over {steps} steps: {max_diff:.2e}")
    print(f"parameters after training match eager: {weights_match}")
    if plot:
        _plot(plot, eager_losses, compiled_losses)
    return 0 if max_diff < 1e-4 and weights_match else 1


def _plot(path: str, eager: list[float], compiled: list[float]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"--plot needs matplotlib (pip install matplotlib); {path} not written")
        return
    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.plot(eager, label="eager", marker="o")
    axes.plot(compiled, label="thunderplug", linestyle="--", marker="x")
    axes.set_xlabel("step")
    axes.set_ylabel("loss")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    print(f"loss curves written to {path}")
