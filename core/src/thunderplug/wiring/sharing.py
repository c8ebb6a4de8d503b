"""One compilation for modules of one structure, inside thunder's cache (issue 26).

thunder's jitted function looks its cache up in ``get_computation_and_inputs``: it runs each
cache entry's prologue on the call's arguments and takes the first that does not raise, else it
compiles and appends a new entry to ``CompileStats.interpreter_cache``. A module's prologue reads
the module from its globals (``globals()['__function_obj']``) and everything else from it
(``module.get_parameter('fc.weight')``, ``module.get_submodule('attn').heads``) through the
ThunderModule of the running call; the computation and backward only see what the prologue
returns. So a compilation of one block is a valid cache entry of another block of the same
:func:`thunderplug.caching.reuse.structure_of` once its prologue reads that block: when a module's
compilation of its own is new, it is offered to its structure's group (unbound from its module),
and a module of the same structure appends the group's compilations it has not seen to its own
cache, each prologue rebound to its own module, before thunder looks the cache up. thunder then
runs those prologues like its own: their guards decide, a miss compiles as before.

A compilation is not offered when its generated functions hold a module or a tensor (a value of
the module baked into the code) or its epilogue, computation or backward read the module.

The prologue checks each number and string the program read from a module, and only those
(:func:`module_getattr_lookaside`): thunder's interpreter ran ``nn.Module.__getattr__``'s
``"_parameters" in self.__dict__``, which tracks every item of the module's ``__dict__`` and so
proxifies, and guards, every number and string attribute of every module whose submodule or
parameter the program reads (a ``Linear``'s ``in_features``, transformers' ``layer_idx``, litgpt's
``block_idx``): blocks that differ only there could never run one compilation.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from typing import Any

import torch

from thunderplug.caching import reuse
from thunderplug.tracing.compilation import record_for
from thunderplug.wiring.speedups import _closure_value

_MODULE_GLOBAL = "__function_obj"  # where thunder's generated functions find the jitted module


class _Sharing:
    """Per jitted module: its group, the group's version it has seen, the compilations it adopted."""

    __slots__ = ("key", "group", "version", "adopted", "ran", "lock")

    def __init__(self) -> None:
        self.key: Any = None
        self.group: reuse.SharedGroup | None = None
        self.version = 0
        self.adopted: dict[int, reuse.SharedCompilation] = {}  # id(computation traces) -> compilation
        self.ran: set[int] = set()
        self.lock = threading.Lock()


def shared_compilations(original: Callable[..., Any], uses_thunderplug: Callable[[Any], bool]) -> Callable:
    """thunder's ``_with_cache_info_ctx`` (it wraps each jitted function's ``get_computation_and_inputs``
    when ``thunder.jit`` is called), for modules jitted with thunderplug's executors also adopting
    the compilations of modules of the same structure and offering their own."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        wrapped = original(fn)
        compile_data_ref = _closure_value(fn, "weakref_cd")
        compile_stats_ref = _closure_value(fn, "weakref_cs")
        if compile_data_ref is None or compile_stats_ref is None:
            return wrapped
        sharing = _Sharing()

        def call(*args: Any, **kwargs: Any) -> Any:
            compile_data, stats = compile_data_ref(), compile_stats_ref()
            if compile_data is None or stats is None or sharing.key is False or not uses_thunderplug(compile_data):
                return wrapped(*args, **kwargs)
            if sharing.group is None or sharing.group.version != sharing.version:
                _adopt(compile_data, stats, sharing)
            misses = stats.cache_misses
            result = wrapped(*args, **kwargs)
            if stats.cache_misses != misses:
                _offer(compile_data, stats, sharing)
            elif id(stats.last_traces) in sharing.adopted and id(stats.last_traces) not in sharing.ran:
                _first_run(compile_data, stats, sharing)
            return result

        return call

    return decorate


def _adopt(compile_data: Any, stats: Any, sharing: _Sharing) -> None:
    """Append to the module's cache the compilations of its structure's group it has not seen (the
    structure is read again: the module may have changed since it last looked)."""
    if not _join_group_of_structure(compile_data, sharing):
        return
    with sharing.lock:
        assert sharing.group is not None
        fresh, sharing.version = sharing.group.since(sharing.version)
        own = record_for(compile_data)
        for compilation in fresh:
            if compilation.record is own or id(compilation.entry.computation_traces) in sharing.adopted:
                continue
            entry = compilation.entry
            stats.interpreter_cache.append(entry._replace(prologue_fn=_bound(entry.prologue_fn, compile_data.fn)))
            sharing.adopted[id(entry.computation_traces)] = compilation


def _offer(compile_data: Any, stats: Any, sharing: _Sharing) -> None:
    """Offer the compilation the call made (the newest cache entry) to the module's group."""
    if not stats.interpreter_cache or not _join_group_of_structure(compile_data, sharing):
        return  # (the structure is read again: the module may have changed since it last looked)
    entry = stats.interpreter_cache[-1]
    prologue = _closure_value(entry.prologue_fn, "fn") or entry.prologue_fn  # thunder's timer wraps it
    if not _shareable(entry, prologue):
        return
    module = compile_data.fn
    compilation = reuse.SharedCompilation(
        entry._replace(prologue_fn=_bound(prologue, None)), record_for(compile_data), _name(module)
    )
    record_for(compile_data).shared.append(compilation)
    with sharing.lock:
        assert sharing.group is not None
        if sharing.group.offer(compilation) == sharing.version:  # nothing offered meanwhile: all seen
            sharing.version += 1


