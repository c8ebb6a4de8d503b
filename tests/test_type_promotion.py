"""Result dtypes of elementwise ops mixing tensors with dimensions, 0-dim tensors and Python numbers
(docs/known-issues.md, once KI-8; patch "elementwise type promotion", ``thunderplug.eager.type_promotion``).

* thunder's promotion under ``discover()`` equals torch's (``torch._prims_common.elementwise_dtypes``, the
  reference's statement of ``torch.result_type``) for every pair of a dimensioned tensor, a 0-dim tensor or a
  number of twelve dtypes and four number types, and every triple of a subset, in every promotion kind;
* compiled programs give eager's result dtypes, values, trace metadata, gradients and gradient dtypes for a
  matrix of (shape, dtype) operands, with and without grad, including a flattened 0-dim tensor (KI-8);
* plain ``thunder.jit`` still departs from eager on them (so these tests cannot pass without the patch).
"""

from __future__ import annotations

import itertools

import pytest
import thunder
import torch
from thunder.core import devices, dtypes, utils
from thunder.core.proxies import TensorProxy
from thunder.core.trace import TraceCtx, tracectx
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as TORCH_KIND
from torch._prims_common import elementwise_dtypes

import thunderplug
from thunderplug.eager import type_promotion

KIND = utils.ELEMENTWISE_TYPE_PROMOTION_KIND
KINDS = [(getattr(TORCH_KIND, k.name), k) for k in KIND if k is not KIND.NUMBER_TO_INT and hasattr(TORCH_KIND, k.name)]
DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]
NUMBERS = [True, 2, 2.5, 1 + 1j]


@pytest.fixture(scope="module")
def executors():
    return thunderplug.discover()


def _as_torch(dtype) -> torch.dtype:
    if dtypes.is_numbertype(dtype):
        dtype = dtypes.numbertype_to_dtype(dtype)
    return dtypes.to_torch_dtype(dtypes.to_strong_dtype(dtype))


def _operands(combo):
    """(real arguments, proxies) for (kind, dtype-or-number) pairs: "d" a (2,) tensor, "z" a 0-dim one, "n" a
    number. The proxies are as thunder makes them for such inputs (0-dim ones weak)."""
    real, proxies = [], []
    for kind, value in combo:
        if kind == "n":
            real.append(value)
            proxies.append(value)
            continue
        shape = (2,) if kind == "d" else ()
        real.append(torch.ones(shape, dtype=value))
        proxies.append(TensorProxy(shape=shape, device=devices.cpu, dtype=dtypes.to_dtype(value)))
    return real, proxies


def _mismatches(combos, promotion) -> list:
    found = []
    with tracectx(TraceCtx()):
        for combo in combos:
            real, proxies = _operands(combo)
            for torch_kind, kind in KINDS:
                expected_computation, expected = elementwise_dtypes(*real, type_promotion_kind=torch_kind)
                computation, result = promotion(*proxies, type_promotion_kind=kind)
                # comparisons: thunder computes in the promoted dtype, torch in its computation dtype (same bools)
                if _as_torch(result) != expected or (
                    kind is not KIND.ALWAYS_BOOL and _as_torch(computation) != expected_computation
                ):
                    found.append((combo, kind.name, (expected_computation, expected), (computation, result)))
    return found


ITEMS = [("d", dt) for dt in DTYPES] + [("z", dt) for dt in DTYPES] + [("n", number) for number in NUMBERS]
PAIRS = [combo for combo in itertools.product(ITEMS, repeat=2) if any(kind != "n" for kind, _ in combo)]
TRIPLE_ITEMS = [item for item in ITEMS if item[1] in (torch.bool, torch.uint8, torch.int8, torch.int32,
                                                      torch.float16, torch.bfloat16, torch.float64, torch.complex64,
                                                      True, 2, 2.5, 1 + 1j)]
TRIPLES = [combo for combo in itertools.product(TRIPLE_ITEMS, repeat=3) if any(kind != "n" for kind, _ in combo)]


def _patched():
    thunders = getattr(utils.elementwise_type_promotion, "__wrapped__", utils.elementwise_type_promotion)
    return type_promotion.eager_elementwise_type_promotion(thunders, lambda: True)


def test_promotion_is_torchs_for_every_pair():
    assert _mismatches(PAIRS, _patched()) == []


def test_promotion_is_torchs_for_triples():
    assert _mismatches(TRIPLES, _patched()) == []


def test_thunders_own_promotion_still_differs():
    # thunder 0.2.6's lattice even with proxies as thunder makes them: bool + 2 is int8, uint8 with a 0-dim
    # int8 int16, 0-dim float64 with 0-dim complex64 complex64 (and any flag left on a tensor with dimensions)
    found = {(combo, kind) for combo, kind, *_ in _mismatches(PAIRS, utils.elementwise_type_promotion)}
    assert ((("d", torch.bool), ("n", 2)), "DEFAULT") in found
    assert ((("d", torch.uint8), ("z", torch.int8)), "DEFAULT") in found
    assert ((("z", torch.float64), ("z", torch.complex64)), "DEFAULT") in found


def test_only_discover_compilations_see_it(executors):
    # outside a discover() compilation (here: none at all) the patched function is thunder's
    assert utils.elementwise_type_promotion.__wrapped__ is not None
    with tracectx(TraceCtx()):
        _, proxies = _operands([("d", torch.bool), ("n", 2)])
        assert utils.elementwise_type_promotion(*proxies, type_promotion_kind=KIND.DEFAULT)[1] == dtypes.int8_


