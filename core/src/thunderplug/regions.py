"""Regional compilation: ``thunder.jit`` of a module that torch.distributed drives from outside.

``thunder.jit(DDP(model))`` and ``thunder.jit(root)`` where ``fully_shard`` was applied to blocks
inside ``root`` put torch.distributed's hooks *inside* the traced program: DDP's forward (bucket
bookkeeping, ``prepare_for_backward`` on the outputs, which stock thunder refuses) and each FSDP2
unit's pre-forward (all-gathers into storage FSDP resizes, parameters swapped mid-program, which a
trace that reads parameters once, in its prologue, cannot follow). torch.compile graph-breaks
around them. Here, in ``discover()`` compilations, the root's own code runs eagerly, and each
*region* is compiled by its own ``thunder.jit`` with the root's options:

* under FSDP2, every ``fully_shard`` unit below the root that contains no other unit: its hooks
  run eagerly around its compiled body (:func:`thunderplug.distributed.hoist_fsdp_hooks`, the
  path of ``thunder.jit(fully_shard(block))``), so it all-gathers, reshards and reduce-scatters
  exactly as eager FSDP2 does;
* under DDP, the wrapped module's children that hold parameters (descending through containers
  without a forward of their own, ``ModuleList``/``ModuleDict``), or the wrapped module itself
  when it holds parameters directly. Each region's backward is its own autograd node, so its
  parameters' gradients are ready when it ends and DDP's reducer all-reduces their bucket while
  the backward of the regions before it still runs (the overlap Dynamo's DDPOptimizer gets by
  splitting the graph at bucket boundaries); ``no_sync()`` is DDP's own.

The object ``thunder.jit`` returns stays a ``ThunderModule`` of the root (its parameters, buffers
and state_dict are the root's, under the root's names); during its forward each region's slot in
its parent module holds the region's ThunderModule, and the module tree is restored afterwards.
``thunder.last_traces(root)`` lists the last execution trace of each region (in tree order),
``last_backward_traces`` their backward traces; :func:`compiled_regions` gives the regions'
ThunderModules by name. Stock ``thunder.jit`` of the same modules is left as it is (DDP: thunder's
refusal).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import thunder
import torch

from thunderplug.thunder_compat import jit_options, set_last_traces

_REGIONS = "_thunderplug_regions"


@dataclass(frozen=True)
class Slot:
    """Where a region sits: ``parent._modules[name]`` is ``module``; ``path`` is its qualified name."""

    parent: torch.nn.Module
    name: str
    path: str
    module: torch.nn.Module


def _is_ddp(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.parallel.DistributedDataParallel)


def _fsdp_units(module: torch.nn.Module) -> list[torch.nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule)]


def needs_regions(module: torch.nn.Module) -> bool:
    """DDP, or a module with ``fully_shard`` units below it."""
    return _is_ddp(module) or any(unit is not module for unit in _fsdp_units(module))


def _slots(root: torch.nn.Module, accept: Callable[[torch.nn.Module], str]) -> list[Slot]:
    """Pre-order slots below ``root``; ``accept(module)`` says "region", "descend" or "skip"."""
    found: list[Slot] = []

    def visit(parent: torch.nn.Module, prefix: str) -> None:
        for name, child in parent._modules.items():
            if child is None:
                continue
            path = f"{prefix}{name}"
            verdict = accept(child)
            if verdict == "region":
                found.append(Slot(parent, name, path, child))
            elif verdict == "descend":
                visit(child, f"{path}.")

    visit(root, "")
    return found


def region_slots(root: torch.nn.Module) -> list[Slot]:
    """The regions of ``root`` (DDP or a module with FSDP2 units below it), as described above."""
    if _is_ddp(root):
        inner = root.module
        if any(True for _ in inner.parameters(recurse=False)):
            return [Slot(root, "module", "module", inner)]

        def data_parallel(module: torch.nn.Module) -> str:
            if type(module).forward is torch.nn.Module.forward:  # a container: ModuleList, ModuleDict
                return "descend"
            return "region" if any(True for _ in module.parameters()) else "skip"

        found = _slots(inner, data_parallel)
        slots = [Slot(s.parent, s.name, f"module.{s.path}", s.module) for s in found]
        return slots or [Slot(root, "module", "module", inner)]
    units = {id(unit) for unit in _fsdp_units(root) if unit is not root}

    def sharded(module: torch.nn.Module) -> str:
        if id(module) in units and not any(id(m) in units for m in module.modules() if m is not module):
            return "region"
        return "descend"

    return _slots(root, sharded)


class Regions:
    """The compiled regions of one root and how to put them in their slots for a call."""

    def __init__(self, root: torch.nn.Module, compile_data: Any):
        if compile_data.transforms:
            raise NotImplementedError(
                "thunder.jit(..., transforms=...) of a DistributedDataParallel module or of a module with "
                "fully_shard blocks: its regions are jitted one by one, and thunder transforms are applied to "
                "one ThunderModule each; jit the blocks yourself to use transforms (docs/distributed.md)"
            )
        options = jit_options(compile_data)
        self.slots = region_slots(root)
        self.compiled = {slot.path: thunder.jit(slot.module, **options) for slot in self.slots}

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        for slot in self.slots:
            slot.parent._modules[slot.name] = self.compiled[slot.path]
        try:
            yield
        finally:
            for slot in self.slots:
                slot.parent._modules[slot.name] = slot.module

    def record_traces(self, root_compiled: Any) -> None:
        stats = [thunder.compile_stats(c) for c in self.compiled.values()]
        set_last_traces(
            root_compiled,
            [s.last_traces[-1] for s in stats if s.last_traces],
            [s.last_backward_traces[-1] for s in stats if s.last_backward_traces],  # none under no_grad
        )


def regional_forward(
    thunder_module: torch.nn.Module,
    model: torch.nn.Module,
    compiled_call: Callable[..., Any],
    by_thunderplug: Callable[[], bool | None],
) -> Callable[..., Any]:
    """The ``_forward_fn`` of ``thunder.jit(model)`` for a ``model`` that :func:`needs_regions`: in
    ``discover()`` compilations, ``model`` runs eagerly with its regions compiled; otherwise thunder's
    ``compiled_call`` (stock behaviour)."""
    module_ref = weakref.ref(thunder_module)

    def forward(*args: Any, **kwargs: Any) -> Any:
        this = module_ref()
        if this is None or not by_thunderplug():
            return compiled_call(*args, **kwargs)
        regions = this.__dict__.get(_REGIONS)
        if regions is None:
            regions = Regions(model, thunder.compile_data(this))
            this.__dict__[_REGIONS] = regions
        with regions.installed():
            result = model(*args, **kwargs)
        regions.record_traces(this)
        return result

    return forward


def compiled_regions(compiled: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """``qualified name -> ThunderModule`` of the regions of ``thunder.jit(root, executors=discover())``
    (empty before its first call, or when the root was compiled whole)."""
    regions = compiled.__dict__.get(_REGIONS)
    return dict(regions.compiled) if regions is not None else {}


def ddp_no_sync(model: torch.nn.Module) -> Callable[[], Any] | None:
    """DDP's ``no_sync`` for ``thunder.jit(DDP(model))`` (ThunderModule's own is thunder's ddp's)."""
    return model.no_sync if _is_ddp(model) else None
