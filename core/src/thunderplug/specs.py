"""The records plugins hand to the core through the ``register_*`` hooks.

Plugins describe what they provide as frozen data; the core decides when to build it. Nothing
here imports thunder, so loading a plugin's hook module stays cheap.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class Priority:
    """Named priorities for :class:`ExecutorSpec`; higher runs first in ``executors=``.

    thunder asks executors in list order, both for a symbol's gradient rule and for who executes
    it, so the order is the precedence. These bands make it explicit data instead of an accident
    of install order.
    """

    CORE = 1000  #: thunderplug's own interpretation-time executor
    BEFORE_AUTODIFF = 500  #: executors that claim an op whole, with their own fwd+bwd
    FUSER = 100  #: fusion executors (nvFuser, torch.compile regions)
    DIRECT = 10  #: run what is left op by op (e.g. ATen overloads as themselves)


@dataclass(frozen=True)
class ExecutorSpec:
    """One thunder executor a plugin provides.

    ``factory`` builds the :class:`thunder.extend.Executor` and is only called when the executor is
    selected, so unused executors never import their heavy dependencies.
    """

    name: str
    factory: Callable[[], Any]
    priority: int = Priority.DIRECT
    description: str = ""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"executor name {self.name!r} must match {_NAME.pattern}")


@dataclass(frozen=True)
class AtenOp:
    """A ``torch.ops.aten`` overload made into a thunder symbol.

    ``decomposition`` receives thunder proxies with the overload's own signature and returns what
    the overload returns, built from thunder prims/clang/ltorch calls; it becomes the symbol's
    subsymbols. ``differentiable=False`` marks ops whose gradient is undefined (integer results,
    fp8 GEMMs): asking for a gradient through them is an error naming the op.
    """

    overload: Any  # torch._ops.OpOverload
    decomposition: Callable[..., Any]
    differentiable: bool = True

    @property
    def qualified_name(self) -> str:
        """``torch.ops.aten.add.Tensor``: the symbol id and how traces print it."""
        return f"torch.ops.{self.overload.namespace}.{self.overload._opname}.{self.overload._overloadname}"
