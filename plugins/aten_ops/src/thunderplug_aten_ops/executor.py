"""The ``aten`` executor: runs ATen symbols as the overloads themselves, one call each.

It sits after the fusers (``Priority.DIRECT``): whatever no fuser took runs as a single ATen call
instead of a chain of decomposed prims.
"""

from __future__ import annotations

from thunder.extend import OperatorExecutor, register_executor

from thunderplug.aten import symbol_for
from thunderplug_aten_ops.ops import ALL_OPS


def build_executor() -> OperatorExecutor:
    executor = OperatorExecutor("aten", version="0.1.0")
    register_executor(executor)
    for op in ALL_OPS:
        symbol = symbol_for(op)
        impl = executor.register_operator(
            f"aten_{op.overload._opname}_{op.overload._overloadname}", like=symbol, fn=op.overload
        )
        executor.register_implementation(symbol, impl)
    return executor
