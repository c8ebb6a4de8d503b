"""Claims turned into thunder executors; every checker answer goes to the compilation's record.

thunder asks executors in list order: the first that can execute an op decides its gradient rule
and executes it. ``discover()`` orders claim executors by priority, so a before-autodiff claim
(``Priority.BEFORE_AUTODIFF``) is asked right after the core executor, which steps aside for it,
and before any fuser, whatever the install order.

A plugin's claim can be wrong in two ordinary ways, and neither may reach the user's call as a
raw exception or a wrong number: a checker that raises declines (the plugin is reported failed),
and a claim forward whose outputs disagree with the op's own fake forward (shape, dtype, type,
flatten context) is refused at compile time with an error naming the claim, plugin and op.
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as torch_pytree
from thunder.core import dtypes
from thunder.core.proxies import TensorProxy
from thunder.core.pytree import tree_flatten
from thunder.extend import FusionExecutor, OperatorExecutor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from thunderplug.plugin_api.specs import AtenKernelClaim, Claim, FunctionClaim, FusionFilter, SubclassOpClaim
from thunderplug.subclass.autodiff import forward_and_backward
from thunderplug.subclass.dispatch import torch_function_of
from thunderplug.subclass.symbols import unrolled_op_symbol
from thunderplug.subclass.values import SubclassTensorProxy, subclass_op_id, to_fake_tensor
from thunderplug.tracing.aten import recorded_symbol, user_location
from thunderplug.tracing.compilation import Decision, current_record
from thunderplug.tracing.fake import fake_mode, to_fake

log = logging.getLogger("thunderplug")

#: Called with the error when a plugin's checker raises (the host marks that plugin failed).
OnError = Callable[[BaseException], None]


class ClaimError(RuntimeError):
    """A plugin's claim produced something the op it claims does not."""


def claim_executor(
    name: str, claims: list[Claim], *, plugin: str | None = None, on_error: OnError | None = None
) -> OperatorExecutor:
    """One executor for the claims a plugin made under ``name``."""
    executor = OperatorExecutor(name, version="claims")
    executor.whole_functions = {claim.target: claim.replacement for claim in claims if isinstance(claim, FunctionClaim)}
    executor.kernel_claims = [claim for claim in claims if isinstance(claim, AtenKernelClaim)]  # for explain
    origin = f"claim of executor {name!r}" + (f" (plugin {plugin!r})" if plugin else "")
    for claim in claims:
        if isinstance(claim, SubclassOpClaim):
            _claim_subclass_op(executor, claim, origin, on_error)
        elif isinstance(claim, AtenKernelClaim):
            _claim_aten_kernel(executor, claim, origin, on_error)
        # FunctionClaims are taken at interpretation time (the Function.apply lookaside);
        # FusionFilters restrict fusers (restrict_fusers).
    return executor


def _decide(executor: str, claim: Claim, target: str, reason: str | None) -> None:
    record = current_record()
    if record is not None:
        record.decide(Decision(executor, claim.stage, target, reason))


