"""Entry point ``nvfuser_cpu_fallback``: the fusion executor to use where nvFuser is unavailable.

Opt-in with ``THUNDERPLUG_CPU_FUSION=1``: on CPU an inductor region costs more per call than it
saves on small programs (measured by benchmarks/overhead.py: ``x + 1`` took 1.9x the time of
plain thunder.jit with it), and float8 work, the point of this project, stays out of it anyway.
"""

from __future__ import annotations

import os

from thunderplug import ExecutorSpec, Priority, hookimpl
from thunderplug_nvfuser import hooks as nvfuser_hooks  # a module: importing the hook function would register it twice


@hookimpl
def unavailable_reason() -> str | None:
    if nvfuser_hooks.unavailable_reason() is None:
        return "not needed: nvFuser is available"
    if os.environ.get("THUNDERPLUG_CPU_FUSION", "") in ("", "0"):
        return "opt-in: set THUNDERPLUG_CPU_FUSION=1 to fuse with torch.compile where nvFuser is unavailable"
    return None


@hookimpl
def register_executors(register) -> None:
    from thunderplug_nvfuser import cpu_fallback

    register(
        ExecutorSpec(
            cpu_fallback.NAME,
            cpu_fallback.build_executor,
            Priority.FUSER,
            "thunder's torch.compile fuser without float8 operations (inductor crashes on them on CPU in torch 2.9.1)",
        )
    )
