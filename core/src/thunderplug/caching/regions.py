"""Regional compilation: ``thunder.jit`` of a module that torch.distributed drives from outside,
or whose repeated blocks should compile once.

``thunder.jit(DDP(model))`` and ``thunder.jit(root)`` where ``fully_shard`` was applied to blocks
inside ``root`` put torch.distributed's hooks *inside* the traced program: DDP's forward (bucket
bookkeeping, ``prepare_for_backward`` on the outputs, which stock thunder refuses) and each FSDP2
unit's pre-forward (all-gathers into storage FSDP resizes, parameters swapped mid-program, which a
trace that reads parameters once, in its prologue, cannot follow). torch.compile graph-breaks
around them. Here, in ``discover()`` compilations, the root's own code runs eagerly, and each
*region* is compiled by its own ``thunder.jit`` with the root's options:

* under FSDP2, every ``fully_shard`` unit below the root that contains no other unit: its hooks
  run eagerly around its compiled body (:func:`thunderplug.subclass.distributed.hoist_fsdp_hooks`, the
  path of ``thunder.jit(fully_shard(block))``), so it all-gathers, reshards and reduce-scatters
  exactly as eager FSDP2 does;
* under DDP, the wrapped module's children that hold parameters (descending through containers
  without a forward of their own, ``ModuleList``/``ModuleDict``), or the wrapped module itself
  when it holds parameters directly. Each region's backward is its own autograd node, so its
  parameters' gradients are ready when it ends and DDP's reducer all-reduces their bucket while
  the backward of the regions before it still runs (the overlap Dynamo's DDPOptimizer gets by
  splitting the graph at bucket boundaries); ``no_sync()`` is DDP's own;
* otherwise, when the model has *repeated blocks* (:func:`repeated_blocks`: two or more children
  of one ``ModuleList``/``Sequential`` with one :func:`thunderplug.caching.reuse.structure_of`, each a
  module of its own forward with submodules, or a module whose forward carries torch's
  ``torch.compiler.nested_compile_region`` marker): each block is a region, and blocks of one
  structure share one compilation (:mod:`thunderplug.caching.reuse`): thunder 0.2.6 inlines a whole model
  into one trace, so without regions a 16-layer model traces, transforms and claims 16 copies of
  its block. Everything outside the blocks runs eagerly, as under torchtitan's per-block
  ``torch.compile``: the root's own code (loops, residuals, the loss) and its other modules (a
  GPT's embeddings, final norm and head: compiling them as regions of their own cost the float8
  GPT about 1.7 s of its first call for under 1% of its step, ``docs/benchmarks.md``). This
  applies only when the module's structure can be shared (``reuse.jit_options_of``: no thunder
  transforms, the default cache option) and the compile option :data:`OPTION` is not ``False``;
  otherwise the model compiles whole, as before. Blocks that keep their index without reading it
  (transformers' ``layer_idx``, litgpt's ``block_idx``) are of one structure (numbers and strings count
  by type: the prologue checks the values the program reads); a block whose forward reads another
  value compiles its own. A call while a block has hooks of its own runs the model as one trace
  (:meth:`Regions.hooked`); once a call hands a block an object it may write to (a transformers
  cache), or a tensor requiring grad that an earlier block got (an encoder's output, shared position
  embeddings: eager sums its gradient use by use, regions region by region), the model runs as one trace
  from then on (:func:`_whole_model_when_unfit`; the random generators are set back first).

The regions are chosen at the first ``discover()`` call and looked at again when a region's slot
no longer holds its module (a block replaced after that call). The object ``thunder.jit`` returns
stays a ``ThunderModule`` of the root (its parameters, buffers and state_dict are the root's, under
the root's names); during its forward each region's slot in its parent module holds the region's
ThunderModule (the first call in, of any thread, puts them there, the last one out restores the
module tree).
``thunder.last_traces(root)`` lists the last execution trace of each region (in tree order),
``last_backward_traces`` their backward traces; :func:`compiled_regions` gives the regions'
ThunderModules by name. Stock ``thunder.jit`` of the same modules is left as it is (DDP: thunder's
refusal).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import thunder
import torch

from thunderplug.caching import reuse
from thunderplug.thunder_compat import jit_options, record_call

_REGIONS = "_thunderplug_regions"
_WHOLE = "whole"  # stored under _REGIONS: the model compiles whole (no regions worth having)
_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential)
#: ``thunder.jit(model, executors=discover(), thunderplug_regions=False)``: a model with repeated
#: blocks compiles whole, into one trace (DDP and FSDP2 regions are not optional: they are what works)
OPTION = "thunderplug_regions"


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


def may_have_regions(module: torch.nn.Module) -> bool:
    """Whether :func:`regional_forward` is worth installing: :func:`needs_regions`, or a
    ``ModuleList``/``Sequential`` or a marked module in the tree (whether its blocks repeat is
    decided at the first call, when the module is as it will be trained)."""
    return needs_regions(module) or any(isinstance(m, _CONTAINERS) or _marked(m) for m in module.modules())


def _marked(module: torch.nn.Module) -> bool:
    """``torch.compiler.nested_compile_region`` on the module's forward (on its class or the instance)."""
    return hasattr(module.forward, "__marked_compile_region_fn__")