def _ask(claim: Claim, origin: str, on_error: OnError | None, *args: Any, **kwargs: Any) -> str | None:
    """The checker's answer; a checker that raises declines, and its plugin is reported."""
    try:
        return claim.checker(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - a plugin's bug must not reach the user's call
        log.warning("thunderplug: the checker of the %s on %s raised %r; declined", origin, claim.target, error)
        if on_error is not None:
            on_error(error)
        return f"checker raised {type(error).__name__}: {error}"


def _recording_checker(executor: OperatorExecutor, claim: Claim, origin: str, on_error: OnError | None):
    def check(*args: Any, **kwargs: Any) -> bool:
        reason = _ask(claim, origin, on_error, *args, **kwargs)
        _decide(executor.name, claim, claim.target, reason)
        return reason is None

    return check


def _claim_subclass_op(executor: OperatorExecutor, claim: SubclassOpClaim, origin: str, on_error: OnError | None):
    forward = unrolled_op_symbol(f"{claim.target}.{executor.name}.forward", claim.forward, differentiable=False)
    backward = unrolled_op_symbol(
        f"{claim.target}.{executor.name}.backward", _backward_of(claim.backward), differentiable=False
    )
    op = torch_function_of(claim.target)

    def checked_forward(*args: Any, **kwargs: Any) -> Any:
        result = forward(*args, **kwargs)
        _check_outputs(origin, claim.target, op, args, kwargs, result)
        return result

    def grad_transform(*args: Any, **kwargs: Any) -> Any:
        result = forward_and_backward(forward, backward, args, kwargs)
        _check_outputs(origin, claim.target, op, args, kwargs, result)
        return result

    executor.register_implementation(
        subclass_op_id(claim.target),
        checker=_recording_checker(executor, claim, origin, on_error),
        execution_transform=checked_forward,
        grad_transform=grad_transform,
    )


@functools.cache  # one wrapper per rule, so the backward symbol is built once, not per call
def _backward_of(backward: Callable[..., Any]) -> Callable[..., Any]:
    def run(args: tuple, kwargs: dict, cotangents: list, wanted: tuple[bool, ...] | None = None) -> list:
        # a claim's backward gives every gradient; the ones not wanted are dropped by the caller
        return list(backward(*args, *cotangents, **kwargs))

    run.__name__ = getattr(backward, "__name__", "backward")
    return run


def _check_outputs(origin: str, target: str, op: Callable[..., Any], args: tuple, kwargs: dict, result: Any) -> None:
    """Compare a claim's forward outputs with the op's own forward on fakes."""

    def fake(value: Any) -> Any:
        return to_fake_tensor(value) if isinstance(value, TensorProxy) else to_fake(value)

    with fake_mode():
        flat, spec = tree_flatten((args, kwargs))
        fake_args, fake_kwargs = spec.unflatten([fake(x) for x in flat])
        expected = torch_pytree.tree_leaves(op(*fake_args, **fake_kwargs))
    got = tree_flatten(result)[0]
    if len(got) != len(expected):
        raise ClaimError(f"the {origin} on {target} returns {len(got)} values, {target} returns {len(expected)}")
    for index, (mine, theirs) in enumerate(zip(got, expected)):
        if not isinstance(theirs, torch.Tensor):
            continue
        want = _describe_fake(theirs)
        have = _describe_proxy(mine)
        if have != want:
            raise ClaimError(
                f"the {origin} on {target} is wrong{user_location()}: output {index} is {have}, but {target} "
                f"gives {want}; fix the claim's forward"
            )


def _describe_fake(value: torch.Tensor) -> tuple:
    if is_traceable_wrapper_subclass(value):
        return (type(value).__name__, tuple(value.shape), value.dtype, value.__tensor_flatten__()[1])
    return ("Tensor", tuple(value.shape), value.dtype, None)


def _describe_proxy(value: Any) -> tuple:
    if isinstance(value, SubclassTensorProxy):
        return (value.subclass_type.__name__, tuple(value.shape), dtypes.to_torch_dtype(value.dtype), value.layout.ctx)
    if isinstance(value, TensorProxy):
        return ("Tensor", tuple(value.shape), dtypes.to_torch_dtype(value.dtype), None)
    return (type(value).__name__, (), None, None)


def _claim_aten_kernel(executor: OperatorExecutor, claim: AtenKernelClaim, origin: str, on_error: OnError | None):
    symbol = recorded_symbol(claim.overload)
    operation = executor.register_operator(
        f"{executor.name}_{claim.overload._opname}_{claim.overload._overloadname}", like=symbol, fn=claim.kernel
    )
    executor.register_implementation(symbol, operation, checker=_recording_checker(executor, claim, origin, on_error))


def restrict_fusers(executors: list, filters: list[FusionFilter]) -> list:
    """Apply fusion filters: each restricted fuser is replaced, in this list only, by a copy whose
    ``can_fuse`` also asks the filters (thunder's registered executor and plain ``thunder.jit``
    are untouched)."""
    by_fuser: dict[str, list[FusionFilter]] = {}
    for claim in filters:
        by_fuser.setdefault(claim.fuser, []).append(claim)
    result = []
    for executor in executors:
        claims = by_fuser.get(str(executor.name))
        if claims and isinstance(executor, FusionExecutor):
            executor = _restricted(executor, claims)
        result.append(executor)
    return result


def _restricted(fuser: FusionExecutor, filters: list[FusionFilter]) -> FusionExecutor:
    restricted = copy.copy(fuser)
    can_fuse = fuser.can_fuse

    def can_fuse_unless_declined(bsym: Any) -> bool:
        for claim in filters:
            reason = _ask(claim, f"fusion filter {claim.executor!r}", None, bsym)
            _decide(str(fuser.name), claim, bsym.sym.name, reason)
            if reason is not None:
                return False
        return can_fuse(bsym)

    restricted.can_fuse = can_fuse_unless_declined
    return restricted
