"""Correct gradients for prims that implicitly broadcast a 0-dim CPU tensor operand.

Why: thunder's clang layer treats a 0-dim CPU tensor like a Python number and passes it to the
elementwise prims (``add``, ``mul``, ``where``, ``maximum``...) without expanding it
(``clang/utils.py:maybe_broadcast_impl``). The prims accept that, but their grad rules in
``thunder/core/transforms.py`` (``_add_prim_grad``, ``_mul_prim_grad``, ``_where_prim_grad``...)
give such an operand the full-shape cotangent instead of its sum. Under thunder 0.2.6 (and upstream
main) ``(x + x.sum()).sum()`` therefore gets a silently wrong gradient, and ``(x * y[0, 0]).sum()``
crashes in the backward with an ``expand`` error. See docs/overrides.md.

How: :func:`executor` is a grad-only executor that ``thunderplug.discover()`` lists right after the
core executor. thunder's autodiff asks executors in list order for a bound symbol's grad rule
(``core/transforms.py:_get_gradfn_and_executor``); ours answers only for one of the prims below,
and only when its checker sees an implicitly broadcast 0-dim tensor operand. Its grad transform
expands that operand explicitly (``broadcast_in_dim``, a view), runs thunder's own rule on the
now same-shaped operands, then sums the expanded operand's cotangent back to 0-dim. Everything
else falls through to thunder untouched. It is a plain ``Executor`` (neither an operator nor a
fusion executor), so it never claims or fuses anything for execution, and plain ``thunder.jit``
without ``discover()`` is not changed at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import thunder.torch as ltorch
from thunder.core import dtypes, prims, utils
from thunder.core.langctxs import Languages, langctx
from thunder.core.prims import PrimIDs, get_grad, put_grad
from thunder.core.proxies import TensorProxy
from thunder.core.pytree import tree_iter
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import get_tracectx
from thunder.core.transforms import augmented_forward_impls, backward_impls
from thunder.extend import Executor, ImplInfo

from thunderplug.thunder_compat import grad_fn_map

EXECUTOR_NAME = "thunderplug_broadcast_grads"

#: Prims whose meta lets a 0-dim CPU tensor operand broadcast against a larger tensor
#: (``utils.check_same_shape`` skips CPU scalar tensors). Only those with a thunder grad rule get an
#: override; for the others thunder already raises "Failed to find a gradient transform".
CANDIDATE_PRIMS: tuple[PrimIDs, ...] = (
    PrimIDs.ADD,
    PrimIDs.SUB,
    PrimIDs.MUL,
    PrimIDs.DIV,
    PrimIDs.POW,
    PrimIDs.MAXIMUM,
    PrimIDs.MINIMUM,
    PrimIDs.ATAN2,
    PrimIDs.FMOD,
    PrimIDs.REMAINDER,
    PrimIDs.NEXTAFTER,
    PrimIDs.WHERE,
    PrimIDs.LERP,
)


def _broadcast_target(args: tuple[Any, ...]) -> TensorProxy | None:
    """The operand whose shape the prim's result takes: the first tensor that is not a CPU scalar."""
    for arg in args:
        if isinstance(arg, TensorProxy) and not utils.is_cpu_scalar_tensor(arg):
            return arg
    return None


def implicitly_broadcast(args: tuple[Any, ...]) -> tuple[int, ...]:
    """Positions of 0-dim CPU tensor operands that the prim broadcasts without an explicit expand."""
    target = _broadcast_target(args)
    if target is None or target.ndim == 0:
        return ()
    return tuple(i for i, arg in enumerate(args) if isinstance(arg, TensorProxy) and utils.is_cpu_scalar_tensor(arg))


def _checker(*args: Any, **kwargs: Any) -> bool:
    # Only a floating-point operand can receive a wrong gradient (a bool ``where`` predicate cannot).
    return any(dtypes.is_inexact_dtype(args[i].dtype) for i in implicitly_broadcast(args))


def _aug_fwd_joint(prim_id: PrimIDs) -> Callable[..., Any]:
    """A joint forward+backward from thunder's ``augmented_forward_impls``/``backward_impls`` pair,
    built the same way ``transforms/autodiff.py:grad_transform_on_trace`` builds its ad hoc one."""
    aug_fwd, bwd = augmented_forward_impls[prim_id], backward_impls[prim_id]

    def joint(*args: Any, **kwargs: Any) -> Any:
        result, saved = aug_fwd(*args, **kwargs)
        grads_out = [get_grad(r) for r in tree_iter(result) if isinstance(r, TensorProxy)]
        grads_in = bwd(*saved, *grads_out)
        if isinstance(grads_in, dict):
            raise NotImplementedError(
                f"thunderplug: the gradient of {prim_id} with an implicitly broadcast 0-dim tensor operand "
                "is not supported (thunder's backward returns a mapping)"
            )
        if isinstance(grads_in, TensorProxy):
            grads_in = (grads_in,)
        for arg, grad in zip(args, grads_in):
            if isinstance(arg, TensorProxy) and isinstance(grad, TensorProxy):
                put_grad(arg, grad)
        return result

    return joint


