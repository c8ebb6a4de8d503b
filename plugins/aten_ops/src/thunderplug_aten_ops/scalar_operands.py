"""Elementwise ops on float16/bfloat16 tensors with a Python number or a 0-dim tensor operand, run as eager runs
them (part of the ``eager_backward_kernels`` executor): ``x + 0.7``, ``0.7 - x``, ``x * s`` with ``s`` a 0-dim
float32 tensor requiring grad, ``torch.atan2(x, torch.tensor(0.3))``, ``torch.lerp(x, y, s)``.

Why: under grad thunder differentiates ``ltorch.add`` and its kin through its decomposition, which computes in
float32 (``x`` converted, ``prims.add(t, 0.7)``, converted back). Eager's kernels do not: on CPU, TensorIterator
casts a number (or a 0-dim tensor) to the result's dtype before adding (``x + 0.7`` adds float16 0.7002), and the
CUDA kernels keep a CPU scalar in float ``opmath`` instead, so the right rounding is the device's kernel's. A
wider 0-dim operand's gradient is eager's ``grad * other`` in the result's dtype, summed to its shape and cast to
its dtype by the engine, where thunder summed in float32 (ulps of float16 apart). ``lerp`` with a 0-dim float32
weight failed (no rule for ``prims.lerp`` on the converted operands), ``div`` with a rounding mode likewise
(``prims.trunc``). Without grad the ``torch`` executor runs the symbol as the torch function, as eager does,
except with the number first: ``0.7 * x`` ran ``torch.mul(0.7, x)``, which casts the number (eager's
``x.__rmul__(0.7)`` is ``x.mul(0.7)``, whose CPU kernel keeps it in float), and ``0.7 / x`` ran
``torch.true_divide(0.7, x)`` (eager's ``__rtruediv__`` is ``x.reciprocal() * 0.7``).

How: where the dimensioned tensor operands are one float16 or bfloat16 dtype, another operand is a number or a
0-dim float tensor, and an operand requires grad (asked while autodiff runs), the op is one operator calling the
torch function on the real tensors (eager's kernel, whatever the device), with a number first in eager's
reflected form (:data:`CALLS`); its backward is one operator running the call again under grad on detached
copies of the inputs that require grad and asking eager's own engine for their gradients (``derivatives.yaml``'s
formulas in eager's dtypes, ``sum_to_size``, the cast to the input's dtype), as ``normalize``'s and the math
SDPA's rules do (not ``x * 0.7`` and ``x / 0.7``: eager's CPU kernels keep that number in float, as thunder's
float32 computation does, which fuses). The number-first ``mul``/``true_divide`` forms are taken without grad
too. ``div``, ``true_divide``, ``atan2`` and ``fmod`` are taken under grad whatever their float16/bfloat16
operands, dimensioned ones too: their gradients' formulas round op by op in eager (``x / y``'s for ``y`` is
``-grad * ((x / y) / y)`` in float16), thunder's in float32 once (:data:`_ANY_OPERANDS`). float32 and float64
programs are left as they were (bit-identical, and fusable).

A rule the executor already has for a symbol (``pow``, ``mul``, ``div``, ``remainder``, ``lerp``) is kept for the
calls this one declines (:func:`register`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from numbers import Number
from typing import Any

import thunder.torch as ltorch
import torch
from thunder.core import dtypes
from thunder.core.proxies import TensorProxy
from thunder.core.transforms import get_grad, put_grad
from thunder.extend import ImplInfo, OperatorExecutor

from thunderplug.eager.output_grads import requires_grad
from thunderplug.tracing.fake import to_torch_value
from thunderplug_aten_ops.eager_kernels import _float, _proxy_like, _to_meta

_HALF = (dtypes.float16, dtypes.bfloat16)


def _is_number(a: Any) -> bool:
    return isinstance(a, Number) and not isinstance(a, (bool, complex))


def _add(a, b, alpha=1):
    if _is_number(a):  # ``0.7 + x``: eager's ``x.__radd__(0.7)``
        return torch.add(b, a)
    return torch.add(a, b) if alpha == 1 else torch.add(a, b, alpha=alpha)


def _sub(a, b, alpha=1):
    if _is_number(a):  # ``0.7 - x``: eager's ``x.__rsub__(0.7)``, ``torch.rsub(x, 0.7)``
        return torch.rsub(b, a)
    return torch.sub(a, b) if alpha == 1 else torch.sub(a, b, alpha=alpha)


def _mul(a, b):
    return torch.mul(b, a) if _is_number(a) else torch.mul(a, b)  # ``0.7 * x``: ``x.__rmul__(0.7)``


def _true_divide(a, b):
    if _is_number(a):  # ``0.7 / x``: eager's ``Tensor.__rtruediv__``
        return b.reciprocal() * a
    return torch.true_divide(a, b)


def _div(a, b, rounding_mode=None, out=None):
    if rounding_mode is None:
        return _true_divide(a, b)
    return torch.div(a, b, rounding_mode=rounding_mode)


def _accepts_add(a, b, alpha=1) -> bool:
    return not _is_number(a) or alpha == 1  # ``alpha`` with a number first: no eager form


def _accepts_div(a, b, rounding_mode=None, out=None) -> bool:
    return out is None and (not _is_number(a) or rounding_mode is None)


def _tensor_first(a, *rest, **kwargs) -> bool:
    """A number first: eager's ``2 ** x`` and ``2 % x`` are the executor's other rules; ``fmod``/``atan2`` have none."""
    return isinstance(a, TensorProxy)


def _lerp_operands(start, end, weight) -> bool:
    return isinstance(start, TensorProxy) and isinstance(end, TensorProxy) and start.dtype == end.dtype


#: ltorch symbol -> (eager's call on the symbol's arguments in its order, which calls to take beyond the dtypes,
#: the parameters that are operands (a number in one of them counts))
CALLS: dict[Any, tuple[Callable[..., Any], Callable[..., bool], tuple[int, ...]]] = {
    ltorch.add: (_add, _accepts_add, (0, 1, 2)),
    ltorch.sub: (_sub, _accepts_add, (0, 1, 2)),
    ltorch.mul: (_mul, lambda a, b: True, (0, 1)),
    ltorch.true_divide: (_true_divide, lambda a, b: True, (0, 1)),
    ltorch.div: (_div, _accepts_div, (0, 1)),
    ltorch.pow: (torch.pow, _tensor_first, (0, 1)),
    ltorch.atan2: (torch.atan2, _tensor_first, (0, 1)),
    ltorch.remainder: (torch.remainder, _tensor_first, (0, 1)),
    ltorch.fmod: (torch.fmod, _tensor_first, (0, 1)),
    ltorch.lerp: (torch.lerp, _lerp_operands, (0, 1, 2)),
}

#: symbols whose number-first form the ``torch`` executor runs otherwise than eager, with or without grad
_NUMBER_FIRST = (ltorch.mul, ltorch.true_divide, ltorch.div)

#: symbols whose gradients differ from eager's in float16/bfloat16 whatever the operands, dimensioned ones too:
#: thunder computes the formula in float32 and rounds once, eager op by op in the result's dtype (``x / y``'s
#: gradient for ``y``, ``-grad * ((x / y) / y)``; ``atan2``'s for both; ``fmod``'s for ``other``)
_ANY_OPERANDS = (ltorch.true_divide, ltorch.div, ltorch.atan2, ltorch.fmod)

#: symbols left to thunder with a tensor first and a number second, where its float32 computation is eager's:
#: eager's CPU ``mul`` and ``div`` kernels keep a number in float for float16/bfloat16 tensors (as CUDA's do),
#: and the gradient ``grad * 0.7`` / ``grad / 0.7`` likewise; left to thunder, they fuse
_NUMBER_KEPT_IN_FLOAT = (ltorch.mul, ltorch.true_divide, ltorch.div)


class _Call:
    """One symbol's arguments as a flat tuple in its signature's order (defaults filled in)."""

    def __init__(self, symbol: Any):
        self.signature = inspect.signature(symbol.meta)

    def flat(self, args: tuple, kwargs: dict) -> tuple:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return tuple(bound.arguments.values())


def _half_operands(operands: list[Any], scalar: bool) -> bool:
    """Plain float tensors whose dimensioned ones are one float16/bfloat16 dtype, and numbers; with ``scalar``, a
    number (a non-default ``alpha`` too) or a 0-dim tensor among them."""
    tensors = [a for a in operands if isinstance(a, TensorProxy)]
    if not tensors or not all(_float(t) for t in tensors) or not all(
            _is_number(a) for a in operands if not isinstance(a, TensorProxy)):
        return False
    dimensioned = {dtypes.to_strong_dtype(t.dtype) for t in tensors if t.ndim}
    if len(dimensioned) != 1 or next(iter(dimensioned)) not in _HALF:
        return False
    return not scalar or any(not isinstance(a, TensorProxy) or a.ndim == 0 for a in operands)


def _operators(executor: OperatorExecutor, name: str, fn: Callable[..., Any]) -> tuple[Any, Any]:
    """The forward and backward operators of one symbol (flat arguments)."""

    def forward_meta(*flat: Any) -> TensorProxy:
        tensors = [a for a in flat if isinstance(a, TensorProxy)]
        device = next((t.device for t in tensors if t.ndim), tensors[0].device)
        out = fn(*(_to_meta(a) for a in flat))
        return _proxy_like(out, device, any(t.requires_grad for t in tensors))

    def forward(*flat: Any) -> torch.Tensor:
        return fn(*(to_torch_value(a) for a in flat))

    def backward_meta(grad: TensorProxy, positions: tuple, *flat: Any) -> tuple:
        return tuple(TensorProxy(like=flat[i], requires_grad=False) for i in positions)

    def backward(grad: torch.Tensor, positions: tuple, *flat: Any) -> tuple:
        flat = [to_torch_value(a) for a in flat]
        with torch.enable_grad():
            for i in positions:
                flat[i] = flat[i].detach().requires_grad_()
            out = fn(*flat)
            found = torch.autograd.grad(out, [flat[i] for i in positions], grad, allow_unused=True)
        return tuple(torch.zeros_like(flat[i]) if g is None else g for i, g in zip(positions, found))

    return (executor.register_operator(f"eager_{name}_scalar_operand", meta=forward_meta, fn=forward),
            executor.register_operator(f"eager_{name}_scalar_operand_backward", meta=backward_meta, fn=backward))


def _rule(symbol: Any, previous: ImplInfo | None, executor: OperatorExecutor) -> tuple[Callable, Callable, Callable]:
    """The checker, execution transform and grad transform of one symbol: this module's where ``ours`` takes the
    call, ``previous``'s otherwise."""
    fn, accepts, operand_positions = CALLS[symbol]
    call = _Call(symbol)
    forward, backward = _operators(executor, symbol.name, fn)

    def ours(args: tuple, kwargs: dict) -> tuple | None:
        """The flat arguments where this rule takes the call, else None."""
        try:
            flat = call.flat(args, kwargs)
        except TypeError:
            return None
        operands = [flat[i] for i in operand_positions if i < len(flat)]
        if symbol in (ltorch.add, ltorch.sub) and _is_number(flat[2]) and flat[2] == 1:
            operands = operands[:2]  # the default alpha is no operand
        if not (_half_operands(operands, symbol not in _ANY_OPERANDS) and accepts(*flat)):
            return None
        if (symbol in _NUMBER_KEPT_IN_FLOAT and isinstance(flat[0], TensorProxy) and _is_number(flat[1])
                and (symbol is not ltorch.div or flat[2] is None)):
            return None
        tensors = [a for a in operands if isinstance(a, TensorProxy)]
        if any(requires_grad(t) for t in tensors):
            return flat
        return flat if symbol in _NUMBER_FIRST and _is_number(flat[0]) else None

    def checker(*args: Any, **kwargs: Any) -> bool:
        if ours(args, kwargs) is not None:
            return True
        return previous is not None and (previous.checker is None or previous.checker(*args, **kwargs))

    def execute(*args: Any, **kwargs: Any) -> Any:
        flat = ours(args, kwargs)
        if flat is None:
            return previous.execution_transform(*args, **kwargs)
        return forward(*flat)

    def grad(*args: Any, **kwargs: Any) -> Any:
        flat = ours(args, kwargs)
        if flat is None:
            return previous.grad_transform(*args, **kwargs)
        out = forward(*flat)
        positions = tuple(i for i, a in enumerate(flat) if isinstance(a, TensorProxy) and requires_grad(a) is not False)
        if positions:
            for i, g in zip(positions, backward(get_grad(out), positions, *flat)):
                put_grad(flat[i], g)
        return out

    return checker, execute, grad


def register(executor: OperatorExecutor) -> None:
    """Add the rules of :data:`CALLS` to ``executor``, in front of the rules it has for those symbols (which need
    an execution and a grad transform)."""
    for symbol in CALLS:
        previous = executor.implmap.get(symbol.id)
        assert previous is None or (previous.execution_transform and previous.grad_transform), symbol
        checker, execute, grad = _rule(symbol, previous, executor)
        executor.register_implementation(symbol, checker=checker, execution_transform=execute, grad_transform=grad)