def _is_block(module: torch.nn.Module) -> bool:
    """A module of its own forward made of submodules (a transformer block), not a leaf layer such
    as ``Linear`` (a ``Sequential`` of equal ``Linear`` layers is no stack of blocks)."""
    return type(module).forward is not torch.nn.Module.forward and any(True for _ in module.children())


def repeated_blocks(root: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules below ``root`` compiled as regions, in tree order: every block (:func:`_is_block`)
    of each ``ModuleList``/``Sequential`` where two blocks have one structure (a block that differs
    compiles its own), and every module marked with ``torch.compiler.nested_compile_region``."""
    found: dict[int, torch.nn.Module] = {}
    for module in root.modules():
        if module is not root and _marked(module):
            found[id(module)] = module
        if not isinstance(module, _CONTAINERS):
            continue
        blocks = [child for child in module._modules.values() if child is not None and _is_block(child)]
        if len({reuse.structure_of(child) for child in blocks}) < len(blocks):
            found.update((id(child), child) for child in blocks)
    return [m for m in root.modules() if id(m) in found]


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
    """The regions of ``root``, as described above (none: compile it whole)."""
    if not needs_regions(root):
        return block_slots(root)
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


def block_slots(root: torch.nn.Module) -> list[Slot]:
    """Each repeated block, descending through the modules that contain blocks; none when no block
    repeats."""
    blocks = {id(m) for m in repeated_blocks(root)}
    if not blocks:
        return []
    above: set[int] = set()  # modules with a block below them

    def mark(module: torch.nn.Module) -> bool:
        below = [mark(child) for child in module.children()]
        if any(below):
            above.add(id(module))
        return id(module) in blocks or any(below)

    mark(root)

    def verdict(module: torch.nn.Module) -> str:
        if id(module) in blocks:
            return "region"
        return "descend" if id(module) in above else "skip"

    return _slots(root, verdict)


class Regions:
    """The compiled regions of one root and how to put them in their slots for a call."""

    def __init__(self, root: torch.nn.Module, compile_data: Any, slots: list[Slot], earlier: Regions | None = None):
        if compile_data.transforms:
            raise NotImplementedError(
                "thunder.jit(..., transforms=...) of a DistributedDataParallel module or of a module with "
                "fully_shard blocks: its regions are jitted one by one, and thunder transforms are applied to "
                "one ThunderModule each; jit the blocks yourself to use transforms (docs/distributed.md)"
            )
        options = {**jit_options(compile_data), OPTION: False}  # a region compiles whole: one level of regions
        self.slots = slots
        self.shared_blocks = not needs_regions(root)  # the model's own repeated blocks, not DDP's or FSDP2's
        kept = {id(s.module): earlier.compiled[s.path] for s in earlier.slots} if earlier is not None else {}
        self.compiled = {
            slot.path: kept[id(slot.module)] if id(slot.module) in kept else self._jit(slot, options)
            for slot in self.slots
        }
        self._lock = threading.Lock()
        self._calls = 0  # calls running with the regions installed (threads, re-entrant calls)

    def hooked(self) -> bool:
        """A repeated block has hooks of its own or a ``forward`` set on it (transformers 5 registers
        forward hooks on each layer for ``output_hidden_states``, 4.57 wraps each layer's ``forward``): a
        region's trace would run them with the model's eager objects (a collector list, written inside a
        trace: thunder 0.2.6 leaves proxies in it), so the call runs the model as one trace. DDP's and
        FSDP2's regions handle their hooks themselves."""
        return self.shared_blocks and any(_call_wrapped(slot.module) for slot in self.slots)

    def _jit(self, slot: Slot, options: dict[str, Any]) -> torch.nn.Module:
        compiled = thunder.jit(slot.module, **options)
        if self.shared_blocks:  # a repeated block: the model's own code calls it with what it likes
            compiled._forward_fn = _whole_model_when_unfit(compiled._forward_fn, slot.module)
        return compiled

    def stale(self) -> bool:
        """A slot holds neither its module nor its region (installed by a call running in another
        thread): the user replaced a block since the regions were made."""
        held = [(slot.parent._modules.get(slot.name), slot) for slot in self.slots]
        return any(now is not slot.module and now is not self.compiled[slot.path] for now, slot in held)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """The regions in their slots while a call runs; the first call in puts them there, the last
        one out puts the modules back (a thread must not restore them under another's running call)."""
        with self._lock:
            if self._calls == 0:
                for slot in self.slots:
                    slot.parent._modules[slot.name] = self.compiled[slot.path]
            self._calls += 1
        try:
            yield
        finally:
            with self._lock:
                self._calls -= 1
                if self._calls == 0:
                    for slot in self.slots:
                        slot.parent._modules[slot.name] = slot.module

    def compilations(self) -> int:
        return sum(thunder.cache_misses(c) for c in self.compiled.values())

    def record_call(self, root_compiled: Any, compilations_before: int) -> None:
        """The root's statistics as thunder keeps them for a call it compiled whole: the regions' last
        traces (one per region), and the call as a cache miss when a region compiled in it."""
        stats = [thunder.compile_stats(c) for c in self.compiled.values()]
        record_call(
            root_compiled,
            [s.last_prologue_traces[-1] for s in stats if s.last_prologue_traces],
            [s.last_traces[-1] for s in stats if s.last_traces],
            [s.last_backward_traces[-1] for s in stats if s.last_backward_traces],  # none under no_grad
            compiled_anything=self.compilations() != compilations_before,
        )


class _RunWhole(Exception):
    """A block region cannot run this call: the model runs as one trace instead (``from_now_on``: the
    later calls too)."""

    def __init__(self, from_now_on: bool):
        super().__init__()
        self.from_now_on = from_now_on


def _whole_model_when_unfit(call: Callable[..., Any], block: torch.nn.Module) -> Callable[..., Any]:
    """A block region's call that gives the call back to :func:`regional_forward` when

    * the block has hooks of its own or a ``forward`` set on it, by the model's code in this call
      (transformers does for ``output_hidden_states``): see :meth:`Regions.hooked`;
    * an argument is an object other than tensors, plain values and containers of them
      (:func:`_held_object`): its attributes written in the region (transformers' KV cache, filled by each
      layer) are not carried back by thunder 0.2.6, silently, and list appends on it do not fit a shared
      compilation either;
    * a tensor argument requiring grad was an argument of an earlier block of this call
      (:func:`_shared_with_earlier_block`): BART's encoder output, read by every decoder layer's
      cross-attention, DeBERTa's relative position embeddings, read by every layer. Eager's autograd
      adds up its gradient one use at a time, in the order its backward reaches them; a region returns
      the sum of its own uses, which the engine then adds to the other regions' sums: another order of
      the same additions, ulps apart (BART drifted 1.2e-05 in three AdamW steps; one trace: bit-identical).

    The check runs before the block computes anything."""

    def checked(*args: Any, **kwargs: Any) -> Any:
        if _call_wrapped(block):
            raise _RunWhole(from_now_on=False)
        if _held_object((args, kwargs)) is not None or _shared_with_earlier_block((args, kwargs)):
            raise _RunWhole(from_now_on=True)
        return call(*args, **kwargs)

    return checked


_block_arguments = threading.local()  # ``seen``: id -> tensor, the grad-requiring tensors blocks got in this call


def _shared_with_earlier_block(value: Any) -> bool:
    """Whether a tensor in ``value`` (through tuples, lists and dicts) that requires grad was handed to an
    earlier block in the root's call running in this thread (then noted for the blocks after this one)."""
    seen = getattr(_block_arguments, "seen", None)
    if seen is None or not torch.is_grad_enabled():
        return False
    tensors = [t for t in torch.utils._pytree.tree_leaves(value) if isinstance(t, torch.Tensor) and t.requires_grad]
    if any(seen.get(id(t)) is t for t in tensors):
        return True
    seen.update((id(t), t) for t in tensors)
    return False


@contextlib.contextmanager
def _noting_block_arguments() -> Iterator[None]:
    """The tensors blocks receive during one root call, for :func:`_shared_with_earlier_block`."""
    outer = getattr(_block_arguments, "seen", None)
    _block_arguments.seen = {}
    try:
        yield
    finally:
        _block_arguments.seen = outer


def _call_wrapped(module: torch.nn.Module) -> bool:
    """The module's call runs more than its class's code: hooks of its own, or a ``forward`` set on the
    instance (transformers 4.57 wraps each layer's ``forward`` for ``output_hidden_states``)."""
    state = module.__dict__
    return "forward" in state or any(state.get(table) for table in reuse.HOOK_TABLES)


def _held_object(value: Any) -> Any:
    """The first value in ``value`` (through tuples, lists and dicts) that is no tensor, plain value,
    function or class (None: there is none)."""
    if isinstance(value, (tuple, list)):
        return next((found for v in value if (found := _held_object(v)) is not None), None)
    if isinstance(value, dict):
        return _held_object(list(value.values()))
    if isinstance(value, (torch.Tensor, *reuse.PLAIN, type)) or callable(value):
        return None
    return value


def regional_forward(
    thunder_module: torch.nn.Module,
    model: torch.nn.Module,
    compiled_call: Callable[..., Any],
    by_thunderplug: Callable[[], bool | None],
    parameters_replaced: Callable[[], bool],
) -> Callable[..., Any]:
    """The ``_forward_fn`` of ``thunder.jit(model)`` for a ``model`` that :func:`needs_regions`: in
    ``discover()`` compilations, ``model`` runs eagerly with its regions compiled; otherwise thunder's
    ``compiled_call`` (stock behaviour). A model whose ThunderModule has parameters of its own
    (``parameters_replaced``: a thunder transform, or the user, assigned to ``_overrides_parameters``,
    which only the root's trace reads) and no distributed regions runs as one trace."""
    module_ref = weakref.ref(thunder_module)
    lock = threading.Lock()

    def forward(*args: Any, **kwargs: Any) -> Any:
        this = module_ref()
        if this is None or not by_thunderplug():
            return compiled_call(*args, **kwargs)
        regions = this.__dict__.get(_REGIONS)
        if regions is None or (regions is not _WHOLE and regions.stale()):
            with lock:
                regions = this.__dict__.get(_REGIONS)
                if regions is None or (regions is not _WHOLE and regions.stale()):
                    regions = this.__dict__[_REGIONS] = _plan(model, thunder.compile_data(this), regions)
        if regions is _WHOLE or regions.hooked() or (regions.shared_blocks and parameters_replaced()):
            return compiled_call(*args, **kwargs)
        compilations_before = regions.compilations()
        rng = _rng_states()
        try:
            with regions.installed(), _noting_block_arguments():
                result = model(*args, **kwargs)
        except _RunWhole as unfit:
            if unfit.from_now_on:
                this.__dict__[_REGIONS] = _WHOLE
            _restore_rng_states(rng)  # the one trace draws the random numbers eager draws (dropout)
        else:
            regions.record_call(this, compilations_before)
            return result
        # outside the handler: an error of the one trace is not shown as raised while handling _RunWhole
        return compiled_call(*args, **kwargs)  # the model's eager code before the block ran once more

    return forward


def _rng_states() -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """torch's CPU generator state and, once CUDA is initialized, every device's."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _restore_rng_states(states: tuple[torch.Tensor, list[torch.Tensor] | None]) -> None:
    cpu, cuda = states
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def _plan(model: torch.nn.Module, compile_data: Any, earlier: Regions | str | None) -> Regions | str:
    """The regions of ``model`` (keeping the compiled regions of ``earlier`` whose module stayed), or
    :data:`_WHOLE` when it compiles whole: no block repeats, :data:`OPTION` is ``False``, or the blocks'
    compilations could not be shared (DDP and FSDP2 models always get their regions)."""
    distributed = needs_regions(model)
    if not distributed and (
        compile_data.compile_options.get(OPTION, True) is False or reuse.jit_options_of(compile_data) is None
    ):
        return _WHOLE
    slots = region_slots(model)
    if not slots:
        return _WHOLE
    return Regions(model, compile_data, slots, earlier if isinstance(earlier, Regions) else None)


def compiled_regions(compiled: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """``qualified name -> ThunderModule`` of the regions of ``thunder.jit(root, executors=discover())``
    (empty before its first call, or when the root was compiled whole)."""
    regions = compiled.__dict__.get(_REGIONS)
    return dict(regions.compiled) if isinstance(regions, Regions) else {}


def ddp_no_sync(model: torch.nn.Module) -> Callable[[], Any] | None:
    """DDP's ``no_sync`` for ``thunder.jit(DDP(model))`` (ThunderModule's own is thunder's ddp's)."""
    return model.no_sync if _is_ddp(model) else None
