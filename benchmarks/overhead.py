"""What thunderplug costs programs that use no tensor subclass.

Prints, from one run:
  * import time of torch, thunder, and thunderplug + discover() on top (fresh subprocesses);
  * per-call cache-hit time of plain ``thunder.jit`` vs ``thunder.jit(executors=discover())``
    for ``x + 1`` and a tiny MLP forward+backward, and their ratio.

    python benchmarks/overhead.py [--repeat 2000]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

IMPORT_PROBE = """
import time
t0 = time.perf_counter(); import torch
t1 = time.perf_counter(); import thunder
t2 = time.perf_counter(); import thunderplug; thunderplug.discover()
t3 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2)
"""


def import_times(runs: int = 3) -> tuple[float, float, float]:
    samples = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", IMPORT_PROBE], capture_output=True, text=True, check=True)
        samples.append(tuple(float(v) for v in out.stdout.split()))
    return tuple(statistics.median(column) for column in zip(*samples))


def per_call_us(fns: list, args: tuple, repeat: int, batches: int = 7) -> list[float]:
    """Median microseconds per call of each function, timed in interleaved batches so that
    machine noise hits all of them alike."""
    for fn in fns:
        for _ in range(20):
            fn(*args)
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(batches):
        for fn, sample in zip(fns, samples):
            start = time.perf_counter()
            for _ in range(repeat):
                fn(*args)
            sample.append((time.perf_counter() - start) / repeat * 1e6)
    return [statistics.median(sample) for sample in samples]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()

    torch_s, thunder_s, plug_s = import_times()
    print(f"import torch: {torch_s:.2f} s   import thunder: {thunder_s:.2f} s   "
          f"import thunderplug + discover(): {plug_s:.2f} s (on top of thunder)")

    import thunder
    import torch

    import thunderplug

    executors = thunderplug.discover()
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    x = torch.randn(8, 16)

    def add_one(t):
        return t + 1

    def mlp_step(executors_or_none):
        model = thunder.jit(mlp, executors=executors_or_none)
        return lambda inp: model(inp).sum().backward()

    cases = [
        ("x + 1", lambda ex: thunder.jit(add_one, executors=ex), args.repeat),
        ("tiny MLP fwd+bwd", mlp_step, args.repeat // 4),
    ]
    print(f"\n{'program':<18} {'thunder.jit us':>15} {'discover() us':>14} {'ratio':>6}")
    for name, build, repeat in cases:
        plain, plugged = per_call_us([build(None), build(executors)], (x,), repeat)
        print(f"{name:<18} {plain:>15.1f} {plugged:>14.1f} {plugged / plain:>6.2f}")

if __name__ == "__main__":
    main()
