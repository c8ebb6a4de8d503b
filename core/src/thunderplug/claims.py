"""Claims turned into thunder executors, and the record of who declined what and why.

thunder asks executors in list order: the first that can execute an op decides its gradient rule
and executes it. ``discover()`` orders claim executors by priority, so a before-autodiff claim
(``Priority.BEFORE_AUTODIFF``) is asked right after the core executor, which steps aside for it,
and before any fuser, whatever the install order.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from thunder.extend import FusionExecutor, OperatorExecutor

from thunderplug.specs import Claim, Stage


@dataclass(frozen=True)
class Decision:
    """One answer of a claim's checker: accepted (``reason is None``) or declined and why."""

    executor: str
    stage: str
    target: str
    reason: str | None


decisions: dict[tuple[str, str], Decision] = {}  # (executor, target) -> latest answer


def claim_executor(name: str, claims: list[Claim]) -> OperatorExecutor:
    executor = OperatorExecutor(name, version="claims")
    executor.whole_functions = {claim.function_name for claim in claims if claim.whole_function}
    for claim in claims:
        if claim.whole_function:
            continue  # taken at interpretation time: patches._autograd_function_apply
        if claim.stage == Stage.BEFORE_AUTODIFF:
            _claim_subclass_op(executor, claim)
        else:
            _claim_aten_op(executor, claim)
    return executor


def _recording_checker(executor: OperatorExecutor, claim: Claim) -> Callable[..., bool]:
    target = str(claim.target)

    def check(*args: Any, **kwargs: Any) -> bool:
        reason = claim.checker(*args, **kwargs)
        decisions[(executor.name, target)] = Decision(executor.name, claim.stage, target, reason)
        return reason is None

    return check


def _claim_subclass_op(executor: OperatorExecutor, claim: Claim) -> None:
    from thunderplug.core_executor import active_core_executor
    from thunderplug.subclass_autodiff import forward_and_backward
    from thunderplug.subclass_ops import subclass_op_symbol, torch_function_of

    target = str(claim.target)

    def symbols():
        table = active_core_executor().aten
        forward = claim.forward or torch_function_of(target)
        return (
            subclass_op_symbol(f"{target}.{executor.name}.forward", forward, table, differentiable=False),
            subclass_op_symbol(f"{target}.{executor.name}.backward", _backward_of(claim.backward), table, differentiable=False),
        )

    def execution_transform(*args: Any, **kwargs: Any) -> Any:
        return symbols()[0](*args, **kwargs)

    def grad_transform(*args: Any, **kwargs: Any) -> Any:
        return forward_and_backward(*symbols(), args, kwargs)

    executor.register_implementation(
        f"thunderplug.subclass.{target}",
        checker=_recording_checker(executor, claim),
        execution_transform=execution_transform,
        grad_transform=grad_transform,
    )


@functools.cache  # one wrapper per rule, so the backward symbol is built once, not per call
def _backward_of(backward: Callable[..., Any]) -> Callable[..., Any]:
    def run(args: tuple, kwargs: dict, cotangents: list) -> list:
        return list(backward(*args, *cotangents, **kwargs))

    run.__name__ = getattr(backward, "__name__", "backward")
    return run


def _claim_aten_op(executor: OperatorExecutor, claim: Claim) -> None:
    from thunderplug.aten import registered_symbol

    symbol = registered_symbol(claim.target)
    operation = executor.register_operator(
        f"{executor.name}_{claim.target._opname}_{claim.target._overloadname}", like=symbol, fn=claim.forward
    )
    executor.register_implementation(symbol, operation, checker=_recording_checker(executor, claim))


def restrict_fusers(executors: list, fusion_claims: list[Claim]) -> list:
    """Apply ``Stage.FUSION`` claims: each restricted fuser is replaced, in this list only, by a
    copy whose ``can_fuse`` also asks the claims' checkers (thunder's registered executor and
    plain ``thunder.jit`` are untouched)."""
    by_fuser: dict[str, list[Claim]] = {}
    for claim in fusion_claims:
        by_fuser.setdefault(str(claim.target), []).append(claim)
    result = []
    for executor in executors:
        claims = by_fuser.get(str(executor.name))
        if claims and isinstance(executor, FusionExecutor):
            executor = _restricted(executor, claims)
        result.append(executor)
    return result


def _restricted(fuser: FusionExecutor, claims: list[Claim]) -> FusionExecutor:
    restricted = copy.copy(fuser)
    can_fuse = fuser.can_fuse

    def can_fuse_unless_declined(bsym: Any) -> bool:
        for claim in claims:
            reason = claim.checker(bsym)
            decisions[(str(fuser.name), bsym.sym.name)] = Decision(claim.executor, Stage.FUSION, bsym.sym.name, reason)
            if reason is not None:
                return False
        return can_fuse(bsym)

    restricted.can_fuse = can_fuse_unless_declined
    return restricted
