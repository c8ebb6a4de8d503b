"""Which symbol a call on subclass proxies becomes.

Every torch-level call (``torch.mul(x, 2)``, ``x * 2``, ``x.mul(2)``, ``torch.ops.aten.mul.Tensor``,
and the ops grad rules emit) reaches ``Symbol.__call__``; with a subclass proxy among its
arguments it becomes the subclass op symbol of the torch function it stands for, under the
autocast in effect where it is called (as eager's autocast casts before the subclass dispatches).
In-place ops are decomposed by ``inplace``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from thunder.core.proxies import TensorProxy
from thunder.core.symbol import Symbol

from thunderplug.plugin_api.specs import torch_attribute
from thunderplug.subclass.symbols import unrolled_op_symbol
from thunderplug.subclass.unroll import SubclassDispatchError, traced
from thunderplug.subclass.values import SubclassTensorProxy, is_subclass_op
from thunderplug.thunder_compat import torch_to_thunder_function_map
from thunderplug.tracing.aten import AtenTable, user_location
from thunderplug.tracing.trace_state import AutocastState, autocast_state

# Prims that only inspect or move values (guards, unpacking, returns) accept subclass proxies as they are.
_BOOKKEEPING_PRIM_PREFIXES = (
    "check_", "unpack_", "python_return", "return", "python_del", "del", "comment", "sink", "put_grad", "get_grad"
)


def subclass_proxies(args: tuple, kwargs: dict) -> Iterator[SubclassTensorProxy]:
    """The subclass proxies among a call's arguments, also one level inside lists and tuples
    (``torch.cat([x, y])``); this runs for every symbol call while tracing, so it stays shallow."""
    for value in (*args, *kwargs.values()):
        if type(value) is SubclassTensorProxy:
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (item for item in value if type(item) is SubclassTensorProxy)


def has_subclass_proxy(args: tuple, kwargs: dict) -> bool:
    return next(subclass_proxies(args, kwargs), None) is not None


def passes_through(symbol: Symbol) -> bool:
    """Symbols that take subclass proxies as they are: ours, executor operations, bookkeeping prims."""
    return (
        is_subclass_op(symbol)
        or symbol.executor is not None
        or (symbol.is_prim and symbol.name.startswith(_BOOKKEEPING_PRIM_PREFIXES))
    )


def dispatch(symbol: Symbol, table: AtenTable, args: tuple, kwargs: dict) -> Symbol | None:
    """The subclass op symbol a call of ``symbol`` on subclass proxies becomes, or ``None`` to
    let ``symbol`` run as itself (a composite whose parts will be dispatched one by one)."""
    cls = next(subclass_proxies(args, kwargs)).subclass_type
    autocast = autocast_state()
    overload = table.overloads_by_id.get(symbol.id)
    if overload is not None:
        return unrolled_op_symbol(f"{cls.__name__}.{symbol.id}", overload, autocast=autocast)
    candidates = _torch_candidates(symbol, cls.__name__, args)
    if candidates:
        return _first_that_binds(candidates, args, kwargs, autocast)
    torch_fn = _torch_function_for_prim(symbol) if symbol.is_prim else None
    if torch_fn is not None:  # e.g. prims.add from accumulating two gradients
        display = f"{cls.__name__}.{torch_fn.__module__}.{torch_fn.__name__}"
        return unrolled_op_symbol(display, torch_fn, autocast=autocast)
    if symbol.is_prim:
        raise SubclassDispatchError(
            f"prims.{symbol.name} was applied to a {cls.__name__} value{user_location()}; thunderplug only "
            "unrolls torch-level operations on tensor subclasses"
        )
    return None


def _torch_candidates(symbol: Symbol, class_name: str, args: tuple) -> list[tuple[str, Callable[..., Any]]]:
    """(display name, torch callable) pairs that ``symbol`` may stand for, best first: the Tensor
    method (it takes every calling convention of thunder's symbol, ``x.reshape(2, 3)``), then the
    torch function of the symbol's id (it takes a number first, ``torch.mul(2, g)``, and keyword
    arguments methods lack, ``F.relu(x, inplace=False)``)."""
    torch_fn, op_name = torch_function_for(symbol)
    if torch_fn is None:
        return []
    candidates = []
    if not (_is_method(torch_fn) and not (args and isinstance(args[0], TensorProxy))):
        candidates.append((f"{class_name}.{op_name}", torch_fn))
    paths = dict.fromkeys((op_name, str(symbol.id)))
    functions = [torch_attribute(path) for path in paths if path.startswith("torch.")]
    for function in dict.fromkeys([*functions, *_torch_keys(symbol)]):
        if callable(function) and function is not torch_fn and not _is_method(function):
            path = f"{getattr(function, '__module__', None) or 'torch'}.{getattr(function, '__name__', 'op')}"
            if any(display == f"{class_name}.{path}" for display, _ in candidates):
                path += ".function"
            candidates.append((f"{class_name}.{path}", function))
    return candidates


def _first_that_binds(
    candidates: list[tuple[str, Callable[..., Any]]], args: tuple, kwargs: dict, autocast: AutocastState
) -> Symbol:
    """The first candidate that accepts these arguments on fakes (traced once per metadata)."""
    for index, (display, torch_fn) in enumerate(candidates):
        if index == len(candidates) - 1:
            return unrolled_op_symbol(display, torch_fn, autocast=autocast)
        try:
            traced(display, torch_fn, args, kwargs, autocast)
        except SubclassDispatchError as error:
            if isinstance(error.__cause__, TypeError):  # this callable does not take such a call
                continue
            raise
        return unrolled_op_symbol(display, torch_fn, autocast=autocast)
    raise AssertionError("no candidates")


def _torch_function_for_prim(symbol: Symbol) -> Callable[..., Any] | None:
    """The torch function thunder's torch executor runs a prim with, when it runs it directly."""
    from thunder.executors.torchex import ex as torchex

    impl = torchex.implmap.get(symbol.id)
    if impl is None or impl.execution_transform is not None or impl.symbol is None:
        return None
    module = impl.symbol.module
    return getattr(module, impl.symbol.name, None) if module is not None else None


