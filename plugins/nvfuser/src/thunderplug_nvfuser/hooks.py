"""Entry point of the nvFuser plugin: thunder's nvFuser executor, when CUDA and nvFuser are present."""

from __future__ import annotations

import importlib.util

from thunderplug import ExecutorSpec, Priority, hookimpl
from thunderplug.availability import cuda_unavailable_reason


@hookimpl
def unavailable_reason() -> str | None:
    cuda = cuda_unavailable_reason()
    if cuda:
        return cuda
    if importlib.util.find_spec("nvfuser_direct") is None and importlib.util.find_spec("nvfuser") is None:
        return "package 'nvfuser' is not installed (pip install --pre 'thunderplug-nvfuser[nvfuser]'; Python 3.10/3.12 wheels only)"
    return None


def _nvfuser_executor():
    import thunder

    executor = thunder.extend.get_executor("nvfuser")
    if executor is None:
        raise ImportError("thunder did not register its nvFuser executor (nvfuser older than 0.2.8?)")
    return executor


@hookimpl
def register_executors(register) -> None:
    register(ExecutorSpec("nvfuser", _nvfuser_executor, Priority.FUSER, "thunder's nvFuser fusion executor"))