def _join_group_of_structure(compile_data: Any, sharing: _Sharing) -> bool:
    """Make ``sharing`` the module's structure's group as it is now; ``False``: never shared."""
    options = reuse.jit_options_of(compile_data)
    if options is None:
        sharing.key = False
        return False
    key = (options, reuse.structure_of(compile_data.fn))
    with sharing.lock:
        if key != sharing.key:
            sharing.key, sharing.group, sharing.version = key, reuse.group_for(key), 0
    return True


def _first_run(compile_data: Any, stats: Any, sharing: _Sharing) -> None:
    """The call ran an adopted compilation for the first time: count the module among its users and
    show its backward as this module's (thunder updates ``last_backward_traces`` only when compiling)."""
    compilation = sharing.adopted[id(stats.last_traces)]
    sharing.ran.add(id(stats.last_traces))
    compilation.users.add(compile_data)
    record_for(compile_data).shared.append(compilation)
    stats.last_backward_traces = compilation.entry.backward_traces


def _shareable(entry: Any, prologue: Any) -> bool:
    functions = [entry.computation_fn, entry.epilogue_fn, entry.backward_fn]
    if not isinstance(prologue, types.FunctionType) or _MODULE_GLOBAL not in prologue.__globals__:
        return False
    for function in filter(None, functions):
        code = getattr(function, "__code__", None)
        if code is None or _MODULE_GLOBAL in code.co_consts or _MODULE_GLOBAL in code.co_names:
            return False
    values = [v for f in [prologue, *filter(None, functions)] for k, v in f.__globals__.items() if k != _MODULE_GLOBAL]
    return not reuse.holds_module_state(values)


def _bound(prologue: Any, module: Any) -> Any:
    """The prologue reading ``module`` (``None``: unbound, holding no module)."""
    bound = types.FunctionType(
        prologue.__code__, {**prologue.__globals__, _MODULE_GLOBAL: module}, prologue.__name__,
        prologue.__defaults__, prologue.__closure__,
    )
    bound.__kwdefaults__ = prologue.__kwdefaults__
    return bound


def _name(module: Any) -> str:
    return f"{type(module).__qualname__} at {id(module):#x}"


def module_getattr_lookaside(interpret: Callable[..., Any]) -> Callable[[Any], Callable]:
    """A lookaside for ``torch.nn.Module.__getattr__`` (a submodule, parameter or buffer read as an
    attribute) in discover() compilations: :func:`_module_getattr` (other compilations do not see it:
    patches' "lookasides of discover() only")."""

    def make(_no_lookaside: Any) -> Callable[..., Any]:
        def lookaside(*args: Any, **kwargs: Any) -> Any:
            return interpret(_module_getattr, *args, **kwargs)

        return lookaside

    return make


def _module_getattr(self: torch.nn.Module, name: str) -> Any:
    """torch's ``nn.Module.__getattr__``, interpreted by thunder, with each table read by subscript:
    torch asks ``"_parameters" in self.__dict__``, for which thunder tracks (so proxifies and guards)
    every item of ``__dict__``; a subscript tracks only the item it reads."""
    state = self.__dict__
    try:
        parameters = state["_parameters"]
    except KeyError:
        pass
    else:
        if name in parameters:
            return parameters[name]
    try:
        buffers = state["_buffers"]
    except KeyError:
        pass
    else:
        if name in buffers:
            return buffers[name]
    try:
        modules = state["_modules"]
    except KeyError:
        pass
    else:
        if name in modules:
            return modules[name]
    raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
