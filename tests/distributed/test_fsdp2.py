"""FSDP2 (``fully_shard``) with thunder-compiled blocks, 2 gloo ranks, against eager FSDP2.

Both orders users write: torchtitan's (jit each block, then ``fully_shard``: thunder must train
the sharded parameters FSDP2 swaps in, not the full copies it captured) and the reverse (FSDP2's
hooks run eagerly around the compiled block), with torchao float8 and its float8 all-gather
(``WeightWithDynamicFloat8CastTensor``, ``precompute_float8_dynamic_scale_for_fsdp``). Every loss
and every gradient of the sharded parameters over 3 steps, bit for bit.
"""

from __future__ import annotations

import pytest
from harness import assert_runs_match, distributed_job, results_of

CASES = [
    "jit_then_fully_shard",
    "jit_then_fully_shard_float8",
    "fully_shard_then_jit_float8",
    "float8_all_gather",
    "float8_all_gather_precomputed_scales",
    "activation_checkpointing_float8",
    "fully_shard_then_jit_float8_all_gather",
]
job = distributed_job("fsdp2_cases", [*CASES, "jit_of_a_model_with_sharded_blocks", "blocks_share_one_compilation"])


@pytest.mark.parametrize("case", CASES)
def test_matches_eager_fsdp2_bit_for_bit(job, case):
    for result in results_of(job, case):
        assert_runs_match(result["compiled"], result["eager"])


def test_jitting_a_model_whose_blocks_are_sharded_is_refused_clearly(job):
    for result in results_of(job, "jit_of_a_model_with_sharded_blocks"):
        assert len(result["eager"]["losses"]) >= 3  # eager FSDP2 trains it
        assert result["refused"] is not None, "compiled: neither refused nor checked against eager"
        name, message = result["refused"]
        assert name == "FSDPInsideJitError", message
        assert "fully_shard FSDPSequential inside the jitted module" in message and "thunder.jit(block" in message


def test_sharded_blocks_of_one_structure_compile_once(job):
    for result in results_of(job, "blocks_share_one_compilation"):
        for order in ("jit_then_fully_shard", "fully_shard_then_jit"):
            assert_runs_match({k: v for k, v in result[order].items() if k != "misses"}, result["eager"])
            # the first two may run an earlier case's compilations (the same structure, still alive)
            assert result[order]["misses"][2:] == [0, 0], order
