"""The ``aten`` executor: runs ATen symbols as the overloads themselves, one call each.

It sits after the fusers (``Priority.DIRECT``): whatever no fuser took runs as a single ATen call
instead of a chain of decomposed prims.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from thunder.core import devices, dtypes
from thunder.extend import OperatorExecutor, register_executor
from torch.utils._pytree import tree_map

from thunderplug.aten import symbol_for
from thunderplug_aten_ops.ops import ALL_OPS

_THUNDER_VALUED_TYPES = ("ScalarType", "Device")


def _to_torch(x: Any) -> Any:
    if isinstance(x, dtypes.dtype):
        return dtypes.to_torch_dtype(x)
    if isinstance(x, devices.Device):
        return devices.to_torch_device(x)
    return x


def _runner(overload: Any) -> Callable[..., Any]:
    """The overload itself, or (when it takes a dtype or device, which traces hold as thunder
    objects) a wrapper converting those back to torch's."""
    if not any(t in str(arg.type) for arg in overload._schema.arguments for t in _THUNDER_VALUED_TYPES):
        return overload

    def run(*args: Any, **kwargs: Any) -> Any:
        return overload(*tree_map(_to_torch, args), **tree_map(_to_torch, kwargs))

    return run


def build_executor() -> OperatorExecutor:
    executor = OperatorExecutor("aten", version="0.1.0")
    register_executor(executor)
    for op in ALL_OPS:
        symbol = symbol_for(op)
        impl = executor.register_operator(
            f"aten_{op.overload._opname}_{op.overload._overloadname}", like=symbol, fn=_runner(op.overload)
        )
        executor.register_implementation(symbol, impl)
    return executor
