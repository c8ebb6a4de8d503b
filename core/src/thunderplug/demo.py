"""``thunderplug demo``: train a small float8 MLP with ``discover()``, next to eager PyTorch."""

from __future__ import annotations

import copy
import time
from collections import Counter

import torch

_RULE = "-" * 78


def _section(title: str) -> None:
    print(f"\n{_RULE}\n{title}\n{_RULE}")


def _model() -> tuple[torch.nn.Module, str]:
    """Linear-GELU-Linear, converted to torchao float8 training when the float8 plugin's torchao is there."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    try:
        from torchao.float8 import convert_to_float8_training
    except ImportError:
        return model, "fp32 MLP (torchao not installed: no float8)"
    return convert_to_float8_training(model), "float8 MLP (torchao convert_to_float8_training, tensorwise)"


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, target: torch.Tensor) -> tuple[float, float]:
    start = time.perf_counter()
    loss = torch.nn.functional.mse_loss(model(x), target)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item(), time.perf_counter() - start


def _compact(trace) -> str:
    """Top-level lines of a trace, without comments: one line per operation."""
    lines = [line for line in str(trace).splitlines() if line.startswith("  ") and not line.lstrip().startswith(("#", "del "))]
    return "\n".join(lines)


def _subclass_lines(trace, limit: int = 14) -> str:
    """The lines of a trace (subsymbols included) that produce subclass-typed values or unroll them."""
    picked = []
    for line in str(trace).splitlines():
        text = line.strip().lstrip("# ")
        if "Tensor.torch." in text or "Tensor[" in text.split("#")[-1] or "_scaled_mm" in text:
            if "prims." not in text:
                picked.append("  " + (text if len(text) <= 150 else text[:147] + "..."))
    return "\n".join(picked[:limit] + ([f"  ... {len(picked) - limit} more"] if len(picked) > limit else []))


def _float8_tensors_example(executors: list) -> None:
    """The same float8 matmul written directly on Float8TrainingTensor values: subclass types in the trace."""
    try:
        from torchao.float8.float8_training_tensor import GemmInputRole, LinearMMConfig, hp_tensor_and_scale_to_float8
    except ImportError:
        return
    import thunder

    def float8_matmul(a, b):
        return torch.mm(a, b.t())

    scale = torch.tensor(8.0)
    a, b = (
        hp_tensor_and_scale_to_float8(torch.randn(*shape), scale, torch.float8_e4m3fn, LinearMMConfig(), role)
        for shape, role in (((16, 32), GemmInputRole.INPUT), ((8, 32), GemmInputRole.WEIGHT))
    )
    jitted = thunder.jit(float8_matmul, executors=executors)
    jitted(a, b)
    _section("Float8TrainingTensor inputs directly: torch.mm(a, b.t()), its initial trace")
    lines = str(thunder.last_traces(jitted)[0]).splitlines()
    print("\n".join(line for line in lines if line.startswith("  ") and "# /" not in line and "prims." not in line))


def run_demo(steps: int = 5, plot: str | None = None) -> int:
    import thunder

    import thunderplug
    from thunderplug.explain import explain
    from thunderplug.report import format_table

    _section("Plugins (thunderplug plugins)")
    executors = thunderplug.discover()
    print(format_table(thunderplug.report()))
    print("\nexecutors=discover():", [executor.name for executor in executors])

    torch.manual_seed(0)
    eager_model, description = _model()
    compiled_model = thunder.jit(copy.deepcopy(eager_model), executors=executors)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (eager_model, compiled_model)]
    batches = [(torch.randn(32, 64), torch.randn(32, 64)) for _ in range(steps)]

    _section(f"Training a {description}: {steps} SGD steps, eager vs thunder.jit(model, executors=discover())")
    print(f"{'step':>4}  {'eager loss':>12}  {'thunderplug loss':>16}  {'eager ms':>9}  {'thunderplug ms':>14}")
    eager_losses, compiled_losses = [], []
    for step, (x, target) in enumerate(batches):
        eager_loss, eager_s = _step(eager_model, optimizers[0], x, target)
        compiled_loss, compiled_s = _step(compiled_model, optimizers[1], x, target)
        eager_losses.append(eager_loss)
        compiled_losses.append(compiled_loss)
        note = "  (includes compilation)" if step == 0 else ""
        print(f"{step:>4}  {eager_loss:>12.6f}  {compiled_loss:>16.6f}  {eager_s * 1e3:>9.2f}  {compiled_s * 1e3:>14.2f}{note}", flush=True)

    rows = explain(compiled_model)
    _section("Subclass ops in the program and the executor that takes each (claims are asked first)")
    for row in rows:
        if row.trace == "program":
            print(f"  {row.op:<40} {row.executor}")
            for reason in row.declined:
                print(f"  {'':<40}   declined by {reason}")
    _section("Which executor runs which operation (final forward and backward traces)")
    for trace_name in ("forward", "backward"):
        counts = Counter(row.executor for row in rows if row.trace == trace_name)
        print(f"  {trace_name:<9}" + ", ".join(f"{executor}: {n}" for executor, n in counts.most_common()))
    _section("Initial trace: the float8 ops and their unrolled ATen ops")
    print(_subclass_lines(thunder.last_traces(compiled_model)[0]))
    _float8_tensors_example(executors)
    _section("Final forward trace (what runs: float8 casts and _scaled_mm as ATen ops, no subclass object)")
    print(_compact(thunder.last_traces(compiled_model)[-1]))

    max_relative = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(eager_losses, compiled_losses))
    weights_match = all(
        torch.allclose(p, q, atol=1e-4, rtol=1e-4) for p, q in zip(eager_model.parameters(), compiled_model.parameters())
    )
    _section("Agreement with eager PyTorch")
    print(f"max relative loss difference over {steps} steps: {max_relative:.2e}")
    print(f"parameters after training match eager (1e-4): {weights_match}")
    if plot:
        _plot(plot, eager_losses, compiled_losses)
    return 0 if max_relative < 1e-4 and weights_match else 1


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