# --- compiled programs ---------------------------------------------------------------------------------------
# operand shapes: "dim" (3,), "one" (1,), "zero" 0-dim, "flat" a 0-dim input flattened inside the program (1,)
SHAPES = {"dim": (3,), "one": (1,), "zero": (), "flat": ()}
SHAPE_PAIRS = [("flat", "zero"), ("zero", "flat"), ("dim", "zero"), ("zero", "one"), ("zero", "zero"),
               ("flat", "flat")]
FLOAT_PAIRS = [(torch.float32, torch.float64), (torch.float64, torch.float32), (torch.float16, torch.float32),
               (torch.bfloat16, torch.float64), (torch.float16, torch.bfloat16)]


def _prepared(name: str, t: torch.Tensor) -> torch.Tensor:
    return t.flatten() if name == "flat" else t


def _binary(op, a_shape: str, b_shape: str):
    def program(a, b):
        return op(_prepared(a_shape, a).sin(), _prepared(b_shape, b))
    return program


OPS = {
    "mul": torch.mul,
    "add": lambda a, b: a + b,
    "sub_alpha": lambda a, b: torch.sub(b, a, alpha=2),
    "div": lambda a, b: a / (b.abs() + 1),
    "where": lambda a, b: torch.where(a > 0, a, b),
    "maximum": torch.maximum,
    "lerp": lambda a, b: torch.lerp(a, b.to(a.dtype) if a.dtype != b.dtype else b, 0.25),
    "addcmul": lambda a, b: torch.addcmul(a, a, b, value=0.5),
}


def _inputs(shapes, dts, requires_grad, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(SHAPES[s], generator=generator, dtype=torch.float64).to(dt).requires_grad_(requires_grad)
            for s, dt in zip(shapes, dts)]


def _compare(program, inputs, executors):
    expected = program(*inputs)
    jitted = thunder.jit(program, executors=executors)
    clones = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    actual = jitted(*clones)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected)
    (traced,) = thunder.last_traces(jitted)[0].output
    assert _as_torch(traced.dtype) == expected.dtype, "the trace's metadata"
    if expected.requires_grad:
        cotangent = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        cotangent = cotangent.to(expected.dtype)
        grads = torch.autograd.grad(expected, inputs, cotangent)
        actual_grads = torch.autograd.grad(actual, clones, cotangent)
        for got, want in zip(actual_grads, grads):
            assert got.dtype == want.dtype
            # eager rounds a wider operand's gradient to the (float16/bfloat16) result's dtype before casting it
            # back; thunder keeps it wide (stock thunder and discover() alike): compared in the result's dtype
            torch.testing.assert_close(got.to(expected.dtype), want.to(expected.dtype))
    return actual


@pytest.mark.parametrize("requires_grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("dts", FLOAT_PAIRS, ids=lambda p: f"{str(p[0])[6:]}-{str(p[1])[6:]}")
@pytest.mark.parametrize("shapes", SHAPE_PAIRS, ids="-".join)
def test_mul_of_mixed_shapes_and_dtypes_as_eager(shapes, dts, requires_grad, executors):
    program = _binary(torch.mul, *shapes)
    _compare(program, _inputs(shapes, dts, requires_grad), executors)


@pytest.mark.parametrize("requires_grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shapes", [("flat", "zero"), ("zero", "dim")], ids="-".join)
def test_elementwise_ops_as_eager(op, shapes, requires_grad, executors):
    program = _binary(OPS[op], *shapes)
    _compare(program, _inputs(shapes, (torch.float32, torch.float64), requires_grad), executors)


def test_ki8_program(executors):
    x = torch.randn(1, dtype=torch.float64, requires_grad=True)
    y = torch.randn((), dtype=torch.float32, requires_grad=True)
    out = _compare(lambda x, y: y.flatten() * x.sum(), [x, y], executors)
    assert out.dtype == torch.float32


@pytest.mark.parametrize("requires_grad", [True, False], ids=["grad", "no_grad"])
def test_stock_thunder_still_differs(requires_grad):
    x = torch.randn(1, dtype=torch.float64, requires_grad=requires_grad)
    y = torch.randn((), dtype=torch.float32, requires_grad=requires_grad)
    jitted = thunder.jit(lambda x, y: y.flatten() * x.sum())
    out = jitted(x, y)
    (traced,) = thunder.last_traces(jitted)[0].output
    assert traced.dtype == dtypes.float64  # eager: float32
    assert out.dtype == (torch.float64 if requires_grad else torch.float32)


NUMBER_PROGRAMS = {
    "int_times_float": (lambda i, s: i * 2.5 * s, [torch.int64, torch.float64]),
    "bool_plus_int": (lambda b, s: (b + 2) * s.to(torch.int32), [torch.bool, torch.float32]),
    "half_times_float": (lambda h, s: h * 2.5 + s, [torch.float16, torch.float64]),
    "int_0dim_times_float": (lambda i, s: i.sum() * 1.5 + s, [torch.int32, torch.float16]),
    "float_times_complex": (lambda h, s: (h * 1j).abs() + s, [torch.float16, torch.float64]),
    "bool_0dim_and_int": (lambda b, s: b.sum().bool() & 3, [torch.bool, torch.float32]),
}


@pytest.mark.parametrize("name", NUMBER_PROGRAMS)
def test_python_numbers_as_eager(name, executors):
    program, (dt, sdt) = NUMBER_PROGRAMS[name]
    generator = torch.Generator().manual_seed(2)
    first = (torch.randn(3, generator=generator) * 4).to(dt)
    second = torch.randn((), generator=generator, dtype=torch.float64).to(sdt)
    expected = program(first, second)
    jitted = thunder.jit(program, executors=executors)
    actual = jitted(first, second)
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected)
    (traced,) = thunder.last_traces(jitted)[0].output
    assert _as_torch(traced.dtype) == expected.dtype
