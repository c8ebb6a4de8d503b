"""The ``aten`` executor: runs ATen symbols as the overloads themselves, one call each.

It sits after the fusers (``Priority.DIRECT``): whatever no fuser took runs as a single ATen call
instead of a chain of decomposed prims. It takes exactly the overloads the host registered for the
compilation in progress (the ATen table of ``discover()``'s list, whichever plugins registered
them), not a list of its own; each gets its operator on first use.
"""

from __future__ import annotations

import threading
from typing import Any

from thunder.core.symbol import BoundSymbol, Symbol
from thunder.extend import OperatorExecutor

from thunderplug.tracing.aten import active_table, kernel_meta, runner


class AtenExecutor(OperatorExecutor):
    """Executes an ATen symbol when the active compilation's table has it registered."""

    def __init__(self) -> None:
        super().__init__("aten", version="0.1.0")
        self._lock = threading.Lock()
        self._built_for: dict[str, Symbol] = {}

    def can_execute(self, bsym: BoundSymbol) -> bool:
        table = active_table()
        overload = table.registered_overload(bsym.sym) if table is not None else None
        if overload is None:
            return False
        self._ensure_operator(bsym.sym, overload)
        return super().can_execute(bsym)

    def _ensure_operator(self, symbol: Symbol, overload: Any) -> None:
        """One operator per ATen symbol. Its meta is the overload's fake kernel (cached), not the
        symbol's decomposition: claiming runs the operator's meta once per op of every trace."""
        with self._lock:
            if self._built_for.get(symbol.id) is symbol:
                return
            name = f"aten_{overload._opname}_{overload._overloadname}"
            operator = self.register_operator(name, meta=kernel_meta(overload), fn=runner(overload))
            self.register_implementation(symbol, operator)
            self._built_for[symbol.id] = symbol


def build_executor() -> OperatorExecutor:
    """The executor, not added to thunder's registry of executors (``thunder.get_all_executors()``
    lists thunder's own: thunderplug's are reached through ``discover()``'s list)."""
    return AtenExecutor()
