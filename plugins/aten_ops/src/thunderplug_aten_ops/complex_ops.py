"""Ops on complex numbers run as eager runs them, forward and backward (part of the ``eager_backward_kernels``
executor): an FNO's ``torch.einsum`` over ``torch.fft.rfft2``'s modes and complex ``nn.Parameter`` weights,
``x * w`` with complex ``w``, ``torch.exp(1j * theta)``, ``c.real``, ``x.to(torch.cfloat)``.

Why: thunder 0.2.6's gradient rules are written for real numbers. A complex input's gradient in eager is the
conjugate Wirtinger derivative (``mul``'s gradient for ``a`` is ``grad * b.conj()``); thunder's rules give
``grad * b`` (the conjugate is missing), so complex parameters of ``mul``, ``matmul``, ``einsum``, ``exp``,
``div``... get silently wrong gradients (an FNO's spectral weights 3e-2 off after one step, a real input of
``x * c`` likewise), and ``real``/``imag`` have no rule at all (``Failed to find a gradient transform``).
The symbols thunder registered automatically (``torch.fft.*``, ``torch.polar``, ``torch.view_as_complex``) run
as the torch function with torch's autograd already, and are left to thunder.

How: every call of one of thunder's torch-language symbols (not an in-place one: thunder rewrites those into
their out-of-place symbols, which are taken) with a complex argument (a complex tensor, a complex number such
as ``1j``, or a complex dtype) is one operator calling the torch function itself on the real tensors, its
metadata from the same call on FakeTensors; its backward is one operator running the call again under grad on
detached copies of the inputs that require grad and asking eager's engine for their gradients
(``torch.autograd.grad``, as :mod:`thunderplug_aten_ops.composites` does): eager's kernels and derivative
formulas, conjugates included, bit for bit. A call whose torch function cannot be found, or that the function
refuses on FakeTensors (a form only thunder's symbol accepts), raises ``NotImplementedError`` naming the op and
the user's line rather than run thunder's rule. Calls without a complex argument are declined: real-valued
programs are left as they were.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import thunder.torch as ltorch
import torch
from thunder.core import devices, dtypes
from thunder.core.prims import OpTags
from thunder.core.proxies import NumberProxy, TensorProxy
from thunder.core.symbol import Symbol
from thunder.core.transforms import get_grad, put_grad
from thunder.extend import ImplInfo, OperatorExecutor
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from thunderplug.eager.output_grads import requires_grad
from thunderplug.thunder_compat import parse_to_device_and_dtype, torch_to_thunder_function_map
from thunderplug.tracing.aten import user_location
from thunderplug.tracing.fake import fake_mode, to_fake, to_torch_value
from thunderplug_aten_ops import scalar_operands

_lock = threading.Lock()

#: namespaces whose functions are preferred to ``Tensor`` methods as a symbol's eager form, in this order
_NAMESPACES = (torch, torch.nn.functional, torch.special, torch.linalg, torch.fft, torch.Tensor)



def _to(a, *args, device=None, dtype=None, copy=False, memory_format=None):
    """``Tensor.to`` with thunder's arguments (every keyword passed, ``None`` where the call gave none)."""
    device, dtype = parse_to_device_and_dtype(*args, device=device, dtype=dtype)
    return a.to(device=to_torch_value(device), dtype=to_torch_value(dtype), copy=copy,
                memory_format=torch.preserve_format if memory_format is None else memory_format)


#: symbols whose calls torch's functions do not take as thunder makes them: a number first from thunder's
#: reflected operators (``2 * c``, ``1 - c``: eager's forms), ``Tensor.to``'s keywords
_EAGER_FORMS: dict[Any, Callable[..., Any]] = {
    **{symbol: scalar_operands.CALLS[symbol][0]
       for symbol in (ltorch.add, ltorch.sub, ltorch.mul, ltorch.true_divide, ltorch.div)},
    ltorch.to: _to,
}


def _is_complex(x: Any) -> bool:
    if isinstance(x, TensorProxy):
        return dtypes.is_complex_dtype(x.dtype)
    if isinstance(x, NumberProxy):
        return isinstance(x.value, complex)
    if isinstance(x, dtypes.dtype):
        return dtypes.is_complex_dtype(x)
    if isinstance(x, torch.dtype):
        return x.is_complex
    return isinstance(x, complex)


