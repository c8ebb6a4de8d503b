"""Modules of one structure share one compilation (issue 26).

``thunder.jit(block)`` on each of a model's identical blocks would compile the same program once
per block. thunder traces a module's parameters as inputs its prologue fetches
(``module.get_parameter(name)``), so two blocks of one structure get the same computation and
backward: only the prologue's module differs. A block's first compilation is offered here under its
:func:`structure_of` key; a block of the same structure first tries those compilations' prologues,
rebound to its own module (thunderplug's ``wiring.sharing.shared_compilations``): their
guards (every input's, parameter's and subclass's metadata, every number and string the program read
from the module, grad and autocast modes) decide, exactly as for the block's own cache entries, and the key
covers what a prologue does not check (the modules' classes, so their code, the values of attributes
the prologue does not check, aliasing between parameters, the jit options). Attributes that differ
between blocks but are not read by their forward (transformers' ``layer_idx``, litgpt's
``block_idx``) thus do not keep the blocks from sharing.

Nothing here is keyed by names that repeat: keys are whole structures, and the registry holds
each group only while a jitted module that offered or adopted one of its compilations lives.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
import types
import weakref
from collections.abc import Hashable
from typing import Any

import torch

from thunderplug.thunder_compat import debug_option_values
from thunderplug.tracing.compilation import CompilationRecord, record_of

#: compilations kept per structure (inputs of other shapes, other grad modes, ...): a prologue is
#: tried for each on a miss, so the list stays short
MAX_PER_STRUCTURE = 8
_DEPTH = 6  # nesting of attribute values looked into; deeper ones are compared by identity
_MODULE_TABLES = {"_parameters", "_buffers", "_modules"}
#: a module's hook tables (a module with hooks is its own structure)
HOOK_TABLES = frozenset(
    {
        "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks",
    }
)
#: run by ``state_dict``/``load_state_dict``, never by a forward
_STATE_DICT_HOOKS = frozenset(
    {"_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks"}
)
#: torch's composable APIs (``fully_shard``) keep their state under keys with this prefix; only the
#: hooks those APIs register read it (a module with hooks is its own structure; FSDP2's are moved
#: onto the ThunderModule), so the state counts by its types
_COMPOSABLE_STATE = "__composable_api_"
PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.layout,
          torch.memory_format, enum.Enum)  # values compared by value
#: a module's own attributes of these exact types count by their type only: thunder's prologue
#: checks the value of each one the program reads (``check_number_type_and_value``,
#: ``check_string_value``, under the default cache option), so a block whose forward reads another
#: value fails the guard and compiles its own, and one that never reads it (transformers'
#: ``layer_idx``, read only with a KV cache; litgpt's ``block_idx``) shares. Values of other types
#: (``None``, dtypes, enums, ... read without a check) and values inside containers still count.
_GUARDED = (bool, int, float, complex, str)


class Identity:
    """A value compared by identity (and kept alive, so its ``id`` is never reused while compared)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Identity) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


@dataclasses.dataclass(eq=False)
class SharedCompilation:
    """One compilation (thunder's cache entry, its prologue unbound from the module it was traced
    for) and who uses it: the function that compiled it and those that adopted it."""

    entry: Any  # thunder's CacheEntry; ``prologue_fn`` is the unbound prologue
    record: CompilationRecord  # the record of the compilation (explain, error lines)
    owner: str  # the module it was compiled for, as ``explain`` names it
    users: weakref.WeakSet = dataclasses.field(default_factory=weakref.WeakSet)  # CompileData of adopters

    @property
    def reuses(self) -> int:
        """How many other jitted modules run this compilation."""
        return len(self.users)


class SharedGroup:
    """The compilations of one structure, newest last; ``version`` counts offers so that a module
    knows when to look again."""

    def __init__(self) -> None:
        self.compilations: list[SharedCompilation] = []
        self.version = 0
        self.lock = threading.Lock()

    def offer(self, compilation: SharedCompilation) -> int:
        """Add ``compilation``; the version before it."""
        with self.lock:
            self.compilations = [*self.compilations, compilation][-MAX_PER_STRUCTURE:]
            self.version += 1
            return self.version - 1

    def since(self, version: int) -> tuple[list[SharedCompilation], int]:
        """The compilations offered after ``version`` (all of those still kept), and the version now."""
        with self.lock:
            fresh = self.version - version
            return (self.compilations[-fresh:] if fresh > 0 else []), self.version


_groups: weakref.WeakValueDictionary[Hashable, SharedGroup] = weakref.WeakValueDictionary()
_groups_lock = threading.Lock()


def group_for(key: Hashable) -> SharedGroup:
    """The group of ``key`` (created when none lives); the caller keeps it alive."""
    with _groups_lock:
        group = _groups.get(key)
        if group is None:
            group = _groups[key] = SharedGroup()
        return group


