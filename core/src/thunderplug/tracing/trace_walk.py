"""Facts about the trace thunder is recording, gathered from its bound symbols as they are added, each visited
once: questions asked many times while a program is interpreted (does this tensor require grad in eager, is this
number read from a tensor) would otherwise walk the whole trace so far on every ask.

A fact is a state (sets, typically) that a ``visit`` function extends with one bound symbol at a time, in the order
the trace holds them; :func:`facts` brings it up to date with the symbols bound since the last ask, in every open
scope (a scope is the list the symbols of one call being traced go to: an ``autograd.Function`` or checkpoint
lookaside traces the user's function in one). A scope that was replaced or cut back since (thunder's
``bound_symbols`` setter, a retried interpretation) is visited again from its start, so ``visit`` must be
idempotent: it only adds to the state.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx

State = TypeVar("State")


@dataclass
class _Walk:
    state: Any
    #: per open scope (by id), the scope itself (kept alive, so its id is not reused), how many of its symbols
    #: were visited and the last of them
    visited: dict[int, tuple[list, int, BoundSymbol | None]] = field(default_factory=dict)


#: per trace, per fact's name, its walk
_walks: weakref.WeakKeyDictionary[TraceCtx, dict[str, _Walk]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def facts(trace: TraceCtx, name: str, start: Callable[[], State], visit: Callable[[State, BoundSymbol], None]) -> State:
    """The state of the fact ``name`` of ``trace``: ``start()`` extended by ``visit`` with every bound symbol of
    the trace's open scopes, those not visited before first visited now."""
    with _lock:
        walks = _walks.setdefault(trace, {})
        walk = walks.get(name)
        if walk is None:
            walk = walks[name] = _Walk(start())
    for scope in trace.scopes:
        kept, done, last = walk.visited.get(id(scope), (scope, 0, None))
        if kept is not scope or done > len(scope) or (done and scope[done - 1] is not last):
            done = 0
        for bsym in scope[done:]:
            visit(walk.state, bsym)
        walk.visited[id(scope)] = (scope, len(scope), scope[-1] if scope else None)
    return walk.state
