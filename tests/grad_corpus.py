"""A seeded generator of small PyTorch programs, and a differential checker against eager.

Each program is Python source (so a failure is its own reproduction): 1-3 float inputs with
random shapes (0-dim and size-1 dims included; float32 or float64, sometimes mixed), built
contiguous, transposed or strided, then 2-6 ops drawn from elementwise, broadcasting, reduction,
indexing and view templates. Every op is tried eagerly while generating, so every program is valid
PyTorch with finite values. :func:`check` compares ``thunder.jit(program, executors=...)`` with
eager: the forward outputs, and the gradients of all inputs for a random cotangent.

Run directly for counts (``.venv/bin/python tests/grad_corpus.py --n 1000 --mode plug``).
"""

from __future__ import annotations

import argparse
import collections
import random
import re
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

# --- op templates ---------------------------------------------------------------------------
# ``{a}``/``{b}``/``{c}`` are operand expressions; templates are tried eagerly and dropped when
# they raise, so shape requirements need not be encoded here.

UNARY = [
    "{a}.sin()",
    "torch.cos({a})",
    "torch.tanh({a})",
    "torch.sigmoid({a})",
    "-{a}",
    "{a}.abs()",
    "{a} * 2.5",
    "1.5 - {a}",
    "{a}.pow(2)",
    "torch.square({a})",
    "torch.relu({a})",
    "torch.log1p({a}.abs())",
    "torch.sqrt({a}.abs() + 1.0)",
    "torch.clamp({a}, -0.5, 0.7)",
    "torch.nn.functional.gelu({a})",
    "torch.softmax({a}, -1)",
    "torch.exp(torch.tanh({a}))",
]

BINARY = [
    "{a} + {b}",
    "{a} - {b}",
    "{a} * {b}",
    "{a} / ({b}.abs() + 0.5)",
    "torch.add({a}, {b}, alpha=0.5)",
    "torch.maximum({a}, {b})",
    "torch.atan2({a}, {b}.abs() + 0.5)",
    "torch.where({a} > 0, {a}, {b})",
    "torch.where({b} > 0.2, {b}, {a})",
    "({a}.abs() + 0.5).pow({b})",
    "{a}.pow(2) * {b}",
    "torch.clamp({a}, min={b})",
    "torch.fmod({a}, {b}.abs() + 0.5)",
    "torch.addcmul({a}, {a}, {b}, value=0.5)",
    "torch.hypot({a}, {b})",
    "{a} * {b} + {b}",
]

TERNARY = [
    "torch.where({c} > 0, {a}, {b})",
    "torch.addcmul({a}, {b}, {c}, value=-0.5)",
    "{a} * {b} - {c}",
]

#: Expressions that turn an operand into a 0-dim tensor (the ones prims broadcast implicitly).
SCALAR = [
    "{a}.sum()",
    "{a}.mean()",
    "{a}.amax()",
    "{a}.amin()",
    "{a}.abs().amax()",
    "{a}.max()",
    "{a}.min()",
    "{a}.var(correction=0)",
    "torch.logsumexp({a}.flatten(), 0)",
    "{a}.flatten()[0]",
    "{a}.flatten()[-1]",
    "{a}.reshape(-1)[{i}]",
    "{a}.norm()",
    "{a}.prod()",
    "{a}.sum(0).sum()",
]

REDUCE = [
    "{a}.sum({d})",
    "{a}.sum({d}, keepdim=True)",
    "{a}.mean({d})",
    "{a}.mean({d}, keepdim=True)",
    "{a}.amax({d})",
    "{a}.amin({d}, keepdim=True)",
    "{a}.max({d})[0]",
    "{a}.var({d}, correction=0)",
    "torch.logsumexp({a}, {d})",
    "{a}.sum(({d}, -1))",
]

