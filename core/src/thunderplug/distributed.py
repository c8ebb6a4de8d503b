"""torch.distributed under ``discover()`` compilations: what thunder 0.2.6 needs changed for it.

FSDP2 (``fully_shard``) swaps a module's parameters: sharded ``DTensor`` parameters between steps,
all-gathered unsharded ones during forward and backward. torch.compile reads parameters through
the module on every call and follows. thunder's ``ThunderModule`` instead copies the parameter
dict when it is created (``_overrides_parameters``, a lookup cache that transforms such as
thunder's own fsdp also write to), so a block jitted before ``fully_shard`` keeps training the
full copies it captured, and the parameters the optimizer steps get no gradient: silently wrong.
:class:`LiveParameters` replaces that copy for ``discover()`` compilations: a name that no
transform has overridden reads the module's current parameter, so whatever FSDP2 (or a user)
put there is what the prologue unpacks, and its guards re-trace when its type or metadata
changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch


class LiveParameters(dict):
    """``name -> parameter`` that reads through to ``module`` for the names captured at creation.

    A name assigned later (a transform replacing the parameter with its own, as thunder's fsdp
    does with the shard) keeps the assigned value. ``live()`` says whether to read through at all
    (``False``: exactly the dict thunder built; used outside ``discover()`` compilations).
    """

    def __init__(self, module: torch.nn.Module, captured: dict[str, Any], live: Callable[[], bool]):
        super().__init__(captured)
        self._module = module
        self._captured = set(captured)
        self._live = live

    def _current(self, name: str) -> Any:
        if name in self._captured and self._live():
            try:
                return self._module.get_parameter(name)
            except AttributeError:  # removed from the module: the captured value is all there is
                pass
        return dict.__getitem__(self, name)

    def __getitem__(self, name: str) -> Any:
        return self._current(name)

    def get(self, name: str, default: Any = None) -> Any:
        return self._current(name) if name in self else default

    def __setitem__(self, name: str, value: Any) -> None:
        self._captured.discard(name)
        dict.__setitem__(self, name, value)

    def __delitem__(self, name: str) -> None:
        self._captured.discard(name)
        dict.__delitem__(self, name)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for name, value in dict(*args, **kwargs).items():
            self[name] = value

    def setdefault(self, name: str, default: Any = None) -> Any:
        if name not in self:
            self[name] = default
        return self[name]

    def pop(self, name: str, *default: Any) -> Any:
        if name not in self:
            return dict.pop(self, name, *default)
        value = self._current(name)
        del self[name]
        return value

    def items(self) -> Iterator[tuple[str, Any]]:  # type: ignore[override]
        return iter([(name, self._current(name)) for name in self])

    def values(self) -> Iterator[Any]:  # type: ignore[override]
        return iter([self._current(name) for name in self])

    def copy(self) -> dict[str, Any]:
        return dict(self.items())


def hoist_fsdp_hooks(wrapper: torch.nn.Module, module: torch.nn.Module) -> bool:
    """``thunder.jit(fully_shard(block))``: run FSDP2's forward hooks eagerly around the compiled call.

    ``fully_shard`` registers its pre- and post-forward hooks on ``module``; thunder would trace
    them (all-gathers into storage FSDP resizes, profiler ranges, autograd hooks on the inputs),
    which fails (stock thunder: ``profiler._record_function_enter_new is not registered``). They are
    moved to ``wrapper`` (the ThunderModule), as torch.compile runs them outside its graph, so the
    compiled code sees the all-gathered parameters, exactly as with ``fully_shard(thunder.jit(block))``.
    Returns whether hooks were moved; the wrapper's parameters must then be read live.
    """
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(module, FSDPModule):
        return False
    state = module._get_fsdp_state()
    if len(state._modules) != 1:  # fully_shard([a, b]) shares one group hook: left where it is
        return False
    state._pre_forward_hook_handle.remove()
    state._post_forward_hook_handle.remove()
    state._pre_forward_hook_handle = wrapper.register_forward_pre_hook(
        state._pre_forward, prepend=True, with_kwargs=True
    )
    state._post_forward_hook_handle = wrapper.register_forward_hook(state._post_forward, prepend=False)
    return True
