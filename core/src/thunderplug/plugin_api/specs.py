"""The records plugins hand to the core through the ``register_*`` hooks.

Plugins describe what they provide as frozen data; the core decides when to build it. Nothing
here imports thunder, so loading a plugin's hook module stays cheap.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from thunder.extend import Executor

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class Priority:
    """Named priorities for :class:`ExecutorSpec`; higher runs first in ``executors=``.

    thunder asks executors in list order, both for a symbol's gradient rule and for who executes
    it, so the order is the precedence. These bands make it explicit data instead of an accident
    of install order.
    """

    CORE = 1000  #: thunderplug's own interpretation-time executor
    GRADIENT_RULES = 900  #: executors that only answer gradient rules (thunderplug_broadcast_grads)
    BEFORE_AUTODIFF = 500  #: executors that claim an op whole, with their own fwd+bwd
    #: thunderplug-aten's executors that run ops with eager's own kernels: ahead of the fusers, behind
    #: every plugin's claims (a plugin that takes an op itself is asked first)
    EAGER_KERNELS = 400
    FUSER = 100  #: fusion executors (nvFuser, torch.compile regions)
    DIRECT = 10  #: run what is left op by op (e.g. ATen overloads as themselves)


def priority_ahead_of(priority: int) -> str:
    """A priority that puts an executor before one of ``priority`` in discover()'s order, as written in a plugin."""
    if priority < Priority.BEFORE_AUTODIFF:
        return "Priority.BEFORE_AUTODIFF"
    return str(priority + 1)


@dataclass(frozen=True)
class ExecutorSpec:
    """One thunder executor a plugin provides.

    ``factory`` builds the :class:`thunder.extend.Executor` and is only called when the executor is
    selected, so unused executors never import their heavy dependencies. ``unavailable_reason``,
    when given, says why this one executor cannot run here (``None``: it can); it is asked before
    the factory, so one plugin can offer executors for different machines (nvFuser on CUDA, a
    torch.compile fuser elsewhere) through one entry point. ``runs_registered_aten_ops`` says the
    executor takes every call of every ATen overload a plugin registered (thunderplug-aten's
    ``aten``), so that a kernel claim listed after it is reported as shadowed.
    """

    name: str
    factory: Callable[[], Executor]
    priority: int = Priority.DIRECT
    description: str = ""
    unavailable_reason: Callable[[], str | None] | None = None
    runs_registered_aten_ops: bool = False

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"executor name {self.name!r} must match {_NAME.pattern}")


@dataclass(frozen=True)
class AtenOp:
    """A ``torch.ops.aten`` overload made into a thunder symbol.

    ``decomposition`` receives thunder proxies with the overload's own signature and returns what
    the overload returns, built from thunder prims/clang/ltorch calls; it becomes the symbol's
    subsymbols. ``differentiable=False`` marks ops without a derivative (comparisons, argmax, fp8
    GEMMs): as in eager, inputs may require grad and integer/bool outputs simply carry none; a
    gradient that really flows into a floating-point output is an error naming the op and line.
    """

    overload: Any  # torch._ops.OpOverload
    decomposition: Callable[..., Any]
    differentiable: bool = True

    @property
    def qualified_name(self) -> str:
        """``torch.ops.aten.add.Tensor``: the symbol id and how traces print it."""
        return f"torch.ops.{self.overload.namespace}.{self.overload._opname}.{self.overload._overloadname}"


class Stage(str, Enum):
    """When a claim is decided (docs/claims.md)."""

    BEFORE_AUTODIFF = "before autodiff"  #: takes a subclass op or a whole autograd.Function, with its own fwd+bwd
    AFTER_UNROLLING = "after unrolling"  #: takes an ATen op of the unrolled program
    FUSION = "fusion"  #: restricts which operations a fusion executor may take

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


#: A checker returns ``None`` to accept, or a short reason to decline ("K not divisible by 16");
#: ``thunderplug explain`` shows the reasons.
Checker = Callable[..., "str | None"]


def accept_all(*args: Any, **kwargs: Any) -> None:
    """The checker of a claim that takes every call."""
    return None


def _check_executor_name(name: str) -> None:
    if not _NAME.match(name):
        raise ValueError(f"executor name {name!r} must match {_NAME.pattern}")


