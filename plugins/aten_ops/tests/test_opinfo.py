"""Every OpInfo whose make_fx ATen graph uses only core (or the listed extra) overloads: thunder vs
eager, float32 and float64 on CPU, in three stages (opinfo_harness.Case): forward, the same with
every floating input requiring grad (also through ops without derivative), and input gradients
for a random cotangent.

Default run (CI): each OpInfo runs its first sample in ONE dtype, float32 or float64, chosen by a
stable hash of its name (``zlib.crc32``; the other dtype when the chosen one is unsupported), so
about half the OpInfos are checked in float32 and the other half in float64, forward and backward.
Almost all of the time goes into ``thunder.jit`` (tracing, transforms, autodiff: ~0.6 s per graph),
so running both dtypes doubled the run (~4m47s wall) for little extra signal: a decomposition's
prims are the same in both dtypes, and the differences that do exist (computation dtype upcasts,
tolerances, float32-only fast paths such as ``_embedding_bag``'s) are still exercised by the half
that runs in each dtype. The split is a hash rather than alternating sorted names, so adding an
OpInfo does not reshuffle the others. Forward and backward of one (OpInfo, dtype) share a single
traced and jitted case (``run_case`` is cached).

``--full``: every sample of every OpInfo in both dtypes.
"""

from __future__ import annotations

import zlib

import pytest
import torch
from opinfo_harness import DTYPES, opinfo_id, opinfos, run_case

#: (OpInfo, stage) -> reason; strict, so a fix shows up as XPASS. Empty: nonzero and argwhere (data-dependent
#: shapes) run with a graph break (the core's wiring.graph_breaks)
XFAILS: dict[tuple[str, str], str] = {}

_OPINFOS = {}
for _op in opinfos():
    _OPINFOS.setdefault(opinfo_id(_op), _op)
OP_IDS = sorted(_OPINFOS)


def default_dtype(op_id: str) -> torch.dtype:
    """The one dtype the default run checks ``op_id`` in (see the module docstring)."""
    preferred = DTYPES[zlib.crc32(op_id.encode()) % len(DTYPES)]
    supported = _OPINFOS[op_id].supported_dtypes("cpu")
    return preferred if preferred in supported else next((d for d in DTYPES if d in supported), preferred)


def _params(stage, full):
    params = []
    for op_id in OP_IDS:
        marks = [pytest.mark.xfail(reason=XFAILS[op_id, stage], strict=True)] if (op_id, stage) in XFAILS else []
        for dtype in DTYPES if full else (default_dtype(op_id),):
            params.append(pytest.param(op_id, dtype, marks=marks, id=f"{op_id}-{dtype}"))
    return params


def pytest_generate_tests(metafunc):
    if {"op_id", "dtype"} <= set(metafunc.fixturenames):
        stage = metafunc.function.__name__.removeprefix("test_")
        metafunc.parametrize(("op_id", "dtype"), _params(stage, metafunc.config.getoption("--full")))


def _cases(request, op_id, dtype):
    if not request.config.getoption("--full"):
        return [run_case(op_id, dtype)]
    cases, index = [], 0
    while (case := run_case(op_id, dtype, index)).skip != f"no sample {index}":
        cases.append(case)
        index += 1
    return cases


def _in_scope(cases):
    cases = [c for c in cases if c.skip is None]
    if not cases:
        pytest.skip("no sample whose ATen graph uses only core/registered overloads")
    return cases


def test_forward(request, op_id, dtype):
    for case in _in_scope(_cases(request, op_id, dtype)):
        assert case.forward_error is None, f"{case.forward_error} (overloads: {case.overloads})"


def test_requires_grad(request, op_id, dtype):
    """Floating inputs that require grad, differentiable op or not: values and requires_grad as eager."""
    cases = [c for c in _in_scope(_cases(request, op_id, dtype)) if c.has_requires_grad]
    if not cases:
        pytest.skip("no sample with floating inputs that eager runs with requires_grad")
    for case in cases:
        assert case.requires_grad_error is None, f"{case.requires_grad_error} (overloads: {case.overloads})"


def test_backward(request, op_id, dtype):
    cases = [c for c in _in_scope(_cases(request, op_id, dtype)) if c.requires_grad_error is None and c.has_backward]
    if not cases:
        pytest.skip("no differentiable sample whose requires_grad stage passes")
    for case in cases:
        assert case.backward_error is None, f"{case.backward_error} (overloads: {case.overloads})"


def test_default_split_covers_both_dtypes():
    """The default run exercises float32 and float64 each on a substantial share of the OpInfos."""
    chosen = [default_dtype(op_id) for op_id in OP_IDS]
    for dtype in DTYPES:
        assert chosen.count(dtype) > len(OP_IDS) // 3, f"{dtype}: {chosen.count(dtype)} of {len(OP_IDS)}"
