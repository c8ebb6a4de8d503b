"""The real-program suite: every case under discover() equals eager, and nothing stock
``thunder.jit`` runs fails under discover() (the same cases under both)."""

from __future__ import annotations

import functools

import pytest

from real_programs import all_cases
from real_programs.case import Case
from real_programs.runner import Run, assert_equal_runs, run

CASES = all_cases()
_BY_NAME = {c.name: c for c in CASES}


@functools.cache
def _run(name: str, mode: str) -> Run:
    return run(_BY_NAME[name], mode)


def _eager_or_skip(case: Case) -> Run:
    eager = _run(case.name, "eager")
    if eager.error is not None:
        pytest.skip(f"eager PyTorch cannot run this on CPU: {type(eager.error).__name__}: {eager.error}")
    return eager


def _params(cases: list[Case]) -> list:
    return [
        pytest.param(c.name, id=c.name, marks=[pytest.mark.xfail(reason=c.xfail, strict=True)] if c.xfail else [])
        for c in cases
    ]


@pytest.mark.parametrize("name", _params(CASES))
def test_discover_equals_eager(name):
    case = _BY_NAME[name]
    eager = _eager_or_skip(case)
    assert_equal_runs(_run(name, "discover"), eager, case.tolerance, "discover()")


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_nothing_stock_thunder_runs_fails_under_discover(name):
    """Where stock thunder.jit computes what eager does, discover() must too."""
    case = _BY_NAME[name]
    eager = _eager_or_skip(case)
    stock = _run(name, "stock")
    try:
        assert_equal_runs(stock, eager, case.tolerance, "stock thunder.jit")
    except AssertionError:
        return  # stock thunder fails or is wrong here: no promise to keep (test_discover_equals_eager checks us)
    assert_equal_runs(_run(name, "discover"), eager, case.tolerance, "discover() (stock thunder.jit passes)")


def test_jagged_nested_tensor_is_refused_by_name():
    """Jagged NestedTensors have a dynamic nested-int size (``j1``); thunder traces static shapes."""
    import thunder
    import torch

    import thunderplug

    nested = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)], layout=torch.jagged)
    assert type((nested * 2).sin()).__name__ == "NestedTensor"  # eager runs it
    jitted = thunder.jit(lambda x: (x * 2).sin(), executors=thunderplug.discover(quiet=True))
    with pytest.raises(
        Exception, match=r"NestedTensor with a dynamic \(nested int\) dimension, shape \(2, j1, 4\)"
    ):
        jitted(nested)
