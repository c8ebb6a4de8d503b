"""Float8 training step time on CPU: eager, torch.compile, thunderfx and thunderplug.

Prints, from one run, one markdown table per run: for each model and variant the median time of a
training step (forward + backward + SGD step, ``mse_loss`` against a random target), its ratio to
eager fp8, the first step's time (includes compilation), peak RSS growth, bytes saved for backward
and the first step's loss (which must agree across the fp8 variants).

    python benchmarks/float8_training.py [--steps 25] [--warmup 3] [--models small,large]
                                         [--variants fp32-eager,fp8-eager,...] [--threads N]
                                         [--quick] [--json] [--interleaved fp8-eager,fp8-aot-eager,...]

Models: small = ``Linear(256,512)-ReLU-Linear(512,256)``, batch 64;
        large = ``Linear(1024,4096)-GELU-Linear(4096,1024)``, batch 256.
Variants (fp8 = ``torchao.float8.convert_to_float8_training(model)``, default tensorwise config):
    fp32-eager, fp8-eager, fp8-inductor (``torch.compile``), fp8-aot-eager
    (``torch.compile(backend="aot_eager")``), fp8-thunderfx
    (``torch.compile(backend=thunder.dynamo.ThunderCompiler())``), fp8-thunderplug
    (``thunder.jit(model, executors=thunderplug.discover())``).

Every (model, variant) cell runs in its own subprocess (``--worker``), because fp8 + inductor
SIGSEGVs on CPU in torch 2.9.1 (a float8 tile store in the backward kernel, fixed upstream by
pytorch/pytorch#167451); a crash or an exception is reported in its cell and the run goes on.
Each subprocess gets a fresh, empty ``TORCHINDUCTOR_CACHE_DIR`` so that first-step times include
real compilation. Only the model is compiled; loss and optimizer step run eagerly.

Measurements, per subprocess:
  * step ms: median of ``--steps`` timed steps after the first step and ``--warmup`` more;
  * first step s: wall time of the first step (tracing/compilation + one step);
  * peak RSS growth: ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` after the last timed step minus
    before the first step (model, optimizer and data already built; includes the compiler's own
    memory). torch 2.9.1 has no CPU allocator statistics;
  * saved for bwd: one extra forward under ``torch.autograd.graph.saved_tensors_hooks`` after the
    timed steps, summing the bytes of every distinct storage packed for backward (tensor subclasses
    such as ``Float8TrainingTensor`` are flattened into their inner tensors); "act" leaves out
    storages that belong to the model's parameters.

``--interleaved V1,V2,...`` adds, per model, one more subprocess holding those variants (each with
its own copy of the same model and optimizer): after each variant's first step and ``--warmup``
rounds, ``--steps`` rounds in which every variant takes one step, in a rotating order, so that the
machine's load hits all variants alike. Its table gives each variant's median and its ratio to fp8
eager and to aot_eager of the same run: the ratios to quote on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fresh_process  # noqa: E402

MODELS = {
    # name: (in, hidden, out, activation, batch)
    "small": (256, 512, 256, "relu", 64),
    "large": (1024, 4096, 1024, "gelu", 256),
}
VARIANTS = ["fp32-eager", "fp8-eager", "fp8-inductor", "fp8-aot-eager", "fp8-thunderfx", "fp8-thunderplug"]
LABELS = {
    "fp32-eager": "fp32 eager",
    "fp8-eager": "fp8 eager (torchao)",
    "fp8-inductor": "fp8 torch.compile (inductor)",
    "fp8-aot-eager": 'fp8 torch.compile(backend="aot_eager")',
    "fp8-thunderfx": "fp8 thunderfx",
    "fp8-thunderplug": "fp8 thunder.jit(executors=discover())",
}
MIB = 1024 * 1024


# ----------------------------------------------------------------------------------------------
# worker: one (model, variant) in this process
# ----------------------------------------------------------------------------------------------


def build_model(name: str):
    import torch

    d_in, hidden, d_out, act, batch = MODELS[name]
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(d_in, hidden),
        torch.nn.ReLU() if act == "relu" else torch.nn.GELU(),
        torch.nn.Linear(hidden, d_out),
    )
    x = torch.randn(batch, d_in)
    target = torch.randn(batch, d_out)
    return model, x, target


def prepare(variant: str, model):
    """The module to train (compiled or not) and the parameters to optimize."""
    import torch

    if variant == "fp32-eager":
        return model, model
    from torchao.float8 import convert_to_float8_training

    fp8 = convert_to_float8_training(model)
    if variant == "fp8-eager":
        return fp8, fp8
    if variant == "fp8-inductor":
        return torch.compile(fp8), fp8
    if variant == "fp8-aot-eager":
        return torch.compile(fp8, backend="aot_eager"), fp8
    if variant == "fp8-thunderfx":
        from thunder.dynamo import ThunderCompiler

        return torch.compile(fp8, backend=ThunderCompiler()), fp8
    if variant == "fp8-thunderplug":
        import thunder

        import thunderplug

        return thunder.jit(fp8, executors=thunderplug.discover()), fp8
    raise ValueError(f"unknown variant {variant!r}")


def storages(t):
    """(data_ptr, nbytes) of the storages behind ``t``, flattening traceable wrapper subclasses."""
    import torch

    if hasattr(t, "__tensor_flatten__") and type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        names, _ = t.__tensor_flatten__()
        out = []
        for n in names:
            out.extend(storages(getattr(t, n)))
        return out
    s = t.untyped_storage()
    return [(s.data_ptr(), s.nbytes())]


def saved_for_backward(module, x) -> tuple[int, int]:
    """Bytes of the distinct storages saved for backward by one forward: (all, non-parameter)."""
    import torch

    seen: dict[int, int] = {}

    def pack(t):
        for ptr, nbytes in storages(t):
            seen[ptr] = max(seen.get(ptr, 0), nbytes)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(x)
    del out
    params = {ptr for p in module.parameters() for ptr, _ in storages(p.detach())}
    total = sum(seen.values())
    return total, total - sum(n for ptr, n in seen.items() if ptr in params)


def worker(args) -> dict:
    import resource

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.backends.mkldnn.enabled = args.onednn
    model, x, target = build_model(args.model)
    module, params_of = prepare(args.variant, model)
    optimizer = torch.optim.SGD(params_of.parameters(), lr=1e-3)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(module(x), target)
        loss.backward()
        optimizer.step()
        return loss

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    first_loss = step().item()
    first_s = time.perf_counter() - start
    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    saved_all, saved_act = saved_for_backward(module, x)
    return {
        "model": args.model,
        "variant": args.variant,
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "first_s": first_s,
        "rss_growth_mib": (rss1 - rss0) / 1024,  # ru_maxrss is KiB on Linux
        "saved_mib": saved_all / MIB,
        "saved_act_mib": saved_act / MIB,
        "first_loss": first_loss,
        "threads": torch.get_num_threads(),
    }


def interleaved_worker(args) -> dict:
    """Step medians of several variants of one model, measured in rotating order in this process."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.backends.mkldnn.enabled = args.onednn
    steps = {}
    for variant in args.variant.split(","):
        model, x, target = build_model(args.model)
        module, params_of = prepare(variant, model)
        optimizer = torch.optim.SGD(params_of.parameters(), lr=1e-3)

        def step(module=module, optimizer=optimizer, x=x, target=target):
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(module(x), target).backward()
            optimizer.step()

        for _ in range(1 + args.warmup):
            step()
        steps[variant] = step
    times: dict[str, list[float]] = {variant: [] for variant in steps}
    order = list(steps)
    for round_ in range(args.steps):
        for variant in order[round_ % len(order):] + order[: round_ % len(order)]:
            start = time.perf_counter()
            steps[variant]()
            times[variant].append((time.perf_counter() - start) * 1e3)
    return {"model": args.model, "medians": {v: statistics.median(t) for v, t in times.items()}}