@functools.cache  # built once: thunder's map is complete after import
def _torch_keys_by_symbol_id() -> dict[Any, list[Callable[..., Any]]]:
    keys: dict[Any, list[Callable[..., Any]]] = {}
    for torch_fn, target in torch_to_thunder_function_map().items():
        if isinstance(target, Symbol) and callable(torch_fn):
            keys.setdefault(target.id, []).append(torch_fn)
    return keys


def _torch_keys(symbol: Symbol) -> list[Callable[..., Any]]:
    """The torch callables thunder maps to ``symbol`` (thunder's map is keyed the other way)."""
    return _torch_keys_by_symbol_id().get(symbol.id, [])


def torch_function_for(symbol: Symbol) -> tuple[Callable[..., Any], str] | tuple[None, None]:
    """The torch callable a thunder.torch symbol stands for, and the name to show it under.

    A ``torch.Tensor`` method comes first: it accepts every calling convention the function does
    (``x.reshape(2, 3)`` and ``((2, 3),)``), and its name is the one users call (thunder files
    ``torch.mm`` under the id of its alias ``torch.spmm``).
    """
    methods = [
        fn for fn in _torch_keys(symbol) if _is_method(fn) and not getattr(fn, "__name__", "_").startswith("_")
    ]
    if isinstance(symbol.id, str) and symbol.id.count(".") == 1 and symbol.id.startswith("torch."):
        method = getattr(torch.Tensor, symbol.id.split(".")[1], None)
        if callable(method):
            methods.insert(0, method)
    if methods:
        return methods[0], f"torch.{methods[0].__name__}"
    if isinstance(symbol.id, str) and symbol.id.startswith("torch."):
        target = torch_attribute(symbol.id)
        if callable(target):
            return target, symbol.id
    keys = _torch_keys(symbol)
    return (keys[0], str(symbol.id)) if keys else (None, None)


def torch_function_of(display: str) -> Callable[..., Any]:
    """The torch function a subclass op name stands for (``TwoTensor.torch.mul`` -> ``torch.mul``)."""
    _, _, path = display.partition(".")
    function = torch_attribute(path)
    if function is None:
        raise AttributeError(f"{display} names no torch function ({path} does not exist)")
    return function


def _is_method(torch_fn: Any) -> bool:
    return "Tensor" in getattr(torch_fn, "__qualname__", "").split(".")[0]


def construct(cls: type, args: tuple, kwargs: dict) -> Any:
    """Build a subclass inside a jitted function: ``<Class>.construct`` with the unrolled constructor."""
    return unrolled_op_symbol(f"{cls.__name__}.construct", cls, autocast=autocast_state())(*args, **kwargs)
