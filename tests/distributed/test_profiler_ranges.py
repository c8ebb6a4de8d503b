"""Profiler ranges inside jitted code (what FSDP2's hooks and torchtitan open) are dropped, and
the code inside them is compiled as usual (single process)."""

from __future__ import annotations

import thunder
import torch

import thunderplug


def test_record_function_is_dropped_and_the_range_body_compiled():
    def f(x):
        with torch.profiler.record_function("a range"):
            y = torch.nn.functional.gelu(x) * 2
        return y.sum()

    x = torch.randn(8, requires_grad=True)
    expected = f(x)
    (expected_grad,) = torch.autograd.grad(expected, x)
    jitted = thunder.jit(f, executors=thunderplug.discover())
    actual = jitted(x)
    (actual_grad,) = torch.autograd.grad(actual, x)
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(actual_grad, expected_grad)
    trace = str(thunder.last_traces(jitted)[-1])
    assert "record_function" not in trace and "gelu" in trace
