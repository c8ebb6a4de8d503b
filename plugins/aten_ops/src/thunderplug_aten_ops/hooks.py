"""Entry point of the aten_ops plugin."""

from __future__ import annotations

from thunderplug import ExecutorSpec, Priority, hookimpl


@hookimpl
def register_aten_ops(register) -> None:
    from thunderplug_aten_ops.ops import ALL_OPS

    for op in ALL_OPS:
        register(op)


@hookimpl
def register_executors(register) -> None:
    from thunderplug_aten_ops.executor import build_executor

    register(ExecutorSpec("aten", build_executor, Priority.DIRECT, "runs ATen symbols as the overloads themselves"))