VIEW = [
    "{a}.t()",
    "{a}.mT",
    "{a}.transpose(0, -1)",
    "{a}.movedim(0, -1)",
    "{a}.reshape(-1)",
    "{a}.flatten()",
    "{a}.unsqueeze({d})",
    "{a}.unsqueeze(-1)",
    "{a}.squeeze()",
    "{a}.squeeze({d})",
    "{a}.expand(2, *{a}.shape)",
    "{a}.contiguous()",
    "{a}[0]",
    "{a}[-1]",
    "{a}[..., :1]",
    "{a}[1:]",
    "{a}[..., ::2]",
    "{a}[:, None]",
    "{a}[None]",
    "{a}.select({d}, 0)",
    "{a}.narrow({d}, 0, 1)",
    "{a}[torch.tensor([0, 0])]",
    "torch.cat([{a}, {a} * 2], {d})",
    "torch.stack([{a}, {a}.cos()])",
    "{a}.reshape(*{a}.shape, 1)",
]

#: Ops thunder 0.2.6 cannot differentiate at all, which ``discover()`` differentiates with eager's rules
#: (eager_backward_kernels; a lerp whose start is smaller than its result, once KI-6, with that start expanded
#: first, ``eager.tensor_api``): drawn rarely, so that most programs test something, but still drawn.
RARE = [
    "torch.minimum({a}, {b})",
    "torch.lerp({a}, {b}, 0.3)",
    "torch.lerp({a}, {b}, torch.sigmoid({c}))",
    "{a}.flip(0)",
]

KINDS = [("unary", UNARY, 1), ("binary", BINARY, 2), ("ternary", TERNARY, 3), ("reduce", REDUCE, 1), ("view", VIEW, 1)]
KINDS.append(("rare", RARE, 3))
KIND_WEIGHTS = [3, 6, 1, 2, 3, 0.25]


@dataclass
class InputSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    layout: str  # "contiguous" | "transposed" | "strided"


@dataclass
class Program:
    seed: int
    inputs: list[InputSpec]
    lines: list[str]
    outputs: list[str]
    ops: list[str] = field(default_factory=list)  # template of each line, for classification

    @property
    def source(self) -> str:
        args = ", ".join(spec.name for spec in self.inputs)
        body = "\n".join(self.lines + [f"return {', '.join(self.outputs)}"])
        return f"def program({args}):\n{textwrap.indent(body, '    ')}\n"

    def function(self) -> Callable[..., Any]:
        namespace: dict[str, Any] = {"torch": torch}
        exec(compile(self.source, f"<grad_corpus seed={self.seed}>", "exec"), namespace)  # noqa: S102
        return namespace["program"]

    def make_inputs(self) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed)
        return [_make_input(spec, gen) for spec in self.inputs]

    def reproduction(self) -> str:
        """Standalone code for docs/known-issues.md."""
        inputs = "\n".join(
            f"{spec.name} = torch.randn({spec.shape}, dtype={spec.dtype}, requires_grad=True)  # {spec.layout}"
            for spec in self.inputs
        )
        return f"{self.source}\n{inputs}"


def _make_input(spec: InputSpec, gen: torch.Generator) -> torch.Tensor:
    shape = spec.shape
    if spec.layout == "transposed" and len(shape) >= 2:
        base = torch.randn(tuple(reversed(shape)), generator=gen, dtype=spec.dtype)
        value = base.permute(*reversed(range(len(shape))))
    elif spec.layout == "strided" and len(shape) >= 1:
        base = torch.randn((*shape[:-1], shape[-1] * 2), generator=gen, dtype=spec.dtype)
        value = base[..., ::2]
    else:
        value = torch.randn(shape, generator=gen, dtype=spec.dtype)
    return value.detach().requires_grad_(True)


