"""Run case functions on 2 gloo ranks on this machine, bounded in time, and bring their results back.

Why a harness of our own instead of torchrun: the tests must run in the default ``pytest`` run on a
CPU-only box, finish (or fail) in bounded time even when a collective deadlocks, and leave nothing
behind. So each job starts ``world_size`` fresh interpreters (``python harness.py ...``: no state
inherited from the pytest process, and unlike multiprocessing's spawn no re-import of the parent's
``__main__``), each in its own session so that killing its process group kills everything it
started; they rendezvous through a ``FileStore`` in a temporary directory (no ports, nothing
listening on the network), run every case of one module in order on the same process group
(starting interpreters costs more than most cases), and write each case's result or traceback to
a file the parent reads. The parent kills the ranks when the deadline passes.

A case is a function ``case(rank: int, world_size: int) -> Any`` in an importable module; what it
returns must be picklable by ``torch.save`` (plain tensors, numbers, strings, lists and dicts).
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

#: Collectives that wait longer than this raise in the rank instead of hanging until the job deadline.
COLLECTIVE_TIMEOUT = timedelta(seconds=60)


@dataclass(frozen=True)
class CaseFailure:
    """What a rank reported for a case that raised."""

    rank: int
    traceback: str


class DistributedJobError(RuntimeError):
    """A job timed out, or a rank died without reporting."""


def run_job(module: str, cases: list[str], workdir: Path, *, world_size: int = 2, timeout_s: float = 300.0):
    """Run ``module.case`` for each name in ``cases`` on ``world_size`` gloo ranks.

    Returns ``{case: [result of rank 0, result of rank 1, ...]}``, where a result is the case's return
    value or a :class:`CaseFailure`. Raises :class:`DistributedJobError` if the ranks do not all
    finish within ``timeout_s`` (they are killed first) or one exits without writing its results.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    store = workdir / "store"
    ranks = []
    for rank in range(world_size):
        log = open(workdir / f"rank{rank}.log", "wb")  # noqa: SIM115 - closed below
        command = [sys.executable, __file__, str(rank), str(world_size), str(store), str(workdir), module, *cases]
        ranks.append((subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log))
    deadline = time.monotonic() + timeout_s
    try:
        for process, _ in ranks:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise DistributedJobError(
                    f"{module}: ranks still running after {timeout_s:.0f} s; killed. "
                    f"Cases finished: {sorted(_read_partial(workdir, world_size))}\n{_log_tails(workdir, world_size)}"
                ) from None
    finally:
        for process, log in ranks:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
            log.close()
    per_rank = []
    for rank, (process, _) in enumerate(ranks):
        path = workdir / f"rank{rank}.pt"
        if not path.exists():
            raise DistributedJobError(
                f"{module}: rank {rank} exited with code {process.returncode} and no results\n"
                f"{_log_tails(workdir, world_size)}"
            )
        per_rank.append(torch.load(path, weights_only=False))
    return {
        case: [
            CaseFailure(rank, results[case]["traceback"]) if "traceback" in results[case] else results[case]["value"]
            for rank, results in enumerate(per_rank)
        ]
        for case in cases
    }


def _log_tails(workdir: Path, world_size: int, chars: int = 3000) -> str:
    return "\n".join(
        f"--- rank {rank} output (tail) ---\n{(workdir / f'rank{rank}.log').read_text(errors='replace')[-chars:]}"
        for rank in range(world_size)
    )


def _read_partial(workdir: Path, world_size: int) -> set[str]:
    done: set[str] = set()
    for rank in range(world_size):
        done |= {p.stem for p in (workdir / f"rank{rank}.d").glob("*.done")}
    return done


def _rank_main(rank: int, world_size: int, store: str, workdir: str, module: str, cases: list[str]) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)  # two ranks share the machine's cores
    progress = Path(workdir) / f"rank{rank}.d"
    progress.mkdir(exist_ok=True)
    results: dict[str, Any] = {}
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store, world_size),
        rank=rank,
        world_size=world_size,
        timeout=COLLECTIVE_TIMEOUT,
    )
    try:
        cases_module = importlib.import_module(module)
        for name in cases:
            try:
                torch.manual_seed(0)
                results[name] = {"value": getattr(cases_module, name)(rank, world_size)}
            except Exception:  # noqa: BLE001 - reported to the parent with its traceback
                results[name] = {"traceback": traceback.format_exc()}
            (progress / f"{name}.done").touch()
            dist.barrier()  # the next case starts on all ranks together, also after a failure
    finally:
        torch.save(results, Path(workdir) / f"rank{rank}.pt")
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (gloo threads, atexit hooks): the results are written


def distributed_job(module: str, cases: list[str], *, world_size: int = 2, timeout_s: float = 300.0):
    """A module-scoped pytest fixture that runs ``cases`` of ``module`` once, on ``world_size``
    ranks, for all the tests of the test module that assigns it (``job = distributed_job(...)``)."""
    import pytest
    import torch.distributed as dist

    @pytest.fixture(scope="module")
    def job(tmp_path_factory):
        if not dist.is_available() or not dist.is_gloo_available():
            pytest.skip("torch.distributed with the gloo backend is not available in this build")
        return run_job(module, cases, tmp_path_factory.mktemp(module), world_size=world_size, timeout_s=timeout_s)

    return job


def results_of(job: dict[str, list[Any]], case: str) -> list[Any]:
    """The per-rank results of ``case``; re-raises a rank's failure with its traceback."""
    failures = [r for r in job[case] if isinstance(r, CaseFailure)]
    if failures:
        raise AssertionError("\n".join(f"rank {f.rank} failed:\n{f.traceback}" for f in failures))
    return job[case]


def assert_runs_match(
    actual: dict[str, Any], expected: dict[str, Any], *, atol: float = 0.0, rtol: float = 0.0
) -> None:
    """Every loss and every gradient of every step equal (``atol=rtol=0``: bit for bit).

    A gradient that is ``None`` in one run and a tensor in the other is a mismatch: that is how a
    compiled module that trains the wrong parameters shows. Where both runs recorded the gradients'
    ``layouts`` (type and DTensor placements: ``training.layout_of``), those must be equal too.
    """
    assert len(actual["losses"]) == len(expected["losses"]) >= 3, "fewer than 3 steps recorded"
    for step, (a, e) in enumerate(zip(actual["losses"], expected["losses"])):
        torch.testing.assert_close(a, e, atol=atol, rtol=rtol, msg=lambda m, step=step: f"loss of step {step}: {m}")
    for step, (a, e) in enumerate(zip(actual["grads"], expected["grads"])):
        assert a.keys() == e.keys(), f"step {step}: parameters {sorted(a)} != {sorted(e)}"
        for name in e:
            if e[name] is None or a[name] is None:
                assert a[name] is None and e[name] is None, f"step {step}: grad of {name}: {a[name]} vs {e[name]}"
                continue
            torch.testing.assert_close(
                a[name],
                e[name],
                atol=atol,
                rtol=rtol,
                msg=lambda m, step=step, name=name: f"step {step}, grad of {name}: {m}",
            )
    if "layouts" in actual and "layouts" in expected:
        for step, (a, e) in enumerate(zip(actual["layouts"], expected["layouts"])):
            assert a == e, f"step {step}: gradient types/placements {a} != eager's {e}"


if __name__ == "__main__":
    # one rank: harness.py RANK WORLD_SIZE STORE WORKDIR MODULE CASE... (this directory is on sys.path)
    _rank, _world, _store, _workdir, _module, *_cases = sys.argv[1:]
    _rank_main(int(_rank), int(_world), _store, _workdir, _module, _cases)
