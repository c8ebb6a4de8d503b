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

Functional collectives (``torch.ops._c10d_functional.*``: what DTensor, funcol and torchtitan's
code call) are asynchronous: the op returns at once and ``wait_tensor`` blocks until the result
is there. thunder 0.2.6 maps two of their packets to its own symbols, ``all_reduce`` to its
synchronous prim (no gradient rule) and ``wait_tensor`` to an identity, so a packet-form
``wait_tensor`` after an asynchronous ``all_gather_into_tensor`` reads the buffer before the
collective filled it: silently wrong values. :func:`collective_lookasides` sends those packets,
in ``discover()`` compilations, to the same place as every other collective: the ATen table's
fallback symbols, which run each op as itself (the wait really waits; it depends on its
collective's output, so it stays after it) with torch's own autograd.

Also here: FSDP2's hooks of a ``fully_shard``-then-jit block run eagerly around the compiled call
(:func:`hoist_fsdp_hooks`); ``thunder.jit`` of DDP or of a module with ``fully_shard`` blocks compiles
them region by region, as ``thunder.jit`` of a model with repeated blocks (:mod:`thunderplug.caching.regions`,
wired into ThunderModule's ``__init__`` here);
DTensor's API (``from_local``, ``to_local``, ``redistribute``, ``distribute_tensor``) becomes ops
of the generic subclass core instead of thunder's DTensorProxy symbols (:func:`dtensor_lookasides`);
profiler ranges are dropped (:func:`profiler_range_lookasides`).
docs/distributed.md says what works and in which order.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import thunder
import torch
from thunder.core.jit_ext import record_source_loc_in_symbol_header

from thunderplug.caching import regions
from thunderplug.thunder_compat import replace_thunder_module_parameters, torch_to_thunder_function_map
from thunderplug.tracing.aten import AtenTable

#: namespaces of torch's functional collectives
COLLECTIVE_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd", "c10d_functional")


class LiveParameters(dict):
    """``name -> parameter`` that reads through to ``module`` for the names captured at creation.

    A name assigned later (a transform replacing the parameter with its own, as thunder's fsdp
    does with the shard) keeps the assigned value. ``live()`` says whether to read through at all
    (``False``: exactly the dict thunder built; used outside ``discover()`` compilations; ``None``:
    not known yet, asked again next time; a ``bool`` answer is kept).
    """

    def __init__(self, module: torch.nn.Module, captured: dict[str, Any], live: Callable[[], bool | None]):
        super().__init__(captured)
        self._module = module
        self._captured = set(captured)
        self._live = live
        self._is_live: bool | None = None
        self.replaced = False  # a name assigned or removed since creation (a transform's own parameters)

    def _reads_through(self) -> bool:
        if self._is_live is None:
            self._is_live = self._live()
        return bool(self._is_live)

    def _current(self, name: str) -> Any:
        if name in self._captured and self._reads_through():
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
        self.replaced = True
        dict.__setitem__(self, name, value)

    def __delitem__(self, name: str) -> None:
        self._captured.discard(name)
        self.replaced = True
        dict.__delitem__(self, name)

    def clear(self) -> None:
        self._captured.clear()
        self.replaced = True
        dict.clear(self)

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

    def popitem(self) -> tuple[str, Any]:
        if not self:
            return dict.popitem(self)  # KeyError, as a dict's
        name = next(reversed(self))
        return name, self.pop(name)

    def __ior__(self, other: Any) -> LiveParameters:  # type: ignore[override,misc]
        self.update(other)
        return self

    def __or__(self, other: Any) -> dict[str, Any]:  # type: ignore[override]
        return {**self.copy(), **dict(other)}

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


def thunder_module_init(original: Callable[..., None]) -> Callable[..., None]:
    """``ThunderModule.__init__`` that gives the new module :class:`LiveParameters` (read through
    in ``discover()`` compilations) and moves FSDP2's forward hooks onto it (:func:`hoist_fsdp_hooks`;
    then the parameters are read through whatever the executors: the captured ones are sharded).
    A DDP module, one with ``fully_shard`` blocks or one that may have repeated blocks gets a forward
    that, in ``discover()`` compilations, compiles it region by region where that applies
    (:func:`thunderplug.caching.regions.regional_forward`); DDP also gets DDP's ``no_sync``."""

    def replacement(self: torch.nn.Module, model: torch.nn.Module, compiled_model_call: Any) -> None:
        original(self, model, compiled_model_call)
        hoisted = hoist_fsdp_hooks(self, model)
        by_thunderplug = _compiled_by_thunderplug(weakref.ref(self))
        replace_thunder_module_parameters(
            self, lambda captured: LiveParameters(model, captured, _always if hoisted else by_thunderplug)
        )
        if regions.may_have_regions(model):
            self._forward_fn = regions.regional_forward(
                self, model, compiled_model_call, by_thunderplug, lambda: self._overrides_parameters.replaced
            )
            if (ddp_no_sync := regions.ddp_no_sync(model)) is not None:
                self.no_sync = _either(ddp_no_sync, self.no_sync, by_thunderplug)

    return replacement


def _either(ours: Callable[[], Any], thunders: Callable[[], Any], by_thunderplug: Callable[[], bool | None]):
    """``no_sync`` of ``thunder.jit(DDP(model))``: DDP's own in ``discover()`` compilations."""

    def no_sync() -> Any:
        return ours() if by_thunderplug() else thunders()

    return no_sync


def _always() -> bool:
    return True


def _compiled_by_thunderplug(module_ref: weakref.ref) -> Callable[[], bool | None]:
    def answer() -> bool | None:
        module = module_ref()
        compile_data = thunder.compile_data(module) if module is not None else None
        if compile_data is None:
            return None  # thunder.jit has not attached its CompileData yet
        # the core executor of discover()'s list is the one carrying an ATen table
        return any(isinstance(getattr(ex, "aten", None), AtenTable) for ex in compile_data.executors_list)

    return answer


def distributed_lookasides(table: AtenTable) -> dict[Any, Callable[..., Any]]:
    """Executor lookasides for the core executor of a ``discover()`` list: functional collectives
    through ``table`` (:func:`collective_lookasides`), DTensor's API as ops traced on fakes
    (:func:`dtensor_lookasides`), profiler ranges dropped (:func:`profiler_range_lookasides`)."""
    return {
        **collective_lookasides(table),
        **dtensor_lookasides(),
        **profiler_range_lookasides(),
        **fsdp_hook_lookasides(),
    }


class FSDPInsideJitError(NotImplementedError):
    """FSDP2's forward hooks of a module inside the jitted one would be traced."""


def fsdp_hook_lookasides() -> dict[Any, Callable[..., Any]]:
    """FSDP2's pre-forward hook reached while tracing: a ``fully_shard`` module called by jitted code
    whose hooks are not run around a compiled call (a jitted function that calls a sharded model;
    ``fully_shard([a, b])``'s shared hook). The hook all-gathers into storage FSDP resizes and swaps
    the module's parameters mid-program, which thunder's trace (parameters read once, in the
    prologue) cannot follow; stock thunder fails on ``Unknown attribute itemsize``. Refused by name,
    with what works: jitting the module (:mod:`thunderplug.caching.regions`) or each sharded block."""
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    def refuse(state: Any, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        raise FSDPInsideJitError(
            f"thunder.jit reached the FSDP2 forward hook of a fully_shard {type(module).__name__} inside jitted "
            "code: FSDP2's hooks run eagerly only around a jitted module. Jit the module itself "
            "(`thunder.jit(model, ...)`: each fully_shard block becomes a compiled region), or each sharded "
            "block, before or after fully_shard: `block = thunder.jit(block, ...); fully_shard(block)` "
            "(torchtitan's order) or `fully_shard(block); block = thunder.jit(block, ...)` (docs/distributed.md)"
        )

    return {FSDPState._pre_forward: refuse}


def profiler_range_lookasides() -> dict[Any, Callable[..., Any]]:
    """``with torch.profiler.record_function(name):`` inside jitted code (FSDP2's hooks, torchtitan,
    user code) is dropped from the trace: a profiler range is an annotation, and its ops return a
    ``ScriptObject`` handle no proxy can stand for (stock thunder: ``profiler._record_function_enter_new
    is not registered``). The code inside the range is traced as usual."""
    from torch.autograd.profiler import record_function

    return {
        record_function.__enter__: lambda self: self,
        record_function.__exit__: lambda self, *exc_info: None,
    }


def dtensor_lookasides() -> dict[Any, Callable[..., Any]]:
    """``DTensor.from_local``, ``to_local`` and ``redistribute``, which thunder maps to its own
    DTensorProxy symbols (no gradient through ``from_local``), and ``distribute_tensor``, which
    thunder would interpret (and fail on ``tensor.is_leaf``), as ops of the generic subclass core:
    each traced on fakes, forward and backward, through DTensor's own autograd.Functions, so the
    collectives a redistribution needs appear in the trace as the ops they are."""
    from thunderplug.subclass.symbols import unrolled_op_symbol

    def lookaside(fn: Callable[..., Any]) -> Callable[..., Any]:
        symbol = unrolled_op_symbol(fn.__qualname__, fn)
        return record_source_loc_in_symbol_header(lambda *args, **kwargs: symbol(*args, **kwargs))

    from torch.distributed.tensor import distribute_tensor

    mapped = {
        fn: lookaside(fn)
        for fn in torch_to_thunder_function_map()
        if getattr(fn, "__qualname__", "").startswith("DTensor.")
        and getattr(fn, "__module__", "").startswith("torch.distributed.tensor")
    }
    symbol = unrolled_op_symbol("distribute_tensor", functional_distribute_tensor)

    def distribute(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        result, overwritten = symbol(tensor, *args, **kwargs)
        if overwritten is not None:  # as eager's in-place broadcast into the caller's tensor
            tensor.detach().copy_(overwritten)
        return result

    mapped[distribute_tensor] = record_source_loc_in_symbol_header(distribute)
    return mapped


def functional_distribute_tensor(
    tensor: torch.Tensor, device_mesh: Any = None, placements: Any = None, *, src_data_rank: int | None = 0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``distribute_tensor`` with functional collectives, on meshes of any dimension; returns the
    DTensor and what eager leaves in ``tensor`` (``None``: unchanged).

    torch's own scatters and broadcasts in place (``c10d.broadcast_``, which has no fake kernel, so
    it cannot be traced); this one does what it does one mesh dimension at a time, functionally: it
    broadcasts from group rank ``src_data_rank`` of that dimension's group, then a ``Shard`` keeps
    this rank's chunk (``torch.chunk``, as ``Shard`` splits; a scatter sends the same bits), and
    wraps the result with ``from_local``. So every rank's local tensor comes from the rank at
    coordinate ``src_data_rank`` on every mesh dimension, as in eager. As in eager, the result is a
    new leaf: no gradient flows back to ``tensor``. Eager's broadcasts for the ``Replicate``
    placements before the first ``Shard`` write into (a detached alias of) the caller's tensor, so
    on the other ranks it then holds the source's values; the caller applies that write.
    """
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if device_mesh is None:
        raise NotImplementedError(
            "distribute_tensor inside thunder.jit(executors=discover()) needs an explicit device_mesh; "
            "call it outside the jitted function to use the default mesh"
        )
    placements = list(placements) if placements is not None else [Replicate()] * device_mesh.ndim
    if len(placements) != device_mesh.ndim:
        raise ValueError(f"distribute_tensor: {len(placements)} placements for a {device_mesh.ndim}-D device_mesh")
    coordinate = device_mesh.get_coordinate()
    local = tensor.detach() if coordinate is not None else tensor.new_empty(0)  # not in the mesh: as eager
    overwritten, in_place = None, src_data_rank is not None
    for mesh_dim, placement in enumerate(placements if coordinate is not None else []):
        if not isinstance(placement, (Shard, Replicate)):
            raise TypeError(f"distribute_tensor does not take {placement} placements")
        if src_data_rank is not None:
            group = device_mesh.get_group(mesh_dim)
            local = funcol.wait_tensor(funcol.broadcast(local.contiguous(), src=src_data_rank, group=group))
        in_place = in_place and isinstance(placement, Replicate)  # a Shard scatters into a new tensor
        if in_place:
            overwritten = local
        if isinstance(placement, Shard):
            dim = placement.dim % tensor.ndim
            placements[mesh_dim] = Shard(dim)
            chunks = torch.chunk(local, device_mesh.size(mesh_dim), dim=dim)
            index = coordinate[mesh_dim]
            local = chunks[index] if index < len(chunks) else local.narrow(dim, 0, 0)
    result = DTensor.from_local(
        local.contiguous(), device_mesh, placements, run_check=False, shape=tensor.shape, stride=tensor.stride()
    )
    return (result.requires_grad_(tensor.requires_grad) if tensor.requires_grad else result), overwritten


def collective_lookasides(table: AtenTable) -> dict[Any, Callable[..., Any]]:
    """The functional-collective packets thunder maps to its own symbols, resolved through
    ``table`` instead (each op runs as itself)."""
    packets = [
        fn
        for fn in torch_to_thunder_function_map()
        if isinstance(fn, torch._ops.OpOverloadPacket) and fn._qualified_op_name.split("::")[0] in COLLECTIVE_NAMESPACES
    ]
    return {
        packet: record_source_loc_in_symbol_header(functools.partial(table.call_packet, packet)) for packet in packets
    }


def redistributed(value: torch.Tensor, spec: Any) -> torch.Tensor:
    """DTensor ``value`` with the placements of ``spec`` (a ``DTensorSpec``), ``Partial`` ones
    included: a gradient converted to the placements eager autograd gives it
    (``subclass.gradient_layouts``), which can be ``Partial``, which DTensor's public
    ``redistribute`` refuses to make. Its own redistribution of local tensors (what its ops use)
    makes them from ``Replicate`` only (dividing by the mesh dimension's size), so a ``Shard`` that
    must become ``Partial`` is replicated first."""
    import dataclasses

    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor._redistribute import redistribute_local_tensor

    local, current = value._local_tensor, value._spec
    via = [
        Replicate() if target.is_partial() and not now.is_partial() else now
        for now, target in zip(current.placements, spec.placements)
    ]
    if via != list(current.placements):
        replicated = dataclasses.replace(current, placements=tuple(via))
        local, current = redistribute_local_tensor(local, current, replicated), replicated
    return DTensor(redistribute_local_tensor(local, current, spec), spec, requires_grad=False)
