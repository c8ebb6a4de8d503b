"""One trace symbol per subclass op, e.g. ``TwoTensor.torch.mul``, whose subsymbols are the
unrolled dispatch and whose gradient is the outer op's (``autodiff``).

Symbols are process-wide, one per (name, torch function): they hold no state of any one
compilation. Their meta unrolls with the ATen table of the compilation in progress, so two
``discover()`` lists with different ATen ops share symbols (and gradient rules) safely.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from thunder.core.symbol import Symbol, default_python_printer
from thunder.core.transforms import register_grad

from thunderplug.subclass.autodiff import forward_only, grad_rule, vjp_of
from thunderplug.subclass.unroll import unroll
from thunderplug.subclass.values import subclass_flatten, subclass_op_id, subclass_unflatten

_symbols: dict[tuple[str, Any], Symbol] = {}
_lock = threading.RLock()


def unrolled_op_symbol(display: str, torch_fn: Callable[..., Any], *, differentiable: bool = True) -> Symbol:
    """The symbol ``display`` whose decomposition is ``torch_fn`` unrolled on fakes, created once.

    ``differentiable`` symbols get the gradient of ``torch_fn`` (a ``<display>.backward`` symbol
    unrolled the same way); others are not differentiated by thunder at all.
    """
    key = (display, torch_fn)
    with _lock:
        symbol = _symbols.get(key)
        if symbol is None:
            symbol = _symbols[key] = _new_symbol(display, torch_fn)
            if differentiable:
                backward = unrolled_op_symbol(f"{display}.backward", vjp_of(torch_fn), differentiable=False)
                register_grad(symbol.id, grad_rule(display, symbol, backward))
        return symbol


def _new_symbol(display: str, torch_fn: Callable[..., Any]) -> Symbol:
    def meta(*args: Any, **kwargs: Any) -> Any:
        return unroll(display, torch_fn, args, kwargs)

    def printer(bsym, out_printables, arg_printables, kwarg_printables):
        line = default_python_printer(bsym, out_printables, arg_printables, kwarg_printables)
        return line.replace(f"{bsym.name_with_module()}(", f"{display}(", 1)

    return Symbol(
        name="".join(c if c.isalnum() else "_" for c in display),
        meta=meta,
        id=subclass_op_id(display),
        python_printer=printer,
        _module=__import__(__name__, fromlist=["_"]),
    )


for _op in (subclass_unflatten, subclass_flatten):
    register_grad(_op, forward_only(_op))
