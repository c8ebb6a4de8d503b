"""Every private thunder 0.2.6 name thunderplug reads, in one place.

Nothing else in thunderplug reads a private (underscored) thunder name, and this module imports
nothing of thunderplug: it is the bottom layer (tests/test_architecture.py checks both from the
source). Each accessor says what it is for, so a thunder upgrade is checked here, against the tests
of this package. The patches thunderplug applies to thunder are in :mod:`thunderplug.wiring.patches`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from thunder.core import interpreter, jit_ext
from thunder.core.interpreter import _interpret_call, is_opaque
from thunder.core.symbol import Symbol


def torch_to_thunder_function_map() -> dict[Any, Any]:
    """thunder's map from torch callables to thunder.torch symbols (keyed the other way than we need)."""
    from thunder.torch import _torch_to_thunder_function_map

    return _torch_to_thunder_function_map


def inplace_to_out_of_place() -> dict[Any, tuple[Any, int]]:
    """thunder.torch's map from in-place symbols (``add_``) to their out-of-place ones (``add``)."""
    from thunder.torch import _inplace_to_out_of_place

    return _inplace_to_out_of_place


def torch_property_map() -> dict[str, Callable[..., Any]]:
    """thunder.torch's tensor properties (name -> function of the tensor), which ``TensorProxy.__getattr__``
    consults for a name that is no method (``data`` is not among them)."""
    from thunder.torch.langctx import _property_name_to_fn_map

    return _property_name_to_fn_map


def syms_that_may_return_views() -> set[Any]:
    """The symbols thunder's alias updates treat as possibly returning a view of their first input."""
    from thunder.torch import _syms_that_may_return_views

    return _syms_that_may_return_views


def syms_returning_views() -> set[Any]:
    """The symbols thunder's alias updates treat as returning a view of their first input."""
    from thunder.torch import _syms_returning_views

    return _syms_returning_views


def general_jit_lookaside_map() -> dict[Any, Callable[..., Any]]:
    """The interpreter's lookaside table (torch functions -> symbols, isinstance, Function.apply, ...)."""
    return jit_ext._general_jit_lookaside_map


def default_lookaside_map() -> dict[Any, Callable[..., Any]]:
    """The interpreter's own lookasides (``bool``, ``len``, ``type.__call__``, ``functools.partial.__call__``),
    consulted when thunder's jit registers none of its own."""
    return interpreter._default_lookaside_map


def default_lookaside(fn: Any) -> Callable[..., Any] | None:
    """The interpreter's own lookaside for ``fn`` (``None``: the function is interpreted)."""
    return interpreter._default_lookaside_map.get(fn)


def default_opcode_handler_map() -> dict[str, Callable[..., Any]]:
    """The interpreter's handler of each bytecode instruction by opcode name (``CONTAINS_OP``, ``BINARY_SUBSCR``)."""
    return interpreter._default_opcode_handler_map


#: Interpret ``fn(*args, **kwargs)`` (the interpreter's wrapped values) as thunder does for a call with no
#: lookaside: a lookaside that only sometimes takes over defers to it. thunder's function itself, not a
#: wrapper: the speedups' lookasides call it on every container subscript and module call they shortcut.
interpret_call = _interpret_call


def parse_to_device_and_dtype(*args: Any, device: Any = None, dtype: Any = None) -> tuple[Any, Any]:
    """The device and dtype a ``Tensor.to(*args, device=..., dtype=...)`` call asks for, parsed as
    thunder.torch does."""
    import thunder.torch as ltorch

    return ltorch._parse_to_device_and_dtype(*args, device=device, dtype=dtype)


def runs_called_function_itself(fn: Any) -> bool:
    """Whether thunder's jit runs ``fn`` rather than interpreting its code: an opaque (C) function, a
    symbol or one of thunder's clang functions."""
    try:
        return is_opaque(fn) or isinstance(fn, Symbol) or fn in jit_ext._clang_fn_set
    except TypeError:  # unhashable
        return True


def claiming_executor(bsym: Any, executors: Any) -> Any:
    """The executor thunder's claiming pass gives ``bsym`` to: the first, in list order, that is an
    operator executor able to execute it or a fusion executor able to fuse it (``None``: nobody)."""
    from thunder.extend import FusionExecutor, OperatorExecutor

    return next((ex for ex in executors if (isinstance(ex, OperatorExecutor) and ex.can_execute(bsym))
                 or (isinstance(ex, FusionExecutor) and ex.can_fuse(bsym))), None)