def _upstream_joint(prim_id: PrimIDs) -> Callable[..., Any] | None:
    if prim_id in grad_fn_map():
        return grad_fn_map()[prim_id]
    if prim_id in augmented_forward_impls and prim_id in backward_impls:
        return _aug_fwd_joint(prim_id)
    return None


def _take_put_grads(scope: list[BoundSymbol], start: int, proxy: TensorProxy) -> TensorProxy | None:
    """The cotangent thunder's rule put for ``proxy`` (summed if put more than once), with those
    ``put_grad`` symbols removed from ``scope[start:]``.

    Why not ``get_grad(proxy)``: ``thunder.core.transforms.grad``/``vjp`` split a rule into forward
    and backward (``core/vjp_utils.py:make_aug_forward_and_backward``) by connecting only the
    ``put_grad`` of the rule's inputs and the ``get_grad`` of its outputs; a ``get_grad`` of the
    expanded operand, an intermediate, became a value the forward was asked to return but never
    computed (``KeyError: 't5'`` in thunder's test_phantom_grad_vs_torch_consistency_add)."""
    puts = [
        j
        for j in range(start, len(scope))
        if scope[j].sym.id == PrimIDs.PUT_GRAD and getattr(scope[j].args[0], "name", None) == proxy.name
    ]
    cotangents = [scope[j].args[1] for j in puts]
    for j in reversed(puts):
        del scope[j]
    total = cotangents[0] if cotangents else None
    for cotangent in cotangents[1:]:
        total = ltorch.add(total, cotangent)
    return total


def _make_grad_transform(prim_id: PrimIDs, upstream: Callable[..., Any]) -> Callable[..., Any]:
    @langctx(Languages.TORCH)
    def grad_transform(*args: Any, **kwargs: Any) -> Any:
        target = _broadcast_target(args)
        positions = implicitly_broadcast(args)
        expanded = list(args)
        for i in positions:
            operand = args[i]
            if operand.device != target.device:  # a CPU scalar next to a CUDA tensor
                operand = prims.device_put(operand, target.device)
            expanded[i] = prims.broadcast_in_dim(operand, tuple(target.shape), ())
        scope = get_tracectx().peek_scope()
        start = len(scope)
        result = upstream(*expanded, **kwargs)
        for i in positions:
            operand = args[i]
            cotangent = _take_put_grads(scope, start, expanded[i])
            if cotangent is None or not dtypes.is_inexact_dtype(operand.dtype):
                continue
            grad = ltorch.sum(cotangent)
            if grad.device != operand.device:
                grad = prims.device_put(grad, operand.device)
            put_grad(operand, grad)
        return result

    grad_transform.__name__ = f"broadcast_grad_{str(prim_id).rsplit('.', 1)[-1].lower()}"
    return grad_transform


class BroadcastGradExecutor(Executor):
    """Supplies grad transforms only; never executes or fuses (see the module docstring)."""

    def can_fuse(self, bsym: BoundSymbol) -> bool:
        # Only the prims themselves; never claim a composite because all its subsymbols match.
        return False

    def can_execute(self, bsym: BoundSymbol) -> bool:
        impl = self.implmap.get(bsym.sym.id)
        return impl is not None and impl.checker(*bsym.args, **bsym.kwargs)


_executor: BroadcastGradExecutor | None = None


def overridden_prims() -> tuple[PrimIDs, ...]:
    """The candidate prims that have a thunder grad rule, i.e. the ones this module overrides."""
    return tuple(pid for pid in CANDIDATE_PRIMS if _upstream_joint(pid) is not None)


def executor() -> BroadcastGradExecutor:
    """The process-wide grad-only executor (built on first use)."""
    global _executor
    if _executor is None:
        from thunderplug.plugin_api.version import __version__

        ex = BroadcastGradExecutor(EXECUTOR_NAME, version=__version__)
        for prim_id in CANDIDATE_PRIMS:
            upstream = _upstream_joint(prim_id)
            if upstream is not None:
                ex.implmap[prim_id] = ImplInfo(checker=_checker, grad_transform=_make_grad_transform(prim_id, upstream))
        _executor = ex
    return _executor
