"""Two-dimensional device meshes (2 x 2, 4 gloo ranks), against eager: ``distribute_tensor``
with every combination of Shard and Replicate inside jitted code, and torchtitan's 2-D recipe
(float8 tensor parallelism inside FSDP2-sharded, jitted blocks). Four ranks, so this module has
its own job (about a minute on two cores)."""

from __future__ import annotations

import pytest
from harness import assert_runs_match, distributed_job, results_of

CASES = ["distribute_tensor_2d_mesh", "fsdp_tp_float8"]
job = distributed_job("mesh_2d_cases", CASES, world_size=4)


@pytest.mark.parametrize("case", CASES)
def test_compiled_matches_eager_on_a_2d_mesh(job, case):
    results = results_of(job, case)
    assert len(results) == 4
    for result in results:
        assert "error" not in result["compiled"], result["compiled"].get("error")
        assert_runs_match(result["compiled"], result["eager"])  # bit for bit: eager kernels, same collectives
