"""Entry point of the nvFuser plugin: one fusion executor for whichever machine this is.

* ``nvfuser``: thunder's nvFuser executor, where CUDA and nvFuser are present;
* ``torchcompile_cuda``: where CUDA is present and nvFuser is not (no wheel is served for torch 2.10
  and newer), on by default: runs of the claimed bf16/float8 ops as torch.compile (inductor) regions
  (``cuda_regions``; ``discover(exclude=["torchcompile_cuda"])`` turns it off); fp32 programs stay op by
  op, bit-identical to eager, unless ``THUNDERPLUG_CUDA_FUSE_FP32=1`` fuses them too (within
  ``cuda_regions.FP32_TOLERANCE`` of eager);
* ``torchcompile_no_fp8``: on CPU, thunder's torch.compile fuser with float8 operations kept
  out of it (``cpu_fallback``), opt-in with ``THUNDERPLUG_CPU_FUSION=1``: on CPU an inductor region
  costs more per call than it saves on small programs (benchmarks/overhead.py: ``x + 1`` took 1.9x
  the time of plain thunder.jit with it), and float8 work stays out of it anyway.

Each executor says for itself whether it can run here (``ExecutorSpec.unavailable_reason``).
"""

from __future__ import annotations

import importlib.util
import os

from thunderplug import ExecutorSpec, Priority, hookimpl
from thunderplug.plugin_api.availability import cuda_unavailable_reason
from thunderplug.plugin_api.settings import flag

CPU_FUSION = "THUNDERPLUG_CPU_FUSION"
CUDA_FUSE_FP32 = "THUNDERPLUG_CUDA_FUSE_FP32"


def nvfuser_unavailable_reason() -> str | None:
    cuda = cuda_unavailable_reason()
    if cuda:
        return cuda
    if importlib.util.find_spec("nvfuser_direct") is None and importlib.util.find_spec("nvfuser") is None:
        return (
            "package 'nvfuser' is not installed "
            "(pip install --pre 'thunderplug-nvfuser[nvfuser]'; Python 3.10/3.12 wheels only)"
        )
    return None


def cuda_regions_unavailable_reason() -> str | None:
    if nvfuser_unavailable_reason() is None:
        return "not needed: nvFuser is available"
    return cuda_unavailable_reason()


def fallback_unavailable_reason() -> str | None:
    if nvfuser_unavailable_reason() is None:
        return "not needed: nvFuser is available"
    if cuda_regions_unavailable_reason() is None:
        return "not needed: torchcompile_cuda fuses on this CUDA machine"
    if not flag(os.environ, CPU_FUSION):
        return f"opt-in: set {CPU_FUSION}=1 to fuse with torch.compile where nvFuser is unavailable"
    return None


def _nvfuser_executor():
    import thunder

    executor = thunder.extend.get_executor("nvfuser")
    if executor is None:
        raise ImportError("thunder did not register its nvFuser executor (nvfuser older than 0.2.8?)")
    return executor


def _cuda_regions_executor():
    from thunderplug_nvfuser import cuda_regions

    return cuda_regions.build_executor(fuse_fp32=flag(os.environ, CUDA_FUSE_FP32))


def _fallback_executor():
    from thunderplug_nvfuser import cpu_fallback

    return cpu_fallback.build_executor()


@hookimpl
def register_executors(register) -> None:
    register(
        ExecutorSpec(
            "nvfuser",
            _nvfuser_executor,
            Priority.FUSER,
            "thunder's nvFuser fusion executor",
            unavailable_reason=nvfuser_unavailable_reason,
        )
    )
    register(
        ExecutorSpec(
            "torchcompile_cuda",  # cuda_regions.NAME, without importing thunder
            _cuda_regions_executor,
            Priority.FUSER,
            "claimed bf16/float8 ops on CUDA as torch.compile (inductor) regions, where nvFuser is missing",
            unavailable_reason=cuda_regions_unavailable_reason,
        )
    )
    register(
        ExecutorSpec(
            "torchcompile_no_fp8",  # cpu_fallback.NAME, without importing thunder
            _fallback_executor,
            Priority.FUSER,
            "thunder's torch.compile fuser without float8 operations (inductor crashes on them on CPU in torch 2.9.1)",
            unavailable_reason=fallback_unavailable_reason,
        )
    )