def transform_for_operator_executor_execution(trace: Any, executors: list) -> Any:
    """thunder's claiming pass (executors in order, descending into unclaimed composites)."""
    from thunder.executors.passes import _transform_for_operator_executor_execution

    return _transform_for_operator_executor_execution(trace, executors)


def grad_fn_map() -> dict[Any, Callable[..., Any]]:
    """thunder's joint forward+backward rules registered with ``register_grad``."""
    from thunder.core.transforms import _grad_fn_map

    return _grad_fn_map


def bound_symbol_printables(bsym: Any) -> tuple[Any, Any, Any]:
    """What thunder prints for a bound symbol's outputs, args and kwargs (for ``explain``)."""
    return bsym._out_printables, bsym._arg_printables, bsym._kwarg_printables


def replace_thunder_module_parameters(thunder_module: Any, make: Callable[[dict], dict]) -> None:
    """Replace the parameter dict a ``ThunderModule`` copies from its module when created
    (``_overrides_parameters``) with ``make(that dict)`` (``thunderplug.subclass.distributed.LiveParameters``)."""
    thunder_module._overrides_parameters = make(thunder_module._overrides_parameters)


def ltorch_private(name: str) -> Any:
    """A thunder.torch symbol that thunder keeps private (``_softmax``: what ``F.softmax`` traces
    to), for executors that claim it."""
    import thunder.torch as ltorch

    return getattr(ltorch, name)


def bound_symbol_context(trace: Any) -> tuple[str, Any, Any]:
    """What ``Symbol.bind`` stamps on a new bound symbol: the header of the user's source line and
    the trace's current source file and positions (for bound symbols made without calling a symbol)."""
    from thunder.core.symbol import _bsym_header

    return _bsym_header.get(), trace._current_source_filename, trace._current_source_positions


def jit_options(compile_data: Any) -> dict[str, Any]:
    """The options ``thunder.jit`` was given, read back from its ``CompileData``, to jit parts of
    the same module alike (thunderplug.caching.regions)."""
    return {
        "executors": compile_data.executors_list,
        "cache": compile_data.cache_option,
        "sharp_edges": compile_data.sharp_edges,
        "disable_torch_autograd": compile_data.disable_torch_autograd_support,
        "debug_options": compile_data.debug_options,
        **compile_data.compile_options,
    }


def record_call(compiled: Any, prologue: list, forward: list, backward: list, *, compiled_anything: bool) -> None:
    """thunder's statistics of ``compiled`` after a call that its regions ran: what
    ``thunder.last_prologue_traces`` / ``last_traces`` / ``last_backward_traces`` return next, and the call
    counted, as a cache miss if it compiled anything (``thunder.cache_misses`` counts compilations)."""
    import thunder

    stats = thunder.compile_stats(compiled)
    stats.last_prologue_traces, stats.last_traces, stats.last_backward_traces = prologue, forward, backward
    stats.calls += 1
    if compiled_anything:
        stats.cache_misses += 1
    else:
        stats.cache_hits += 1


def debug_option_values(options: Any) -> dict[str, Any]:
    """The values of a ``thunder.DebugOptions`` (thunder keeps the registered names in ``_defaults``)."""
    return {name: getattr(options, name) for name in type(options)._defaults}


def function_apply_parts(grad_transform: Callable[..., Any]) -> tuple[Any, Any, Callable[..., Any]] | None:
    """What the ``grad_transform`` thunder's ``Function.apply`` lookaside registers closes over: the augmented
    forward trace (outputs and saved tensors), the ctx proxy and the backward callable (None if it has none)."""
    code = getattr(grad_transform, "__code__", None)
    names = ("aliased_trace_of_augmented_fwd", "ctx_proxy", "bwd_impl_callable")
    if code is None or grad_transform.__closure__ is None or not set(names) <= set(code.co_freevars):
        return None
    cells = dict(zip(code.co_freevars, grad_transform.__closure__))
    return tuple(cells[name].cell_contents for name in names)  # type: ignore[return-value]


def printable_value_types() -> dict[type, Callable[[Any], str]]:
    """thunder's printers of values written into generated code as literals, by exact type (``int``,
    ``float``, ``slice``, ...): an int subclass is otherwise kept as an object of the trace's context."""
    from thunder.core.baseutils import _printable_value_types

    return _printable_value_types


def cache_info() -> dict[str, Any]:
    """The key thunder's ``populate_cache_info`` builds for the call being looked up (its prologue checks each
    entry): the dict of the innermost ``_with_cache_info_ctx`` in progress."""
    import thunder

    return thunder._get_cache_info()
