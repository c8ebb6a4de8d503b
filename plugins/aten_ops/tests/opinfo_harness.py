"""OpInfo samples traced to ATen graphs with make_fx, run through thunder with the plugins, and
compared with eager: shared by test_opinfo.py and scripts/aten_coverage.py."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten, tree_unflatten

DTYPES = (torch.float32, torch.float64)
TOLERANCES = {torch.float32: {"rtol": 1e-4, "atol": 1e-4}, torch.float64: {"rtol": 1e-7, "atol": 1e-7}}

#: non-core overloads that subclass dispatch and fx graphs emit, registered on purpose
EXTRA_PACKETS = frozenset(
    "_scaled_mm _to_copy t view _unsafe_view detach alias clone copy_ empty_like fill reciprocal abs amax clamp "
    "transpose expand linear matmul".split()
)
#: graphs using these produce values that legitimately differ from eager: compare metadata only
NONDETERMINISTIC_PACKETS = frozenset(
    "rand randn randperm native_dropout empty empty_like empty_strided resize_".split()
)


def in_scope(overload: torch._ops.OpOverload) -> bool:
    return torch.Tag.core in overload.tags or overload._opname in EXTRA_PACKETS


def opinfo_id(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def opinfos() -> list:
    """OpInfos with a CPU float32 or float64 sample (one entry per name/variant)."""
    return [op for op in op_db if any(dtype in op.supported_dtypes("cpu") for dtype in DTYPES)]


@dataclass
class Case:
    """One sample of one OpInfo, traced and run in three stages; ``skip``/``*_error`` say why a
    stage did not pass (``None`` with the stage run: passed).

    * forward: inputs that do not require grad, outputs equal eager's;
    * requires_grad: every floating input requires grad, whether or not the op is differentiable:
      no error, outputs equal eager's, integer/bool outputs do not require grad;
    * backward: ``torch.autograd.grad`` of the differentiable outputs with a random cotangent,
      equal to eager's (where eager has a differentiable output).
    """

    op_id: str
    dtype: torch.dtype
    overloads: list = field(default_factory=list)
    skip: str | None = None  # out of scope or untraceable: not counted
    forward_error: str | None = None
    requires_grad_error: str | None = None
    backward_error: str | None = None
    has_requires_grad: bool = False
    has_backward: bool = False

    def errors(self) -> dict[str, str]:
        """Stage -> error, for the stages that failed."""
        found = {
            "forward": self.forward_error,
            "requires_grad": self.requires_grad_error,
            "backward": self.backward_error,
        }
        return {stage: error for stage, error in found.items() if error}


def _sample(op, dtype, index):
    samples = op.sample_inputs("cpu", dtype, requires_grad=False)
    for i, sample in enumerate(samples):
        if i == index:
            return sample
    return None


def _assert_close(actual, expected, dtype):
    flat_a, flat_e = tree_flatten(actual)[0], tree_flatten(expected)[0]
    assert len(flat_a) == len(flat_e), f"{len(flat_a)} outputs, eager has {len(flat_e)}"
    for a, e in zip(flat_a, flat_e):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(a, e, equal_nan=True, **TOLERANCES[dtype])
        else:
            assert a == e or (a != a and e != e), f"{a} != {e}"


def _assert_same_metadata(actual, expected):
    for a, e in zip(tree_flatten(actual)[0], tree_flatten(expected)[0]):
        if isinstance(e, torch.Tensor):
            assert (a.shape, a.dtype) == (e.shape, e.dtype), f"{(a.shape, a.dtype)} != {(e.shape, e.dtype)}"


def _error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _jit(fn):
    import thunder

    import thunderplug

    return thunder.jit(fn, executors=thunderplug.discover())


def _fresh(inputs, requires_grad):
    return [t.detach().clone().requires_grad_(requires_grad and t.is_floating_point()) for t in inputs]


@functools.cache
def run_case(op_id: str, dtype: torch.dtype, index: int = 0) -> Case:
    """Trace sample ``index`` of OpInfo ``op_id`` with make_fx, jit ``gm.forward`` with
    thunderplug.discover(), compare with eager in the three stages of :class:`Case`."""
    op = next(op for op in op_db if opinfo_id(op) == op_id)
    case = Case(op_id, dtype)
    if dtype not in op.supported_dtypes("cpu"):
        case.skip = f"{dtype} not supported"
        return case
    sample = _sample(op, dtype, index)
    if sample is None:
        case.skip = f"no sample {index}"
        return case
    leaves, spec = tree_flatten([sample.input, *sample.args])
    tensor_positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    kwargs = sample.kwargs

    def fn(*tensors):
        full = list(leaves)
        for i, t in zip(tensor_positions, tensors):
            full[i] = t
        args = tree_unflatten(full, spec)
        return op(*args, **kwargs)

    inputs = [leaves[i] for i in tensor_positions]
    try:
        gm = make_fx(fn)(*[t.detach() for t in inputs])
    except Exception as exc:  # noqa: BLE001 - untraceable samples are out of scope
        case.skip = f"make_fx: {_error(exc)}"
        return case
    overloads = sorted({n.target for n in gm.graph.nodes if isinstance(n.target, torch._ops.OpOverload)}, key=str)
    case.overloads = overloads
    outside = [str(o) for o in overloads if not in_scope(o)]
    if outside:
        case.skip = f"uses non-core {', '.join(outside)}"
        return case
    nondeterministic = any(o._opname in NONDETERMINISTIC_PACKETS for o in overloads)
    compare = _assert_same_metadata if nondeterministic else functools.partial(_assert_close, dtype=dtype)
    try:
        expected = fn(*_fresh(inputs, False))
    except Exception as exc:  # noqa: BLE001
        case.skip = f"eager: {_error(exc)}"
        return case
    try:
        compare(_jit(gm.forward)(*_fresh(inputs, False)), expected)
    except Exception as exc:  # noqa: BLE001 - recorded and asserted by the caller
        case.forward_error = _error(exc)

    if not any(t.is_floating_point() for t in inputs):
        return case
    expected_inputs, actual_inputs = _fresh(inputs, True), _fresh(inputs, True)
    try:
        expected = fn(*expected_inputs)
    except Exception:  # noqa: BLE001 - eager itself refuses inputs that require grad here
        return case
    case.has_requires_grad = True
    try:
        actual = _jit(gm.forward)(*actual_inputs)
        compare(actual, expected)
        for a in tree_flatten(actual)[0]:
            if isinstance(a, torch.Tensor) and not (a.is_floating_point() or a.is_complex()):
                assert not a.requires_grad, f"a {a.dtype} output requires grad"
    except Exception as exc:  # noqa: BLE001
        case.requires_grad_error = _error(exc)
        return case
    _check_backward(case, actual, expected, actual_inputs, expected_inputs, nondeterministic, dtype)
    return case


def _check_backward(case, actual, expected, actual_inputs, expected_inputs, nondeterministic, dtype):
    """Input gradients for one random cotangent per differentiable eager output, thunder vs eager."""
    differentiable = [
        (a, e)
        for a, e in zip(tree_flatten(actual)[0], tree_flatten(expected)[0])
        if isinstance(e, torch.Tensor) and e.requires_grad and e.dtype.is_floating_point
    ]
    wrt = [i for i, t in enumerate(expected_inputs) if t.requires_grad]
    if not differentiable or nondeterministic:
        return
    generator = torch.Generator().manual_seed(0)
    cotangents = [torch.randn(e.shape, dtype=e.dtype, generator=generator) for _, e in differentiable]
    try:
        expected_grads = torch.autograd.grad(
            [e for _, e in differentiable], [expected_inputs[i] for i in wrt], cotangents, allow_unused=True
        )
    except Exception:  # noqa: BLE001 - eager has no derivative for this sample
        return
    case.has_backward = True
    expected_grads = [torch.zeros_like(expected_inputs[i]) if g is None else g for i, g in zip(wrt, expected_grads)]
    try:
        # thunder marks outputs with an identically zero gradient (floor, sign...) as not requiring grad
        connected = [(a, c) for (a, _), c in zip(differentiable, cotangents) if a.requires_grad]
        actual_grads = [None] * len(wrt)
        if connected:
            actual_grads = torch.autograd.grad(
                [a for a, _ in connected], [actual_inputs[i] for i in wrt], [c for _, c in connected], allow_unused=True
            )
        actual_grads = [torch.zeros_like(actual_inputs[i]) if g is None else g for i, g in zip(wrt, actual_grads)]
        _assert_close(actual_grads, expected_grads, dtype)
    except Exception as exc:  # noqa: BLE001
        case.backward_error = _error(exc)
