"""A recompilation limit per jitted function, for tensor-subclass flatten contexts that keep changing.

The prologue guards a subclass input's ``__tensor_flatten__`` context by value (it is part of how
the subclass is rebuilt), so a context that holds a per-call Python value (a float scale, a step
counter) misses the cache on every call: 40 values, 40 compilations, each as slow as the first.
As Dynamo does (``torch._dynamo.config.recompile_limit``, 8), a function whose subclass input has
seen more distinct contexts than :data:`DEFAULT_LIMIT` gets one warning naming the subclass, the
input and the context field that changed, with the values seen. Compilation goes on (thunder has
no eager fallback to switch to, and every compilation is correct, only slow);
``THUNDERPLUG_STRICT=1`` raises :class:`RecompileLimitError` instead, and
``THUNDERPLUG_RECOMPILE_LIMIT=N`` sets the limit.

The compilation calls :func:`note_subclass_input` once per subclass input it proxies; what was
seen is kept per ``thunder.jit`` function (weakly keyed by its ``CompileData``).
"""

from __future__ import annotations

import inspect
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from thunderplug.plugin_api import settings
from thunderplug.plugin_api.notices import RecompileWarning, warn_once

DEFAULT_LIMIT = 8
LIMIT_VARIABLE = settings.RECOMPILE_LIMIT


class RecompileLimitError(RuntimeError):
    """A subclass input's flatten context changed more often than the limit (strict mode)."""


@dataclass
class _Seen:
    """The distinct flatten contexts one input of one function was compiled for, in order."""

    subclass: str
    contexts: list[Any] = field(default_factory=list)


_seen: weakref.WeakKeyDictionary[Any, dict[str, _Seen]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def limit() -> int:
    return settings.count(os.environ, LIMIT_VARIABLE, DEFAULT_LIMIT)


def note_subclass_input(
    name: str, subclass: type, ctx: Any, history: Any = None, compile_data: Any | None = None
) -> None:
    """Record that the compilation in progress proxies subclass input ``name`` (thunder's proxy name;
    ``history``, its provenance, gives the user's parameter name) with flatten context ``ctx``."""
    if compile_data is None:
        from thunder.core.compile_data import get_compile_data

        compile_data = get_compile_data()
        if compile_data is None:
            return
    name = _user_name(history, getattr(compile_data, "fn", None)) or name
    with _lock:
        inputs = _seen.setdefault(compile_data, {})
        seen = inputs.setdefault(name, _Seen(subclass.__qualname__))
        if any(_same(ctx, previous) for previous in seen.contexts):
            return
        seen.contexts.append(ctx)
        count, previous = len(seen.contexts), seen.contexts[-2] if len(seen.contexts) > 1 else None
    if count <= limit():
        return
    message = _message(compile_data, name, seen, previous, ctx, count)
    if settings.flag(os.environ, settings.STRICT):
        raise RecompileLimitError(message)
    warn_once(("recompile limit", id(compile_data), name), message, RecompileWarning, stacklevel=2)


def contexts_seen(compile_data: Any, name: str) -> list[Any]:
    """The distinct flatten contexts input ``name`` of that function was compiled for."""
    with _lock:
        seen = _seen.get(compile_data, {}).get(name)
        return list(seen.contexts) if seen else []


def changed_fields(before: Any, after: Any, path: str = "ctx") -> list[str]:
    """Where two flatten contexts differ: ``ctx['scale']``, ``ctx[1]``, ``ctx.step`` or ``ctx`` itself."""
    if type(before) is not type(after):
        return [path]
    if isinstance(before, dict):
        keys = list(dict.fromkeys([*before, *after]))
        return [f for k in keys for f in changed_fields(before.get(k), after.get(k), f"{path}[{k!r}]")]
    if isinstance(before, (tuple, list)) and len(before) == len(after):
        return [f for i, (b, a) in enumerate(zip(before, after)) for f in changed_fields(b, a, f"{path}[{i}]")]
    if hasattr(before, "__dict__") and not isinstance(before, type) and vars(before) and not _same(before, after):
        attributes = list(dict.fromkeys([*vars(before), *vars(after)]))
        found = [
            f
            for name in attributes
            for f in changed_fields(getattr(before, name, None), getattr(after, name, None), f"{path}.{name}")
        ]
        return found or [path]
    return [] if _same(before, after) else [path]


def _user_name(history: Any, fn: Any) -> str | None:
    """``x`` or ``x.weight`` for an input whose provenance is positional argument 0 (or an attribute
    of it) of ``fn``; ``None`` when the provenance says something else."""
    inst = getattr(getattr(history, "inst", None), "name", None)
    inputs = getattr(history, "inputs", None) or []
    if inst == "LOAD_ATTR" and len(inputs) == 2:
        owner = _user_name(inputs[0], fn)
        return f"{owner}.{inputs[1].value}" if owner else None
    if inst == "BINARY_SUBSCR" and len(inputs) == 2 and getattr(inputs[0].inst, "name", None) == "INPUT_ARGS":
        index = inputs[1].value
        try:
            parameters = [
                p.name
                for p in inspect.signature(fn).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
            ]
        except (TypeError, ValueError):
            return None
        return parameters[index] if isinstance(index, int) and index < len(parameters) else None
    if inst == "BINARY_SUBSCR" and len(inputs) == 2 and getattr(inputs[0].inst, "name", None) == "INPUT_KWARGS":
        return str(inputs[1].value)
    return None


def _same(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - a context whose == raises or is ambiguous (tensors) counts as changed
        return a is b


def _message(compile_data: Any, name: str, seen: _Seen, previous: Any, ctx: Any, count: int) -> str:
    function = getattr(compile_data, "fn", None)
    function_name = getattr(function, "__name__", None) or type(function).__name__
    code = getattr(function, "__code__", None) or getattr(getattr(function, "forward", None), "__code__", None)
    where = f" (defined at {code.co_filename}:{code.co_firstlineno})" if code else ""
    fields = ", ".join(changed_fields(previous, ctx)) or "ctx"
    shown = ", ".join(repr(c) for c in seen.contexts[-4:])
    return (
        f"thunder.jit function {function_name!r}{where} was compiled {count} times because its {seen.subclass} input "
        f"{name!r} has a __tensor_flatten__ context that changes from call to call ({fields} changed; last "
        f"values: {shown}); the limit is {limit()} ({LIMIT_VARIABLE}). The context is a constant of the "
        f"compiled program: keep per-call values such as scales in inner tensors, not in the context."
    )
