"""float8 training (torchao convert_to_float8_training) under data parallelism, 2 gloo ranks.

Each case trains the same model on the same per-rank batches eagerly and compiled with
``thunder.jit(..., executors=discover())`` and compares every loss and gradient of 3 SGD steps, bit
for bit: thunderplug runs eager's kernels (``_scaled_mm``, the casts) for this model.
"""

from __future__ import annotations

import pytest
from harness import assert_runs_match, distributed_job, results_of

CASES = ["ddp_around_jitted_float8", "jit_around_ddp_is_refused", "thunder_ddp_float8", "thunder_fsdp_float8"]
job = distributed_job("data_parallel_cases", CASES)


@pytest.mark.parametrize("case", ["ddp_around_jitted_float8", "thunder_ddp_float8", "thunder_fsdp_float8"])
def test_matches_eager_ddp_bit_for_bit(job, case):
    for rank, result in enumerate(results_of(job, case)):
        assert result["float8"], f"rank {rank}: the compiled program has no _scaled_mm"
        assert_runs_match(result["compiled"], result["eager"])


def test_jit_around_ddp_is_refused_with_the_order_to_use(job):
    for message in results_of(job, "jit_around_ddp_is_refused"):
        assert message is not None, "thunder.jit(DDP(model)) ran instead of being refused"
        assert "DistributedDataParallel" in message and "wrap in DDP" in message, message