def _differentiable(x: Any) -> bool:
    return isinstance(x, TensorProxy) and dtypes.is_inexact_dtype(x.dtype)


def _symbol_of(value: Any) -> Symbol | None:
    """The symbol the interpreter's mapping of a torch function calls: itself, or the single-device symbol of
    thunder's DTensor dispatch (``dispatch_to_impl``'s wrapper)."""
    if isinstance(value, Symbol):
        return value
    code = getattr(value, "__code__", None)
    if code is None or "single_device_symbol" not in code.co_freevars:
        return None
    found = value.__closure__[code.co_freevars.index("single_device_symbol")].cell_contents
    return found if isinstance(found, Symbol) else None


def _symbols_and_forms() -> tuple[dict[str, Symbol], dict[str, list[Callable[..., Any]]]]:
    """Symbol id -> symbol, and symbol id -> the torch functions the interpreter maps to it, those of the
    namespaces first (``torch.reshape``, then ``Tensor.reshape``, which takes the shape's dims as arguments too)."""
    symbols: dict[str, Symbol] = {}
    forms: dict[str, list[tuple[int, Callable[..., Any]]]] = {}
    for fn, value in torch_to_thunder_function_map().items():
        symbol = _symbol_of(value)
        if symbol is None or not callable(fn):
            continue
        symbols[symbol.id] = symbol
        module = getattr(fn, "__objclass__", None) or getattr(fn, "__module__", None)
        rank = next((i for i, m in enumerate(_NAMESPACES) if module in (m, getattr(m, "__name__", m))),
                    len(_NAMESPACES))
        forms.setdefault(symbol.id, []).append((rank, fn))
    return symbols, {sid: [fn for _, fn in sorted(found, key=lambda f: f[0])] for sid, found in forms.items()}


def _described(args: tuple, kwargs: dict) -> str:
    def describe(x: Any) -> Any:
        return f"{x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, TensorProxy) else x

    return repr(tree_map(describe, (args, kwargs)))


def _taken(symbol: Symbol) -> bool:
    """A symbol of thunder's torch language computed by thunder's own decomposition and rules."""
    tags = symbol.tags or ()
    return OpTags.AUTO_REGISTERED not in tags and OpTags.IN_PLACE not in tags and not symbol.id.startswith("thunder")


def _output_proxy(t: Any, device: devices.Device, grad: bool) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    dtype = dtypes.to_dtype(t.dtype)
    return TensorProxy(shape=tuple(t.shape), dtype=dtype, device=device,
                       requires_grad=grad and dtypes.is_inexact_dtype(dtype))


def _real(tree: Any) -> Any:
    return tree_map(to_torch_value, tree)


def _accepts(fn: Callable[..., Any], args: tuple, kwargs: dict) -> bool:
    """Whether ``fn`` takes the symbol's arguments (called on FakeTensors)."""
    try:
        with fake_mode():
            fn(*to_fake(args), **to_fake(kwargs))
    except (TypeError, RuntimeError, ValueError):
        return False
    return True


def _operators(executor: OperatorExecutor, symbol: Symbol, fn: Callable[..., Any], index: int) -> tuple[Any, Any]:
    """The forward and backward operators of one symbol calling ``fn``, its ``index``-th torch function (the
    symbol's arguments, nested as called)."""
    name = symbol.name.strip("_") + (f"_{index}" if index else "")

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    def forward_meta(*args: Any, **kwargs: Any) -> Any:
        leaves = tree_flatten((args, kwargs))[0]
        tensors = [a for a in leaves if isinstance(a, TensorProxy)]
        device = tensors[0].device if tensors else devices.cpu
        grad = any(t.requires_grad for t in tensors)
        with fake_mode():
            out = call(*to_fake(args), **to_fake(kwargs))
        return tree_map(lambda t: _output_proxy(t, device, grad), out)

    def forward(*args: Any, **kwargs: Any) -> Any:
        return call(*_real(args), **_real(kwargs))

    def backward_meta(grads: tuple, positions: tuple, *args: Any, **kwargs: Any) -> tuple:
        leaves = tree_flatten((args, kwargs))[0]
        return tuple(TensorProxy(like=leaves[i], requires_grad=False) for i in positions)

    def backward(grads: tuple, positions: tuple, *args: Any, **kwargs: Any) -> tuple:
        leaves, spec = tree_flatten(_real((args, kwargs)))
        leaves = list(leaves)
        with torch.enable_grad():
            for i in positions:
                leaves[i] = leaves[i].detach().requires_grad_()
            args, kwargs = tree_unflatten(leaves, spec)
            outs = [o for o in tree_flatten(call(*args, **kwargs))[0] if isinstance(o, torch.Tensor)]
            pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
            found = torch.autograd.grad([o for o, _ in pairs], [leaves[i] for i in positions],
                                        [g for _, g in pairs], allow_unused=True)
        return tuple(torch.zeros_like(leaves[i]) if g is None else g for i, g in zip(positions, found))

    return (executor.register_operator(f"eager_complex_{name}", meta=forward_meta, fn=forward),
            executor.register_operator(f"eager_complex_{name}_backward", meta=backward_meta, fn=backward))


