"""Cases for test_harness.py: the harness's own failure modes (no thunder import: fast to start)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


def all_reduce(rank, world_size):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return t


def raises_on_rank_1(rank, world_size):
    if rank == 1:
        raise ValueError("rank 1 says no")
    return rank


def hangs(rank, world_size):
    Path(os.environ["HARNESS_TEST_PIDS"], f"rank{rank}.pid").write_text(str(os.getpid()))
    time.sleep(3600)
