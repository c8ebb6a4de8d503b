"""Every registered decomposition's output metadata is checked against torch's: by the op's fake
kernel for a call in the user's program, by the values torch traced for a node of an unrolled
graph (no second fake run). A wrong decomposition is refused by name either way."""

from __future__ import annotations

import pytest
import torch
from thunder import clang
from thunder.core import devices, dtypes
from thunder.core.proxies import TensorProxy
from thunder.core.trace import TraceCtx, tracectx

from thunderplug.plugin_api.specs import AtenOp
from thunderplug.tracing.aten import AtenMetadataError, AtenTable
from thunderplug.tracing.fake import fake_mode

fake_kernel_runs: list[tuple] = []


@torch.library.custom_op("thunderplug_test::halve", mutates_args=())
def halve(x: torch.Tensor) -> torch.Tensor:
    return x / 2


@halve.register_fake
def _(x):
    fake_kernel_runs.append(tuple(x.shape))
    return torch.empty_like(x)


def _good(x):
    return clang.mul(x, 0.5)


def _wrong_dtype(x):
    return clang.maybe_convert_to_dtype(clang.mul(x, 0.5), dtypes.float64)


def _proxy(*shape):
    return TensorProxy(shape=shape, dtype=dtypes.float32, device=devices.cpu)


def _traced_output(*shape):
    with fake_mode():
        return torch.empty(*shape)


@pytest.fixture
def runs():
    fake_kernel_runs.clear()
    return fake_kernel_runs


def test_a_call_in_the_program_is_checked_by_the_fake_kernel(runs):
    table = AtenTable([AtenOp(torch.ops.thunderplug_test.halve.default, _good)])
    with tracectx(TraceCtx()):
        out = table.call(torch.ops.thunderplug_test.halve.default, _proxy(2, 3))
    assert tuple(out.shape) == (2, 3) and runs == [(2, 3)]


def test_a_replayed_node_is_checked_by_its_traced_values_without_running_the_kernel(runs):
    table = AtenTable([AtenOp(torch.ops.thunderplug_test.halve.default, _good)])
    with tracectx(TraceCtx()):
        out = table.call_traced(torch.ops.thunderplug_test.halve.default, _traced_output(4, 5), _proxy(4, 5))
    assert tuple(out.shape) == (4, 5) and runs == []


@pytest.mark.parametrize("traced", [False, True], ids=["fake kernel", "traced values"])
def test_a_wrong_decomposition_is_refused_by_name(runs, traced):
    overload = torch.ops.thunderplug_test.halve.default
    table = AtenTable([AtenOp(overload, _wrong_dtype)])
    with tracectx(TraceCtx()), pytest.raises(AtenMetadataError, match=r"thunderplug_test\.halve\.default.*float64"):
        if traced:
            table.call_traced(overload, _traced_output(3, 7), _proxy(3, 7))
        else:
            table.call(overload, _proxy(3, 7))


def test_traced_values_meant_for_another_op_are_not_taken(runs):
    """Values passed for one overload are never used to check another (a nested ATen call)."""
    table = AtenTable([AtenOp(torch.ops.thunderplug_test.halve.default, _good)])
    with tracectx(TraceCtx()):
        table.call_traced(torch.ops.aten.abs.default, _traced_output(9, 9), _proxy(6, 2))
        table.call(torch.ops.thunderplug_test.halve.default, _proxy(6, 2))
    assert runs == [(6, 2)]