# ----------------------------------------------------------------------------------------------
# driver: every cell in its own subprocess, one table
# ----------------------------------------------------------------------------------------------


def run_cell(model: str, variant: str, args, worker: str = "--worker") -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), worker, "--model", model, "--variant", variant,
           "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.onednn:
        cmd.append("--onednn")
    outcome = fresh_process.run(cmd, args.timeout, "f8bench")
    if outcome.error is not None and args.verbose:
        sys.stderr.write(outcome.stderr[-4000:])
    return outcome.result(model=model, variant=variant)


def fmt(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def table(results: list[dict]) -> str:
    rows = [
        "| model | variant | step ms (median) | × fp8 eager | first step s (incl. compile) "
        "| peak RSS growth MiB (ru_maxrss) | saved for bwd MiB all / act | first-step loss |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        base = next((b for b in results if b["model"] == r["model"] and b["variant"] == "fp8-eager"), None)
        label = LABELS.get(r["variant"], r["variant"])
        if "error" in r:
            rows.append(f"| {r['model']} | {label} | {r['error']} | — | — | — | — | — |")
            continue
        ratio = r["median_ms"] / base["median_ms"] if base and "median_ms" in base else None
        rows.append(
            f"| {r['model']} | {label} | {r['median_ms']:.2f} | {fmt(ratio, '.2f')} | {r['first_s']:.2f} "
            f"| {r['rss_growth_mib']:.0f} | {r['saved_mib']:.2f} / {r['saved_act_mib']:.2f} "
            f"| {r['first_loss']:.7f} |"
        )
    return "\n".join(rows)


def interleaved_table(runs: list[dict]) -> str:
    rows = ["| model | variant | step ms (median, interleaved) | × fp8 eager | × aot_eager |",
            "|---|---|---:|---:|---:|"]
    for run in runs:
        if "error" in run:
            rows.append(f"| {run['model']} | {run['variant']} | {run['error']} | — | — |")
            continue
        medians = run["medians"]
        for variant, ms in medians.items():
            ratios = [fmt(ms / medians[b] if b in medians else None, ".2f") for b in ("fp8-eager", "fp8-aot-eager")]
            rows.append(f"| {run['model']} | {LABELS[variant]} | {ms:.2f} | {ratios[0]} | {ratios[1]} |")
    return "\n".join(rows)


def loss_check(results: list[dict]) -> list[str]:
    lines = []
    for model in dict.fromkeys(r["model"] for r in results):
        ran = [r for r in results if r["model"] == model and r["variant"].startswith("fp8") and "error" not in r]
        if not ran:
            continue
        losses = [r["first_loss"] for r in ran]
        ref = losses[0]
        spread = max(abs(v - ref) for v in losses) / abs(ref)
        verdict = "bit-identical" if len(set(losses)) == 1 else f"max rel. difference {spread:.1e}"
        lines.append(f"first-step loss, {model}, {len(ran)} fp8 variants that ran: {verdict} "
                     f"({', '.join(r['variant'] + '=' + repr(r['first_loss']) for r in ran)})")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=25, help="timed steps (default 25)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps after the first (default 3)")
    parser.add_argument("--models", default="small,large", help="comma-separated: small,large")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: " + ",".join(VARIANTS))
    parser.add_argument("--quick", action="store_true", help="smoke test: small model, 3 steps, 1 warm-up")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per cell (default 900)")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads in each cell (default: torch's)")
    parser.add_argument("--json", action="store_true", help="also print the results as one JSON line")
    parser.add_argument("--onednn", action="store_true",
                        help="leave oneDNN on (default off: on AMX CPUs torch 2.9.1 sends fp8 _scaled_mm to a oneDNN "
                             "kernel ~1000x slower than the emulated path, see benchmarks/gpt_float8.py)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show the stderr of failed cells")
    parser.add_argument("--interleaved", default="",
                        help="also time these variants interleaved in one process per model (comma-separated)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-interleaved", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return
    if args.worker_interleaved:
        print(json.dumps(interleaved_worker(args)), flush=True)
        return

    if args.quick:
        args.models, args.steps, args.warmup = "small", 3, 1
    models = [m for m in args.models.split(",") if m]
    variants = [v for v in args.variants.split(",") if v]
    interleaved = [v for v in args.interleaved.split(",") if v]
    for name, allowed, chosen in (("model", MODELS, models), ("variant", VARIANTS, variants + interleaved)):
        unknown = [c for c in chosen if c not in allowed]
        if unknown:
            parser.error(f"unknown {name}(s) {unknown}; choose from {list(allowed)}")

    import importlib.metadata as md

    versions = ", ".join(f"{d} {md.version(d)}" for d in ("torch", "lightning-thunder", "torchao"))
    command = "python benchmarks/float8_training.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    results = []
    for model in models:
        for variant in variants:
            print(f"... {model} / {variant}", file=sys.stderr, flush=True)
            results.append(run_cell(model, variant, args))

    runs = []
    for model in models if interleaved else []:
        print(f"... {model}: interleaved steps of {','.join(interleaved)}", file=sys.stderr, flush=True)
        runs.append(run_cell(model, ",".join(interleaved), args, worker="--worker-interleaved"))

    threads = next((r["threads"] for r in results if "threads" in r), "?")
    print(f"`{command}`\n")
    onednn = "on" if args.onednn else "off"
    print(
        f"{versions}; CPU, torch threads {threads}, oneDNN {onednn}; "
        f"{args.steps} timed steps after 1 + {args.warmup} warm-up; {time.strftime('%Y-%m-%d')}\n"
    )
    print(table(results))
    print()
    for line in loss_check(results):
        print(line)
    if runs:
        print(f"\nInterleaved steps ({args.steps} rounds in rotating order after 1 + {args.warmup} warm-up, "
              "one process per model):\n")
        print(interleaved_table(runs))
    if args.json:
        print(json.dumps(results + runs))


if __name__ == "__main__":
    main()
