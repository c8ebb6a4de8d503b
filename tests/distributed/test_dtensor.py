"""DTensor and tensor parallelism under ``discover()``, 2 gloo ranks, against eager.

Eager runs every case here on CPU (checked below, never skipped). The compiled runs do not pass
yet: thunderplug still hands DTensor to thunder's own DTensorProxy (9 ops, no autodiff through
``from_local``), and routing it through the generic subclass core instead needs a DTensor's outer
(global) shape to differ from its inner (local) one in the unrolled dispatch, which the core does
not model yet (see docs/distributed.md). They are strict xfails: the day one passes, the test
fails until its mark is removed.
"""

from __future__ import annotations

import pytest

from harness import assert_runs_match, distributed_job, results_of

CASES = [
    "dtensor_mlp",
    "dtensor_inputs",
    "distribute_module_with_input_fn",
    "tensor_parallel",
    "tensor_parallel_float8",
    "dtensor_api_inside_jit",
]
job = distributed_job("dtensor_cases", CASES)

NOT_YET = "DTensor goes through thunder's DTensorProxy, not the generic subclass core (docs/distributed.md)"


@pytest.mark.parametrize("case", CASES)
def test_eager_runs_the_case(job, case):
    for result in results_of(job, case):
        assert len(result["eager"]["losses"]) >= 3


@pytest.mark.xfail(strict=True, reason=NOT_YET)
@pytest.mark.parametrize("case", CASES)
def test_compiled_matches_eager(job, case):
    for result in results_of(job, case):
        assert "error" not in result["compiled"], result["compiled"].get("error")
        assert_runs_match(result["compiled"], result["eager"], atol=1e-6, rtol=1e-5)
