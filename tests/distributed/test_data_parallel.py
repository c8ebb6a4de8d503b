"""float8 training (torchao convert_to_float8_training) under data parallelism, 2 gloo ranks.

Each case trains the same model on the same per-rank batches eagerly and compiled with
``thunder.jit(..., executors=discover())`` and compares every loss and gradient of 3 SGD steps, bit
for bit: thunderplug runs eager's kernels (``_scaled_mm``, the casts) for this model.
"""

from __future__ import annotations

import pytest
import torch
from harness import assert_runs_match, distributed_job, results_of

CASES = [
    "ddp_around_jitted_float8",
    "stock_jit_around_ddp_is_refused",
    "jit_around_ddp_float8",
    "jit_around_ddp_no_sync_float8",
    "jit_around_ddp_without_grad",
    "thunder_ddp_float8",
    "thunder_fsdp_float8",
]
job = distributed_job("data_parallel_cases", CASES)


@pytest.mark.parametrize("case", ["ddp_around_jitted_float8", "thunder_ddp_float8", "thunder_fsdp_float8"])
def test_matches_eager_ddp_bit_for_bit(job, case):
    for rank, result in enumerate(results_of(job, case)):
        assert result["float8"], f"rank {rank}: the compiled program has no _scaled_mm"
        assert_runs_match(result["compiled"], result["eager"])


def test_stock_jit_around_ddp_is_refused_with_the_order_to_use(job):
    for message in results_of(job, "stock_jit_around_ddp_is_refused"):
        assert message is not None, "stock thunder.jit(DDP(model)) ran instead of being refused"
        assert "DistributedDataParallel" in message and "wrap in DDP" in message, message


def test_jit_around_ddp_matches_eager_ddp_bit_for_bit(job):
    for rank, result in enumerate(results_of(job, "jit_around_ddp_float8")):
        assert result["float8"], f"rank {rank}: a region's trace has no _scaled_mm"
        assert result["regions"] == ["module.l1", "module.l2"]
        assert_runs_match(result["compiled"], result["eager"])
        assert_runs_match(result["sequential"], result["sequential eager"])


def test_jit_around_ddp_all_reduces_buckets_during_the_backward(job):
    """The buckets' all-reduces come in eager DDP's order, interleaved with the regions' backwards:
    l2's parameters are all-reduced before l1's backward starts."""
    for result in results_of(job, "jit_around_ddp_float8"):
        events = result["compiled events"]
        assert events == result["eager events"]
        ends = [i for i, e in enumerate(events) if e == ("step",)]
        assert len(ends) == 3
        for start, end in zip(ends[:-1], ends[1:]):  # DDP buckets from its second iteration on
            step = events[start + 1 : end]
            l2 = [i for i, e in enumerate(step) if e[0] == "allreduce" and all(n.startswith("l2.") for n in e[1])]
            assert len(l2) == 2 and max(l2) < step.index(("backward of", "l1")), step


def test_jit_around_ddp_honours_no_sync(job):
    """Gradient accumulation under ``no_sync()``: unsynchronized gradients after the first
    micro-batch (they differ between ranks), the accumulated average after the last, as eager DDP."""
    ranks = results_of(job, "jit_around_ddp_no_sync_float8")
    for result in ranks:
        assert_runs_match(result["compiled"], result["eager"])
        assert_runs_match({**result["compiled"], "grads": result["compiled"]["unsynced"]},
                          {**result["eager"], "grads": result["eager"]["unsynced"]})
    first, second = (r["compiled"]["unsynced"][0]["0.weight"] for r in ranks)
    assert not first.equal(second), "no_sync() synchronized the gradients"


def test_jit_around_ddp_evaluates_without_grad_then_trains(job):
    for result in results_of(job, "jit_around_ddp_without_grad"):
        eager, compiled = result["outputs"]
        torch.testing.assert_close(compiled, eager, atol=0, rtol=0)
        assert result["requires_grad"] == [False, False]
        assert result["regions"] == ["module.layers.0", "module.layers.1"]
        assert_runs_match(result["compiled"], result["eager"])
