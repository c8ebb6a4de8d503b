"""The 2-rank harness itself: results come back per rank, a failing rank's traceback is reported,
and a job past its deadline is killed (no process left behind)."""

from __future__ import annotations

import os
import time

import pytest
from harness import CaseFailure, DistributedJobError, distributed_job, results_of, run_job

job = distributed_job("harness_cases", ["all_reduce", "raises_on_rank_1"], timeout_s=120)


def test_each_rank_reports_its_result(job):
    assert [t.item() for t in results_of(job, "all_reduce")] == [3.0, 3.0]


def test_a_failing_rank_is_reported_with_its_traceback(job):
    rank0, rank1 = job["raises_on_rank_1"]
    assert rank0 == 0
    assert isinstance(rank1, CaseFailure) and "rank 1 says no" in rank1.traceback
    with pytest.raises(AssertionError, match="rank 1 failed"):
        results_of(job, "raises_on_rank_1")


def test_a_hanging_job_is_killed_at_its_deadline(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_TEST_PIDS", str(tmp_path))
    start = time.monotonic()
    with pytest.raises(DistributedJobError, match="still running after 10 s"):
        run_job("harness_cases", ["hangs"], tmp_path / "job", timeout_s=10)
    assert time.monotonic() - start < 30
    pids = [int((tmp_path / f"rank{rank}.pid").read_text()) for rank in range(2)]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
