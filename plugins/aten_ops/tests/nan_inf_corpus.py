"""OpInfo samples with NaN, +inf, -inf and 0 injected into every floating input, run forward and
backward through thunder and compared with eager (``equal_nan``): the corpus behind
plugins/aten_ops/tests/test_nan_inf.py and docs/nan_inf.md.

Each case is one sample of one OpInfo (``op_db``, float32) on one path:

* ``torch``: the op as user code calls it (``torch.relu(x)``, ``F.hardtanh(x)``, ``x.clamp(lo, hi)``),
  i.e. thunder's torch-level symbols and their decompositions;
* ``aten``: its ``make_fx`` graph (``aten.hardtanh.default``...), i.e. the aten_ops plugin's ATen
  decompositions, what subclass programs and ``torch.ops.aten`` calls compile to.

Every floating input requires grad; an input's special values sit at different positions than
another input's, so binary ops see NaN against a number as well as NaN against NaN. Outcome:
``pass``, ``wrong`` (thunder ran and its values or gradients differ from eager's: silent),
``error`` (thunder raised where eager did not: loud), ``skip`` (eager raised, nothing floating,
untraceable, random or outside the ATen scope of opinfo_harness).

scripts/nan_inf.py runs it under three compilers and writes the counts to docs/nan_inf.md.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from opinfo_harness import NONDETERMINISTIC_PACKETS, in_scope, opinfo_id
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten, tree_unflatten

DTYPE = torch.float32
SPECIALS = (float("nan"), float("inf"), float("-inf"), 0.0)
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
PATHS = ("torch", "aten")
#: the environment variable that widens the corpus from CURATED to every float32 OpInfo
FULL_FLAG = "THUNDERPLUG_NAN_CORPUS_FULL"

#: OpInfos whose thunder or thunderplug decomposition can treat NaN / inf / 0 differently from eager
CURATED = (
    "nn.functional.relu",
    "nn.functional.prelu",
    "nn.functional.relu6",
    "nn.functional.hardtanh",
    "clamp",
    "clamp_min",
    "clamp_max",
    "nn.functional.threshold",
    "nn.functional.leaky_relu",
    "nn.functional.elu",
    "nn.functional.celu",
    "nn.functional.selu",
    "nn.functional.silu",
    "nn.functional.mish",
    "nn.functional.softplus",
    "nn.functional.hardswish",
    "nn.functional.hardsigmoid",
    "nn.functional.logsigmoid",
    "nn.functional.hardshrink",
    "nn.functional.softshrink",
    "nn.functional.tanhshrink",
    "nn.functional.gelu",
    "tanh",
    "sigmoid",
    "maximum",
    "minimum",
    "fmax",
    "fmin",
    "max.reduction_no_dim",
    "max.reduction_with_dim",
    "max.binary",
    "min.reduction_no_dim",
    "min.reduction_with_dim",
    "min.binary",
    "amax",
    "amin",
    "where",
    "masked_fill",
    "softmax",
    "log_softmax",
    "logsumexp",
    "abs",
    "sign",
    "sgn",
    "pow",
    "square",
    "rsqrt",
    "sqrt",
    "exp",
    "log",
    "nan_to_num",
    "nn.functional.normalize",
    "norm",
    "linalg.vector_norm",
)
#: samples per OpInfo in the default run (the full run takes them all)
DEFAULT_SAMPLES = 2


@dataclass(frozen=True)
class Outcome:
    op_id: str
    sample: int
    path: str
    status: str  # pass | wrong | error | skip
    detail: str = ""


def _error(exc: BaseException) -> str:
    lines = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return lines[0][:240] if lines else type(exc).__name__


def opinfos(full: bool | None = None) -> list:
    """The OpInfos of the run: CURATED, or (``full``, default from :data:`FULL_FLAG`) every one
    with a CPU float32 sample."""
    full = os.environ.get(FULL_FLAG) == "1" if full is None else full
    if full:
        return [op for op in op_db if DTYPE in op.supported_dtypes("cpu")]
    by_id = {opinfo_id(op): op for op in op_db}
    missing = [name for name in CURATED if name not in by_id]
    assert not missing, f"not OpInfo ids of this torch: {missing}"
    return [by_id[name] for name in CURATED]


def cases(full: bool | None = None) -> list[tuple[str, int, str]]:
    """``(op_id, sample index, path)`` of every case of the run."""
    full = os.environ.get(FULL_FLAG) == "1" if full is None else full
    found = []
    for op in opinfos(full):
        count = sum(1 for _ in op.sample_inputs("cpu", DTYPE, requires_grad=False))
        for index in range(count if full else min(count, DEFAULT_SAMPLES)):
            found.extend((opinfo_id(op), index, path) for path in PATHS)
    return found


def inject(t: torch.Tensor, k: int) -> torch.Tensor:
    """``t`` with :data:`SPECIALS` written at positions that depend on ``k`` (the input's index);
    where positions coincide (small tensors) the earlier special wins: a 1-element input is NaN."""
    t = t.detach().clone()
    if not t.is_floating_point() or t.numel() == 0:
        return t
    flat = t.view(-1) if t.is_contiguous() else t.reshape(-1)
    for j, value in reversed(list(enumerate(SPECIALS))):
        flat[(2 * k + 3 * j) % t.numel()] = value
    return flat.view(t.shape) if t.is_contiguous() else flat.reshape(t.shape)


@functools.cache
def _op(op_id: str):
    return next(op for op in op_db if opinfo_id(op) == op_id)


def _sample(op, index: int):
    for i, sample in enumerate(op.sample_inputs("cpu", DTYPE, requires_grad=False)):
        if i == index:
            return sample
    return None


def _fresh(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]


def _compare(actual, expected) -> None:
    flat_a, flat_e = tree_flatten(actual)[0], tree_flatten(expected)[0]
    assert len(flat_a) == len(flat_e), f"{len(flat_a)} outputs, eager has {len(flat_e)}"
    for i, (a, e) in enumerate(zip(flat_a, flat_e)):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(a, e, equal_nan=True, msg=lambda m, i=i: f"output {i}: {m}", **TOLERANCE)
        else:
            assert a == e or (a != a and e != e), f"output {i}: {a} != {e}"


def _grads(outputs, inputs, cotangents) -> list[torch.Tensor]:
    """Input gradients for the cotangents of the outputs that require grad (zeros for the rest:
    thunder marks outputs with an identically zero gradient as not requiring grad)."""
    wrt = [t for t in inputs if t.requires_grad]
    connected = [(o, c) for o, c in zip(outputs, cotangents) if o.requires_grad]
    found = [None] * len(wrt)
    if connected:
        found = list(torch.autograd.grad([o for o, _ in connected], wrt, [c for _, c in connected], allow_unused=True))
    return [torch.zeros_like(t) if g is None else g for t, g in zip(wrt, found)]


def run(op_id: str, index: int, path: str, jit: Callable[[Callable], Callable]) -> Outcome:
    """One case, compiled with ``jit`` (e.g. ``lambda f: thunder.jit(f, executors=...)``)."""
    op = _op(op_id)
    sample = _sample(op, index)
    if sample is None:
        return Outcome(op_id, index, path, "skip", f"no sample {index}")
    leaves, spec = tree_flatten([sample.input, *sample.args])
    positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    inputs = [inject(leaves[i], k) for k, i in enumerate(positions)]
    kwargs = sample.kwargs
    if not any(t.is_floating_point() for t in inputs):
        return Outcome(op_id, index, path, "skip", "no floating input")

    def fn(*tensors):
        full = list(leaves)
        for i, t in zip(positions, tensors):
            full[i] = t
        return op.op(*tree_unflatten(full, spec), **kwargs)

    program = fn
    if path == "aten":
        try:
            gm = make_fx(fn)(*[t.detach() for t in inputs])
        except Exception as exc:  # noqa: BLE001 - untraceable samples are out of scope
            return Outcome(op_id, index, path, "skip", f"make_fx: {_error(exc)}")
        overloads = {n.target for n in gm.graph.nodes if isinstance(n.target, torch._ops.OpOverload)}
        outside = sorted(str(o) for o in overloads if not in_scope(o))
        if outside:
            return Outcome(op_id, index, path, "skip", f"non-core {', '.join(outside)}")
        if any(o._opname in NONDETERMINISTIC_PACKETS for o in overloads):
            return Outcome(op_id, index, path, "skip", "random")
        program = gm.forward

    expected_inputs = _fresh(inputs)
    try:
        expected = fn(*expected_inputs)
    except Exception as exc:  # noqa: BLE001 - eager refuses this sample
        return Outcome(op_id, index, path, "skip", f"eager: {_error(exc)}")
    differentiable = [
        i
        for i, e in enumerate(tree_flatten(expected)[0])
        if isinstance(e, torch.Tensor) and e.requires_grad and e.dtype.is_floating_point
    ]
    generator = torch.Generator().manual_seed(0)
    flat_expected = tree_flatten(expected)[0]
    cotangents = [torch.randn(flat_expected[i].shape, generator=generator) for i in differentiable]
    try:
        expected_grads = _grads([flat_expected[i] for i in differentiable], expected_inputs, cotangents)
    except Exception:  # noqa: BLE001 - eager has no derivative here: forward only
        expected_grads = None

    actual_inputs = _fresh(inputs)
    try:
        actual = jit(program)(*actual_inputs)
        flat_actual = tree_flatten(actual)[0]
        actual_grads = None
        if expected_grads is not None:
            actual_grads = _grads([flat_actual[i] for i in differentiable], actual_inputs, cotangents)
    except Exception as exc:  # noqa: BLE001 - recorded as a loud failure
        return Outcome(op_id, index, path, "error", _error(exc))
    try:
        _compare(actual, expected)
    except AssertionError as exc:
        return Outcome(op_id, index, path, "wrong", f"forward: {_error(exc)}")
    if expected_grads is not None:
        try:
            _compare(actual_grads, expected_grads)
        except AssertionError as exc:
            return Outcome(op_id, index, path, "wrong", f"backward: {_error(exc)}")
    return Outcome(op_id, index, path, "pass")


# -- the compilers compared ------------------------------------------------------------------------


def compilers() -> dict[str, tuple[Callable[[Callable], Callable], tuple[str, ...]]]:
    """name -> (jit, the paths it runs): ``discover()``, ``discover()`` without the executor that
    fixes these ops (what thunderplug did before it), stock ``thunder.jit`` (torch path only:
    stock thunder has no ATen symbols)."""
    import thunder

    import thunderplug
    from thunderplug_aten_ops import backward_kernels

    plug = thunderplug.discover(quiet=True)
    before = thunderplug.discover(quiet=True, exclude=[backward_kernels.EXECUTOR_NAME])
    return {
        "discover()": (lambda f: thunder.jit(f, executors=plug), PATHS),
        "discover() without eager_backward_kernels": (lambda f: thunder.jit(f, executors=before), PATHS),
        "stock thunder.jit": (thunder.jit, ("torch",)),
    }
