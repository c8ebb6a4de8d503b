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


class Stage:
    """When a claim is decided (docs/claims.md)."""

    BEFORE_AUTODIFF = "before autodiff"  #: takes a subclass op whole, with its own fwd+bwd
    AFTER_UNROLLING = "after unrolling"  #: takes an ATen op of the unrolled program
    FUSION = "fusion"  #: restricts which operations a fusion executor may take


@dataclass(frozen=True)
class Claim:
    """One op an executor takes, decided by ``checker`` on the op's arguments (proxies).

    ``checker`` returns ``None`` to accept or a short reason to decline ("needs CUDA", "K not
    divisible by 16"); ``thunderplug.explain`` shows the reasons. Implementations are written in
    torch and run on the op's real argument types:

    * ``Stage.BEFORE_AUTODIFF``, ``target`` a subclass op name such as
      ``"Float8TrainingTensor.torch.mm"``: ``forward(*args)`` computes the op and
      ``backward(*args, grad)`` returns one gradient per tensor argument (``None`` for none). Both
      are traced on FakeTensors and unrolled into ATen ops like any subclass op, so the rule
      replaces autodiff of the op, never the subclass's dispatch.
    * ``Stage.AFTER_UNROLLING``, ``target`` an ATen overload: ``forward(*args, **kwargs)`` runs it
      (e.g. a library kernel) instead of its decomposition.
    * ``Stage.FUSION``, ``target`` the name of a fusion executor (``"torchcompile"``): it may only
      fuse an operation when ``checker(bsym)`` (the bound symbol) returns ``None``.
    * ``Stage.BEFORE_AUTODIFF``, ``target`` a ``torch.autograd.Function`` class (or its dotted
      path, ``"torchao.float8.float8_linear.matmul_with_hp_or_float8_args"``), no forward or
      backward: calls of its ``apply`` become one op, traced by running the Function itself on
      FakeTensors (its forward, and its own backward through ``torch.autograd.grad``) instead of
      thunder interpreting its Python code line by line. Much faster to compile for library
      Functions such as torchao's ``matmul_with_hp_or_float8_args``.
    """

    executor: str
    stage: str
    target: Any
    checker: Callable[..., str | None]
    forward: Callable[..., Any] | None = None
    backward: Callable[..., Any] | None = None
    priority: int = Priority.BEFORE_AUTODIFF

    @property
    def whole_function(self) -> bool:
        """True for a claim on a whole ``torch.autograd.Function`` (no forward or backward given)."""
        return self.stage == Stage.BEFORE_AUTODIFF and self.forward is None and self.backward is None

    @property
    def function_name(self) -> str:
        """``module.QualName`` of a whole-Function target (a class, or that dotted path as a string,
        which lets a plugin claim a library's Function without importing the library)."""
        target = self.target
        return target if isinstance(target, str) else f"{target.__module__}.{target.__qualname__}"

    def __post_init__(self) -> None:
        if not _NAME.match(self.executor):
            raise ValueError(f"executor name {self.executor!r} must match {_NAME.pattern}")
        if self.stage not in (Stage.BEFORE_AUTODIFF, Stage.AFTER_UNROLLING, Stage.FUSION):
            raise ValueError(f"unknown claim stage {self.stage!r}")
        if self.stage == Stage.BEFORE_AUTODIFF and self.backward is None and not self.whole_function:
            raise ValueError(f"a before-autodiff claim of {self.target} needs a backward")
        if self.stage == Stage.AFTER_UNROLLING and self.forward is None:
            raise ValueError(f"an after-unrolling claim of {self.target} needs a forward")
