"""Every OpInfo whose make_fx ATen graph uses only registered overloads: thunder vs eager, forward
and input gradients, float32 and float64 on CPU (first sample by default, all with ``--full``)."""

from __future__ import annotations

import pytest
import torch

from opinfo_harness import DTYPES, opinfo_id, opinfos, run_case

#: (OpInfo, stage) -> reason; strict, so a fix shows up as XPASS
XFAILS = {
    ("nonzero", "forward"): "aten.nonzero: data-dependent output shape, thunder proxies need static shapes",
    ("argwhere", "forward"): "aten.nonzero: data-dependent output shape, thunder proxies need static shapes",
    ("nn.functional.embedding_bag", "forward"): "aten._embedding_bag is not registered (see docs/aten_coverage.md)",
    ("nn.functional.conv_transpose1d", "forward"): "thunder 0.2.6 convolution: transposed=True is not supported",
    ("nn.functional.conv_transpose2d", "forward"): "thunder 0.2.6 convolution: transposed=True is not supported",
    ("nn.functional.conv_transpose3d", "forward"): "thunder 0.2.6 convolution: transposed=True is not supported",
    ("nn.functional.avg_pool2d", "forward"): "thunder 0.2.6 avg_pool2d: ceil_mode=True is not supported",
    ("scatter_reduce.prod", "forward"): "scatter_reduce: thunder has no scatter-prod",
    ("scatter_reduce.amax", "forward"): "scatter_reduce: thunder has no scatter-max",
    ("scatter_reduce.amin", "forward"): "scatter_reduce: thunder has no scatter-min",
    ("index_put", "backward"): "thunder 0.2.6 index_put grad with accumulate=False and repeated indices differs",
}

OP_IDS = sorted({opinfo_id(op) for op in opinfos()})


def _cases(request, op_id, dtype):
    if not request.config.getoption("--full"):
        return [run_case(op_id, dtype)]
    cases, index = [], 0
    while (case := run_case(op_id, dtype, index)).skip != f"no sample {index}":
        cases.append(case)
        index += 1
    return cases


def _params(stage):
    return [
        pytest.param(op_id, marks=pytest.mark.xfail(reason=XFAILS[op_id, stage], strict=True))
        if (op_id, stage) in XFAILS
        else op_id
        for op_id in OP_IDS
    ]


def _in_scope(cases):
    cases = [c for c in cases if c.skip is None]
    if not cases:
        pytest.skip("no sample whose ATen graph uses only core/registered overloads")
    return cases


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op_id", _params("forward"))
def test_forward(request, op_id, dtype):
    for case in _in_scope(_cases(request, op_id, dtype)):
        assert case.forward_error is None, f"{case.forward_error} (overloads: {case.overloads})"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op_id", _params("backward"))
def test_backward(request, op_id, dtype):
    cases = [c for c in _in_scope(_cases(request, op_id, dtype)) if c.forward_error is None and c.has_backward]
    if not cases:
        pytest.skip("no differentiable sample whose forward passes")
    for case in cases:
        assert case.backward_error is None, f"{case.backward_error} (overloads: {case.overloads})"
