"""DTensor, tensor parallelism and functional collectives under ``discover()``, 2 gloo ranks,
against eager.

Functional collectives (``torch.ops._c10d_functional``, funcol's AsyncCollectiveTensor) run as
themselves, bit for bit equal to eager, with each wait after its collective.

DTensor goes through thunderplug's generic subclass core (not thunder's DTensorProxy): inputs
are flattened to their local tensors with prologue guards on mesh and placements, every op is
unrolled through DTensor's own dispatch, ``from_local``/``to_local``/``redistribute``/
``distribute_tensor`` are ops traced on fakes, and the collectives a redistribution needs run as
themselves. Eager runs every case here on CPU (checked, never skipped). torchao's float8 parallel
styles nest subclasses (a DTensor of Float8TrainingTensor, whose gradients have plain local
tensors or float8 ones depending on the op that produced them): backwards traced for another
nesting than the gradient that arrives are traced again (``executor._retrace_stale``).
"""

from __future__ import annotations

import re

import pytest
from harness import assert_runs_match, distributed_job, results_of

CASES = [
    "dtensor_inputs",
    "tensor_parallel",
    "dtensor_api_inside_jit",
    "dtensor_mlp",
    "distribute_module_with_input_fn",
    "tensor_parallel_float8",
    "sequence_parallel",
]
COLLECTIVES = ["functional_collective_overloads", "functional_collective_packets", "funcol_with_gradients"]
job = distributed_job("dtensor_cases", CASES + COLLECTIVES)


@pytest.mark.parametrize("case", CASES)
def test_eager_runs_the_case(job, case):
    for result in results_of(job, case):
        assert len(result["eager"]["losses"]) >= 3


@pytest.mark.parametrize("case", CASES)
def test_compiled_matches_eager(job, case):
    for result in results_of(job, case):
        assert "error" not in result["compiled"], result["compiled"].get("error")
        assert_runs_match(result["compiled"], result["eager"])  # bit for bit: eager kernels, same collectives


def _calls(trace: str) -> list[tuple[str, str, set[str]]]:
    """(output, function, argument names) of each call line of a printed trace."""
    calls = []
    for line in trace.splitlines():
        match = re.match(r"\s*(\w+) = ([\w.]+)\((.*)\)", line)
        if match:
            calls.append((match[1], match[2], set(re.findall(r"\b[a-z_]\w*\b", match[3]))))
    return calls


@pytest.mark.parametrize("case", COLLECTIVES)
def test_functional_collectives_match_eager_bit_for_bit(job, case):
    for result in results_of(job, case):
        assert "error" not in result["compiled"], result["compiled"].get("error")
        assert_runs_match(result["compiled"], result["eager"])
        calls = _calls(result["trace"])
        collectives = [i for i, (_, fn, _) in enumerate(calls) if "_c10d_functional" in fn and "wait_tensor" not in fn]
        assert collectives, result["trace"]
        for i in collectives:  # the first use of a collective's result is its wait
            output = calls[i][0]
            first_use = next(fn for _, fn, args in calls[i + 1 :] if output in args)
            assert "wait_tensor" in first_use, f"{output} of {calls[i][1]} is first used by {first_use}"
