"""Entry point of the aten_ops plugin."""

from __future__ import annotations

from thunderplug import ExecutorSpec, Priority, hookimpl


@hookimpl
def register_aten_ops(register) -> None:
    from thunderplug_aten_ops.ops import aten_ops

    for op in aten_ops():
        register(op)


@hookimpl
def register_executors(register) -> None:
    from thunderplug_aten_ops.executor import build_executor

    register(
        ExecutorSpec(
            "aten",
            build_executor,
            Priority.DIRECT,
            "runs ATen symbols as the overloads themselves",
            runs_registered_aten_ops=True,
        )
    )
    from thunderplug_aten_ops import eager_kernels

    register(
        ExecutorSpec(
            eager_kernels.EXECUTOR_NAME,
            eager_kernels.build_executor,
            Priority.EAGER_KERNELS,
            "eager's ATen kernels, forward and backward, for GELU/LayerNorm/softmax/cross-entropy/NLL loss/SDPA",
        )
    )
    from thunderplug_aten_ops import backward_kernels

    register(
        ExecutorSpec(
            backward_kernels.EXECUTOR_NAME,
            backward_kernels.build_executor,
            Priority.EAGER_KERNELS,
            "eager's kernels and derivative formulas, forward and backward, for activations, clamp, pow, max/min, "
            "torch._grouped_mm, a batched linear's bias",
        )
    )