def _rule(symbol: Symbol, forms: list[Callable[..., Any]], previous: ImplInfo | None,
          executor: OperatorExecutor) -> tuple[Callable, Callable, Callable]:
    """The checker, execution transform and grad transform of one symbol: this module's for calls with a complex
    argument, ``previous``'s otherwise."""
    operators: dict[int, tuple[Any, Any]] = {}  # made at the first call taken (most symbols never meet a complex one)

    def ours(args: tuple, kwargs: dict) -> bool:
        return any(_is_complex(a) for a in tree_flatten((args, kwargs))[0])

    def operators_for(args: tuple, kwargs: dict) -> tuple[Any, Any]:
        """The operators of the first torch function taking this call; refused where none does."""
        index = next((i for i, fn in enumerate(forms) if _accepts(fn, args, kwargs)), None)
        if index is None:
            raise NotImplementedError(
                f"{symbol.id} on complex numbers{user_location()}: no torch function of it takes thunder's arguments "
                f"{_described(args, kwargs)}; thunder 0.2.6's gradient rules are written for real numbers (no "
                "conjugates), so discover() runs complex ops as eager's own; compute this op outside the jitted "
                "function")
        with _lock:
            if index not in operators:
                operators[index] = _operators(executor, symbol, forms[index], index)
        return operators[index]

    def checker(*args: Any, **kwargs: Any) -> bool:
        if ours(args, kwargs):
            return True
        return previous is not None and (previous.checker is None or previous.checker(*args, **kwargs))

    def execute(*args: Any, **kwargs: Any) -> Any:
        if not ours(args, kwargs):
            return previous.execution_transform(*args, **kwargs)
        return operators_for(args, kwargs)[0](*args, **kwargs)

    def grad(*args: Any, **kwargs: Any) -> Any:
        if not ours(args, kwargs):
            return previous.grad_transform(*args, **kwargs)
        forward, backward = operators_for(args, kwargs)
        out = forward(*args, **kwargs)
        leaves = tree_flatten((args, kwargs))[0]
        positions = tuple(i for i, a in enumerate(leaves) if _differentiable(a) and requires_grad(a) is not False)
        if positions:
            outs = [o for o in tree_flatten(out)[0] if isinstance(o, TensorProxy)]
            grads = tuple(get_grad(o) if _differentiable(o) else None for o in outs)
            for i, g in zip(positions, backward(grads, positions, *args, **kwargs)):
                put_grad(leaves[i], g)
        return out

    return checker, execute, grad


def register(executor: OperatorExecutor) -> None:
    """Take every thunder torch-language symbol's calls with a complex argument on ``executor``, in front of the
    rules it has for those symbols (which need an execution and a grad transform)."""
    symbols, forms = _symbols_and_forms()
    for sid, symbol in symbols.items():
        if not _taken(symbol):
            continue
        previous = executor.implmap.get(sid)
        assert previous is None or (previous.execution_transform and previous.grad_transform), sid
        eager = [_EAGER_FORMS[symbol]] if symbol in _EAGER_FORMS else forms.get(sid, [])
        checker, execute, grad = _rule(symbol, eager, previous, executor)
        executor.register_implementation(symbol, checker=checker, execution_transform=execute, grad_transform=grad)
