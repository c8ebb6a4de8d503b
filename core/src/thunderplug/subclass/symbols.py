"""One trace symbol per subclass op, e.g. ``TwoTensor.torch.mul``, whose subsymbols are the
unrolled dispatch and whose gradient is the outer op's (``autodiff``).

Symbols are process-wide, one per (name, torch function, autocast): they hold no state of any
one compilation. Their meta unrolls with the ATen table of the compilation in progress, so two
``discover()`` lists with different ATen ops share symbols (and gradient rules) safely. A call
under autocast gets its own symbol, which traces the op (and the forward part of its backward)
under that autocast wherever it is re-emitted: autodiff and re-tracing run after the function's
``torch.autocast`` blocks have ended, and claims (registered for the op without autocast) never
take it.
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
from thunderplug.thunder_compat import syms_that_may_return_views
from thunderplug.tracing.trace_state import NO_AUTOCAST, AutocastState

_symbols: dict[tuple[str, Any, AutocastState], Symbol] = {}
_lock = threading.RLock()


def unrolled_op_symbol(
    display: str,
    torch_fn: Callable[..., Any],
    *,
    differentiable: bool = True,
    autocast: AutocastState = NO_AUTOCAST,
) -> Symbol:
    """The symbol ``display`` whose decomposition is ``torch_fn`` unrolled on fakes, created once.

    ``differentiable`` symbols get the gradient of ``torch_fn`` (a ``<display>.backward`` symbol
    unrolled the same way); others are not differentiated by thunder at all. ``autocast`` is the
    autocast ``torch_fn`` runs under (``trace_state.autocast_state()`` where the program called it);
    ATen ops and what runs below autocast take the default, autocast off.
    """
    key = (display, torch_fn, autocast)
    with _lock:
        symbol = _symbols.get(key)
        if symbol is None:
            shown = display + _autocast_suffix(autocast)
            symbol = _symbols[key] = _new_symbol(shown, torch_fn, autocast)
            if differentiable:
                backward = unrolled_op_symbol(
                    f"{display}.backward", vjp_of(torch_fn), differentiable=False, autocast=autocast
                )
                register_grad(symbol.id, grad_rule(shown, symbol, backward))
        return symbol


def _autocast_suffix(autocast: AutocastState) -> str:
    """``.autocast_cpu_bfloat16`` for an op under CPU autocast to bfloat16; nothing without autocast."""
    return "".join(f".autocast_{device}_{str(dtype).removeprefix('torch.')}" for device, dtype in autocast if dtype)


def _new_symbol(display: str, torch_fn: Callable[..., Any], autocast: AutocastState) -> Symbol:
    def meta(*args: Any, **kwargs: Any) -> Any:
        return unroll(display, torch_fn, args, kwargs, autocast, on_view=note_view)

    def note_view() -> None:  # thunder then updates the viewed value after in-place ops on the view
        may_return_views.add(symbol)

    def printer(bsym, out_printables, arg_printables, kwarg_printables):
        line = default_python_printer(bsym, out_printables, arg_printables, kwarg_printables)
        return line.replace(f"{bsym.name_with_module()}(", f"{display}(", 1)

    may_return_views = syms_that_may_return_views()
    symbol = Symbol(
        name="".join(c if c.isalnum() else "_" for c in display),
        meta=meta,
        id=subclass_op_id(display),
        python_printer=printer,
        _module=__import__(__name__, fromlist=["_"]),
    )
    return symbol


for _op in (subclass_unflatten, subclass_flatten):
    register_grad(_op, forward_only(_op))
