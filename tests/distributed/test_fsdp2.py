"""FSDP2 (``fully_shard``) with thunder-compiled blocks, 2 gloo ranks, against eager FSDP2.

Both orders users write: torchtitan's (jit each block, then ``fully_shard``: thunder must train
the sharded parameters FSDP2 swaps in, not the full copies it captured) and the reverse (FSDP2's
hooks run eagerly around the compiled block), and jit of the root after ``fully_shard`` of each block
and of the root (each block a compiled region, its hooks eager around it), with torchao float8 and its float8 all-gather
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
ROOT_CASES = [
    "jit_of_a_model_with_sharded_blocks",
    "jit_of_a_model_with_sharded_float8_blocks",
    "jit_of_a_model_with_sharded_blocks_float8_all_gather",
    "jit_of_a_model_with_sharded_blocks_float8_all_gather_precomputed_scales",
]
job = distributed_job("fsdp2_cases", [*CASES, *ROOT_CASES, "stock_jit_of_a_model_with_sharded_blocks",
                                     "jit_of_a_function_calling_a_sharded_model", "blocks_share_one_compilation"])


@pytest.mark.parametrize("case", CASES)
def test_matches_eager_fsdp2_bit_for_bit(job, case):
    for result in results_of(job, case):
        assert_runs_match(result["compiled"], result["eager"])


@pytest.mark.parametrize("case", ROOT_CASES)
def test_jit_of_a_model_whose_blocks_are_sharded_matches_eager_fsdp2_bit_for_bit(job, case):
    """``fully_shard`` each block and the root, then ``thunder.jit(root)``: each block a compiled
    region (its FSDP2 hooks eager around it), every loss and gradient as eager FSDP2's."""
    for result in results_of(job, case):
        assert_runs_match(result["compiled"], result["eager"])
        keys, root_keys = result["state_dict_keys"]
        assert keys == root_keys, "the jitted root's state_dict is not the root's"
        assert result["regions"] == ["layers.0", "layers.1"]
        assert result["scaled_mm"] == [("float8" in case) or ("all_gather" in case)] * 2
        assert result["tree_restored"], "a region's ThunderModule was left in the module tree"


def test_stock_thunder_jit_of_a_model_whose_blocks_are_sharded_fails(job):
    for message in results_of(job, "stock_jit_of_a_model_with_sharded_blocks"):
        assert message is not None, "stock thunder.jit ran it: compare it with eager instead"


def test_a_jitted_function_calling_a_sharded_model_is_refused_clearly(job):
    for result in results_of(job, "jit_of_a_function_calling_a_sharded_model"):
        assert result is not None, "neither refused nor checked against eager"
        name, message = result
        assert name == "FSDPInsideJitError", message
        assert "fully_shard FSDPBlocks inside jitted code" in message and "Jit the module itself" in message


def test_sharded_blocks_of_one_structure_compile_once(job):
    for result in results_of(job, "blocks_share_one_compilation"):
        for order in ("jit_then_fully_shard", "fully_shard_then_jit"):
            assert_runs_match({k: v for k, v in result[order].items() if k != "misses"}, result["eager"])
            # the first two may run an earlier case's compilations (the same structure, still alive)
            assert result[order]["misses"][2:] == [0, 0], order