def structure_of(module: torch.nn.Module, depth: int = _DEPTH) -> Hashable:
    """What a module's trace depends on besides what its prologue checks, as one hashable key:
    per submodule (in order) its name and class, every attribute's value (numbers and strings by
    their type only: the prologue checks the values the program reads, :data:`_GUARDED`; other plain
    values by value, frozen dataclasses, containers and modules without tensors (transformers 5.25's
    per-layer kernel wrappers) field by field, anything else by identity; but the state of torch's
    composable APIs and the state-dict hooks), its hooks (a module with hooks is its own
    structure), and its parameters' and buffers' types, shapes, dtypes,
    devices, strides, requires_grad, and which of them are the same tensor or share storage.
    ``depth``: the nesting of attribute values looked into."""
    seen: dict[int, int] = {}  # id(module) -> index: a submodule used twice is one node
    storages: dict[Any, int] = {}
    tensors: dict[int, int] = {}
    nodes: list[Hashable] = []

    def visit(m: torch.nn.Module) -> int:
        if id(m) in seen:
            return seen[id(m)]
        index = seen[id(m)] = len(nodes)
        nodes.append(None)
        state = m.__dict__
        hooked = any(state.get(name) for name in HOOK_TABLES)
        attrs = tuple(
            (name, _attribute_key(name, value, seen, depth))
            for name, value in state.items()
            if name not in _MODULE_TABLES and name not in HOOK_TABLES and name not in _STATE_DICT_HOOKS
        )
        tables = tuple(
            tuple((name, _tensor_key(t, tensors, storages)) for name, t in state.get(table, {}).items())
            for table in ("_parameters", "_buffers")
        )
        children = tuple((name, None if child is None else visit(child)) for name, child in state["_modules"].items())
        nodes[index] = (type(m), Identity(m) if hooked else None, attrs, tables, children)
        return index

    visit(module)
    return tuple(nodes)


def _attribute_key(name: str, value: Any, modules: dict[int, int], depth: int) -> Hashable:
    if name.startswith(_COMPOSABLE_STATE):
        return _types_of(value)
    if type(value) in _GUARDED:
        return type(value)
    return _value_key(value, depth, modules)


def _tensor_key(t: torch.Tensor | None, tensors: dict[int, int], storages: dict[Any, int]) -> Hashable:
    if t is None:
        return None
    same = tensors.setdefault(id(t), len(tensors))
    storage = None
    if type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type != "meta":
        storage = storages.setdefault((t.device, t.untyped_storage().data_ptr()), len(storages))
    return (type(t), tuple(t.shape), t.dtype, t.device, tuple(t.stride()), t.requires_grad, same, storage)


def _types_of(value: Any) -> Hashable:
    return (type(value), tuple(type(v) for v in value.values())) if isinstance(value, dict) else type(value)


def _value_key(value: Any, depth: int, modules: dict[int, int] | None = None) -> Hashable:
    """``modules``: the tree's modules seen so far (id -> index); a method of one of them (torchao
    sets ``extra_repr`` to a method of the module itself) is its function and that module's index."""
    if isinstance(value, PLAIN):
        # -0.0 == 0.0 and True == 1 as dict keys; the type and repr keep them apart
        return (type(value), value, repr(value) if isinstance(value, float) else None)
    if depth == 0:
        return Identity(value)
    if isinstance(value, types.MethodType) and modules is not None and id(value.__self__) in modules:
        return (types.MethodType, Identity(value.__func__), modules[id(value.__self__)])
    if isinstance(value, torch.Tensor):
        return (type(value), tuple(value.shape), value.dtype, value.device, tuple(value.stride()), value.requires_grad)
    if isinstance(value, torch.nn.Module) and not _holds_tensors(value):
        return (torch.nn.Module, structure_of(value, depth - 1))
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_value_key(v, depth - 1) for v in value))
    if isinstance(value, (set, frozenset)):
        return (type(value), frozenset(_value_key(v, depth - 1) for v in value))
    if isinstance(value, dict):
        return (type(value), tuple((_value_key(k, depth - 1), _value_key(v, depth - 1)) for k, v in value.items()))
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and value.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        fields = tuple(_value_key(getattr(value, f.name), depth - 1) for f in dataclasses.fields(value))
        return (type(value), fields)
    return Identity(value)


def _holds_tensors(module: torch.nn.Module) -> bool:
    """Parameters or buffers anywhere in ``module``'s tree (such a module, held outside the module
    tree, is compared by identity)."""
    return any(True for _ in module.parameters()) or any(True for _ in module.buffers())


def holds_module_state(values: Any) -> bool:
    """Whether a generated function's globals hold a module or a tensor (a value of one module
    baked into the code, which another module must not run): such a compilation is not shared."""
    for value in values:
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else (value,)
        if any(isinstance(v, (torch.nn.Module, torch.Tensor)) for v in items):
            return True
    return False


def jit_options_of(compile_data: Any) -> Hashable | None:
    """What a module's compilation depends on in its ``thunder.jit`` call: the executors (but the
    ad-hoc one each call creates), the cache and sharp-edges options, compile and debug options.
    ``None`` (never shared): a function, not a module; thunder transforms (they may have rewritten
    the module or its traces); DDP or thunder's FSDP; a cache option but the default."""
    from thunder.core.options import CACHE_OPTIONS
    from thunder.extend import TemporaryExecutor

    fn = compile_data.fn
    if (
        not compile_data.is_module
        or compile_data.transforms
        or compile_data.cache_option is not CACHE_OPTIONS.CONSTANT_VALUES
        or compile_data.process_group_for_ddp is not None
        or getattr(fn, "use_ddp", False)
        or getattr(fn, "use_fsdp", False)
        or compile_data.additional_param_names
        or compile_data.additional_return_names
    ):
        return None
    executors = tuple(Identity(ex) for ex in compile_data.executors_list if not isinstance(ex, TemporaryExecutor))
    debug = compile_data.debug_options
    return (
        executors,
        compile_data.sharp_edges,
        compile_data.only_execute_prims,
        compile_data.disable_preprocessing,
        compile_data.disable_torch_autograd_support,
        _value_key(compile_data.compile_options, _DEPTH),
        _value_key(debug_option_values(debug), _DEPTH),
    )


def shared_compilation_of(jitted: Any) -> SharedCompilation | None:
    """The shared compilation the last call of a jitted module ran: its own compilation (when it
    offered it) or another module's (when it adopted it); ``None`` when neither."""
    import thunder

    traces = thunder.last_traces(jitted)
    return next((c for c in record_of(jitted).shared if c.entry.computation_traces is traces), None)