@dataclass(frozen=True)
class SubclassOpClaim:
    """An executor takes a subclass op before autodiff, with its own forward and backward.

    ``target`` names the op as traces show it: ``"Float8TrainingTensor.torch.mm"`` (class name, then
    the torch function's dotted path). ``forward(*args)`` and ``backward(*args, *cotangents)`` are
    written in torch and traced on the op's real argument types (fakes of the subclass); the
    backward returns one gradient per tensor argument.
    """

    executor: str
    target: str
    checker: Checker
    forward: Callable[..., Any]
    backward: Callable[..., Any]
    priority: int = Priority.BEFORE_AUTODIFF
    stage: ClassVar[Stage] = Stage.BEFORE_AUTODIFF

    def __post_init__(self) -> None:
        _check_executor_name(self.executor)
        class_name, _, path = self.target.partition(".")
        if not class_name or not path.startswith("torch."):
            raise ValueError(
                f"claim target {self.target!r} must be '<SubclassName>.torch.<function>' "
                "(e.g. 'Float8TrainingTensor.torch.mm')"
            )
        if not callable(torch_attribute(path)):
            raise ValueError(f"claim target {self.target!r} names no torch function: {path} does not exist")


@dataclass(frozen=True)
class FunctionClaim:
    """An executor takes every ``apply`` of a whole ``torch.autograd.Function`` before autodiff.

    The call becomes one op traced by running the Function itself on FakeTensors (its forward,
    and its own backward through ``torch.autograd.grad``) instead of thunder interpreting its
    Python line by line. ``function`` is the class or its dotted path
    (``"torchao.float8.float8_linear.matmul_with_hp_or_float8_args"``), so a plugin can claim a
    library's Function without importing the library.
    """

    executor: str
    function: type | str
    checker: Checker = accept_all
    priority: int = Priority.BEFORE_AUTODIFF
    #: traced instead of ``function.apply`` when given: a callable with the same arguments, values
    #: and gradients, written so that its forward and backward share expressions CSE can merge
    replacement: Callable[..., Any] | None = None
    stage: ClassVar[Stage] = Stage.BEFORE_AUTODIFF

    def __post_init__(self) -> None:
        _check_executor_name(self.executor)

    @property
    def target(self) -> str:
        """``module.QualName`` of the Function."""
        function = self.function
        return function if isinstance(function, str) else f"{function.__module__}.{function.__qualname__}"


@dataclass(frozen=True)
class AtenKernelClaim:
    """An executor runs an ATen overload with its own ``kernel`` instead of its decomposition.

    It applies where the overload is in the traces thunder's executors claim from (docs/claims.md):
    the ATen ops of unrolled subclass ops (forward and backward), and direct ``torch.ops.aten``
    calls of a program that computes no gradient. The default priority puts the claim ahead of
    fusers and of thunderplug-aten's ``aten`` executor, which would otherwise run the op first.
    """

    executor: str
    overload: Any  # torch._ops.OpOverload
    kernel: Callable[..., Any]
    checker: Checker = accept_all
    priority: int = Priority.BEFORE_AUTODIFF
    stage: ClassVar[Stage] = Stage.AFTER_UNROLLING

    def __post_init__(self) -> None:
        _check_executor_name(self.executor)

    @property
    def target(self) -> str:
        return f"torch.ops.{self.overload.namespace}.{self.overload._opname}.{self.overload._overloadname}"


@dataclass(frozen=True)
class FusionFilter:
    """Restricts what the fusion executor named ``fuser`` may take: an operation is fused only if
    ``checker(bsym)`` accepts it. ``executor`` names the filter in ``explain``."""

    executor: str
    fuser: str
    checker: Checker
    stage: ClassVar[Stage] = Stage.FUSION
    priority: ClassVar[int] = Priority.FUSER

    def __post_init__(self) -> None:
        _check_executor_name(self.executor)

    @property
    def target(self) -> str:
        return self.fuser


def torch_attribute(path: str) -> Any:
    """``torch.nn.functional.linear`` -> that object, or ``None`` (imports torch only when asked)."""
    import torch

    target: Any = torch
    for part in path.split(".")[1:]:
        target = getattr(target, part, None)
        if target is None:
            return None
    return target


#: Everything ``register_claims`` accepts.
Claim = SubclassOpClaim | FunctionClaim | AtenKernelClaim | FusionFilter
CLAIM_TYPES: tuple[type, ...] = (SubclassOpClaim, FunctionClaim, AtenKernelClaim, FusionFilter)
