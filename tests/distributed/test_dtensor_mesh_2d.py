"""DTensor on a two-dimensional device mesh (2 x 2, 4 gloo ranks) inside jitted code, against
eager: ``distribute_tensor`` with every combination of Shard and Replicate, ``from_local`` and
``redistribute``, and a gradient through them. Four ranks, so this module has its own job
(about half a minute on two cores)."""

from __future__ import annotations

from harness import assert_runs_match, distributed_job, results_of

job = distributed_job("dtensor_cases", ["distribute_tensor_2d_mesh"], world_size=4)


def test_distribute_tensor_on_a_2d_mesh_matches_eager(job):
    results = results_of(job, "distribute_tensor_2d_mesh")
    assert len(results) == 4
    for result in results:
        assert "error" not in result["compiled"], result["compiled"].get("error")
        assert_runs_match(result["compiled"], result["eager"])  # bit for bit: the same broadcasts and chunks