def _random_shape(rng: random.Random, base: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts against ``base``: 0-dim, a suffix of it, or it with 1s punched in."""
    roll = rng.random()
    if roll < 0.2:
        return ()
    start = rng.randrange(0, len(base) + 1) if roll < 0.5 else 0
    return tuple(1 if rng.random() < 0.2 else d for d in base[start:])


def generate(seed: int) -> Program:
    """The program for ``seed`` (deterministic)."""
    rng = random.Random(seed)
    while True:
        program = _try_generate(rng, seed)
        if program is not None:
            return program


def _try_generate(rng: random.Random, seed: int) -> Program | None:
    rank = rng.choice([0, 1, 1, 2, 2, 2, 3, 3])
    base = tuple(rng.choice([1, 2, 3, 4]) for _ in range(rank))
    dtype = rng.choice([torch.float32, torch.float64])
    inputs = []
    for i in range(rng.choice([1, 2, 2, 3])):
        shape = base if i == 0 else _random_shape(rng, base)
        input_dtype = dtype if rng.random() < 0.85 else rng.choice([torch.float32, torch.float64])
        layout = rng.choice(["contiguous", "contiguous", "transposed", "strided"])
        if (layout == "transposed" and len(shape) < 2) or not shape:
            layout = "contiguous"
        inputs.append(InputSpec("xyz"[i], shape, input_dtype, layout))
    program = Program(seed, inputs, [], [])
    env: dict[str, Any] = {"torch": torch}
    gen = torch.Generator().manual_seed(seed)
    for spec in inputs:
        env[spec.name] = _make_input(spec, gen)
    names = [spec.name for spec in inputs]

    steps = rng.randint(2, 6)
    attempts = 0
    while len(program.lines) < steps and attempts < 60:
        attempts += 1
        kind, templates, arity = rng.choices(KINDS, KIND_WEIGHTS)[0]
        template = rng.choice(templates)
        operands = []
        for position in range(arity):
            if position == 0 and rng.random() < 0.6:
                operand = names[-1]  # mostly chains, little dead code
            else:
                operand = rng.choice(names[-3:] if rng.random() < 0.7 else names)
            if arity > 1 and rng.random() < 0.35:  # a 0-dim tensor next to a bigger one
                operand = rng.choice(SCALAR).format(a=operand, i=rng.randrange(0, 4))
            operands.append(operand)
        if rng.random() < 0.3:
            rng.shuffle(operands)
        operands += [""] * (3 - arity)
        expr = template.format(a=operands[0], b=operands[1], c=operands[2], d=rng.randrange(-2, 3))
        name = f"v{len(program.lines)}"
        try:
            with torch.no_grad():
                value = eval(expr, env)  # noqa: S307 - our own generated expressions
        except Exception:  # noqa: BLE001 - invalid for these shapes: draw again
            continue
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.numel() == 0:
            continue
        if not torch.isfinite(value).all() or value.abs().max() > 1e4:
            continue
        env[name] = value
        names.append(name)
        program.lines.append(f"{name} = {expr}")
        program.ops.append(template)
    if len(program.lines) < 2:
        return None
    program.outputs = [names[-1]]
    if rng.random() < 0.2 and len(names) > len(inputs) + 1:
        program.outputs.append(names[-2])
    # The program must be differentiable w.r.t. at least one input, with finite values.
    try:
        outs = program.function()(*program.make_inputs())
    except Exception:  # noqa: BLE001
        return None
    outs = outs if isinstance(outs, tuple) else (outs,)
    if not any(o.requires_grad for o in outs) or not all(torch.isfinite(o).all() for o in outs):
        return None
    return program


# --- known upstream issues -------------------------------------------------------------------


@dataclass(frozen=True)
class KnownIssue:
    """A failure class documented in docs/known-issues.md (``key`` is its heading).

    A failing program is excused only if its source matches ``uses`` AND its outcome
    (``"<status>: <detail>"``) matches ``outcome``, so an unrelated wrong gradient in the same
    program is not hidden behind it.
    """

    key: str
    reason: str
    uses: str  # regex on the program source
    outcome: str  # regex on "<status>: <detail>"

    def explains(self, program: Program, outcome: Outcome) -> bool:
        return bool(re.search(self.uses, program.source)) and bool(
            re.search(self.outcome, f"{outcome.status}: {outcome.detail}")
        )


KNOWN_ISSUES: list[KnownIssue] = []


def known_issue(program: Program, outcome: Outcome) -> KnownIssue | None:
    """The documented upstream issue that explains this failure, if any."""
    return next((issue for issue in KNOWN_ISSUES if issue.explains(program, outcome)), None)


# --- checking -------------------------------------------------------------------------------


@dataclass
class Outcome:
    status: str  # "pass" | "wrong_forward" | "wrong_grad" | "error"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "pass"


def _tolerances(dtype: torch.dtype) -> tuple[float, float]:
    return (1e-4, 1e-4) if dtype == torch.float32 else (1e-7, 1e-7)


def _close(actual: torch.Tensor | None, expected: torch.Tensor | None, like: torch.Tensor) -> bool:
    actual = torch.zeros_like(like) if actual is None else actual
    expected = torch.zeros_like(like) if expected is None else expected
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return False
    rtol, atol = _tolerances(expected.dtype)
    scale = max(1.0, float(expected.abs().max())) if expected.numel() else 1.0
    return torch.allclose(actual, expected, rtol=rtol, atol=atol * scale, equal_nan=True)


def run(program: Program, jit: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Outcome:
    """Compare ``jit(program)`` with eager PyTorch on the forward and the input gradients."""
    fn = program.function()
    inputs = program.make_inputs()
    expected = fn(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    gen = torch.Generator().manual_seed(program.seed + 1)
    cotangents = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in expected]
    pairs = [(o, g) for o, g in zip(expected, cotangents) if o.requires_grad]
    expected_grads = torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True)

    jit_inputs = program.make_inputs()
    try:
        actual = jit(fn)(*jit_inputs)
        actual = actual if isinstance(actual, tuple) else (actual,)
        for a, e in zip(actual, expected):
            if not _close(a.detach(), e.detach(), e):
                dtype = f" dtype {a.dtype} (eager {e.dtype})" if a.dtype != e.dtype else ""
                return Outcome("wrong_forward", f"output {tuple(e.shape)}{dtype}")
        pairs = [(o, g) for o, g, e in zip(actual, cotangents, expected) if e.requires_grad]
        if not all(o.requires_grad for o, _ in pairs):
            return Outcome("wrong_grad", "output does not require grad")
        actual_grads = torch.autograd.grad([o for o, _ in pairs], jit_inputs, [g for _, g in pairs], allow_unused=True)
    except Exception as error:  # noqa: BLE001 - classified and reported
        return Outcome("error", f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}")
    for spec, inp, a, e in zip(program.inputs, inputs, actual_grads, expected_grads):
        if not _close(a, e, inp):
            nan = a is not None and e is not None and bool((a.isnan() & ~e.isnan()).any())
            return Outcome("wrong_grad", f"grad of {spec.name}" + (" (nan where eager is finite)" if nan else ""))
    return Outcome("pass")


def jit_with(mode: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``plug``: discover(); ``no_override``: discover() minus broadcast_grads; ``plain``: thunder.jit."""
    import thunder

    import thunderplug
    from thunderplug.eager.broadcast_grads import EXECUTOR_NAME

    if mode == "plain":
        return thunder.jit
    executors = thunderplug.discover(exclude=[EXECUTOR_NAME] if mode == "no_override" else [])
    return lambda fn: thunder.jit(fn, executors=executors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--mode", choices=["plug", "no_override", "plain"], default="plug")
    parser.add_argument("--show", type=int, default=5, help="print this many failing programs")
    args = parser.parse_args()
    jit = jit_with(args.mode)
    counts: collections.Counter[str] = collections.Counter()
    details: collections.Counter[str] = collections.Counter()
    shown = 0
    begin = time.perf_counter()
    for seed in range(args.start, args.start + args.n):
        program = generate(seed)
        outcome = run(program, jit)
        issue = None if outcome.ok else known_issue(program, outcome)
        counts["pass" if outcome.ok else ("known issue" if issue else "UNEXPLAINED")] += 1
        if not outcome.ok:
            details[issue.key if issue else f"{outcome.status}: {outcome.detail}"] += 1
            if issue is None and shown < args.show:
                shown += 1
                print(f"--- seed {seed}: {outcome.status} {outcome.detail}\n{program.reproduction()}")
    print(f"{args.mode}: {dict(counts)} in {time.perf_counter() - begin:.1f}s")
    for detail, count in details.most_common(20):
        print(f"  {count:5d}  {detail}")


if __name__ == "__main__":
    main()
