"""Every change thunderplug makes to thunder 0.2.6 beyond registering symbols and executors, as
one table: :data:`PATCHES`. ``install()`` applies it (idempotent), ``uninstall()`` restores
thunder exactly, ``installed()`` does both around a block. docs/patches.md is generated from the
table (``python -m thunderplug.wiring.patches``), and a test checks it is.

Each replacement is built from thunder's original and defers to it unless the compilation in
progress uses ``discover()``'s executors, except the thunder bug fixes marked "always".
"""

from __future__ import annotations

import contextlib
import copyreg
import enum
import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import KW_ONLY, dataclass
from typing import Any

import thunder
import thunder.torch as ltorch
import torch
from thunder import clang
from thunder.core import codeutils, interpreter, jit_ext, proxies, transform_common, update_aliases
from thunder.core import utils as thunder_utils
from thunder.core.codeutils import SigInfo
from thunder.core.interpreter import INTERPRETER_CALLBACKS
from thunder.core.module import ThunderModule
from thunder.core.prims import PrimIDs
from thunder.core.proxies import NumberProxy, TensorProxy, TorchAutogradFunctionCtxProxy
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.transforms import backward_impls
from thunder.executors import passes, torch_autograd, torchex
from thunder.executors.torch_autograd import ThunderFunction, ThunderOutputFunction
from thunder.recipes.base import BaseRecipe
from thunder.torch.experimental import dtensor_proxy
from thunder.torch.langctx import TorchCtx
from thunder.transforms import autocast as thunder_autocast
from thunder.transforms import autodiff
from torch._dynamo.mutation_guard import GenerationTracker

from thunderplug.caching import dynamic_sizes
from thunderplug.eager import (
    aliased_inputs,
    compile_branches,
    distributions,
    functorch_transforms,
    inplace_grads,
    output_grads,
    tensor_api,
    tensor_data,
    type_promotion,
)
from thunderplug.subclass import distributed, interception
from thunderplug.subclass.executor import active_core_executor, drop_kept_decompositions, uses_core_executor
from thunderplug.subclass.values import subclass_flatten
from thunderplug.thunder_compat import (
    cache_info,
    default_lookaside,
    default_lookaside_map,
    default_opcode_handler_map,
    general_jit_lookaside_map,
    grad_fn_map,
    interpret_call,
    printable_value_types,
    runs_called_function_itself,
    torch_property_map,
)
from thunderplug.tracing import aten
from thunderplug.wiring import fixes, graph_breaks, sharing, speedups, thunderfx


@dataclass(frozen=True)
class Patch:
    """``owner[key]`` (a dict) or ``owner.key`` (an object) replaced by ``make(original)``.

    ``features`` are the modules (under ``thunderplug.``) whose code the replacement is, so that a thunder
    upgrade knows whom to ask; ``saves`` is, for a patch that exists only for speed (or memory), what it
    saves as measured and where that was measured, so that the upgrade knows what dropping it costs.
    """

    name: str
    owner: Any
    key: Any
    make: Callable[[Any], Any]
    active: str  # "discover() compilations" or "always"
    why: str
    _: KW_ONLY
    features: tuple[str, ...]
    saves: str = ""

    def read(self) -> Any:
        if isinstance(self.owner, dict):
            if self.key in self.owner:
                return self.owner[self.key]
            return default_lookaside(self.key)
        return self.owner.__dict__[self.key] if isinstance(self.owner, type) else getattr(self.owner, self.key)

    def write(self, value: Any) -> None:
        if isinstance(self.owner, dict):
            self.owner[self.key] = value
        else:
            setattr(self.owner, self.key, value)

    def restore(self, original: Any, had_key: bool) -> None:
        if isinstance(self.owner, dict) and not had_key:
            del self.owner[self.key]
        else:
            self.write(original)


_FUNCTION_APPLY = torch.autograd.function.Function.apply.__func__
_LOOKASIDES = general_jit_lookaside_map()


def _compiling_with_core() -> bool:
    return active_core_executor() is not None


def _subclass_reads(bsym: Any) -> bool:
    """A read of a subclass value's inner tensors: where eager's ``requires_grad`` analysis stops (the inner
    tensors of a subclass do not require grad)."""
    return bsym.sym == subclass_flatten


#: functions thunder interprets (or, for torch builtins it has no symbol for, refuses), for which the table adds a
#: lookaside only discover() compilations see
_DISCOVER_ONLY_LOOKASIDES = (
    torch.nn.Module.__getattr__,
    torch.nn.Module._wrapped_call_impl,
    copyreg.__newobj__,
    GenerationTracker.tag.__func__,
    *tensor_api.UNSUPPORTED_DATA_DEPENDENT,
    *tensor_api.BACKWARD_HOOK_REGISTRATIONS,
    range,
)
_discover_only_ids: set[int] = set()  # ids of those lookasides while installed


def _hiding_discover_only_lookasides(original: Callable[..., Any]) -> Callable[..., Any]:
    """thunder's lookaside lookup, answering ``None`` (thunder's answer without the entry: the function is
    interpreted) for a lookaside of :data:`_DISCOVER_ONLY_LOOKASIDES` outside discover() compilations."""

    def replacement(fn: Any, *args: Any, **kwargs: Any) -> Any:
        found = original(fn, *args, **kwargs)
        if found is not None and id(found) in _discover_only_ids and not _compiling_with_core():
            return None
        return found

    return replacement


PATCHES: tuple[Patch, ...] = (
    Patch(
        "proxify", dtensor_proxy, "proxify_dtensor", interception.proxify, "discover() compilations",
        "thunder creates input proxies through `proxies.proxy()`, whose only hook is its call of "
        "`proxify_dtensor`: a traceable subclass input becomes a `SubclassTensorProxy` with prologue guards, "
        "a plain tensor a guard that it is not a subclass.",
        features=("subclass.interception",),
    ),
    Patch(
        "Symbol.__call__", Symbol, "__call__", interception.symbol_call, "discover() compilations",
        "a symbol called with a subclass proxy records the subclass op symbol instead (`TwoTensor.torch.mul`): "
        "one place for `torch.mul(x, 2)`, `x * 2`, `x.mul(2)`, `torch.ops.aten.mul.Tensor(x, 2)` and grad rules. "
        "A `Tensor.to` that changes nothing returns the tensor itself, as in eager (thunder records a "
        "`shallow_copy` whose gradients it sums apart: transformers' RMSNorm drifted by ulps); so do `squeeze` and "
        "`transpose` of a 0-dim tensor over dim 0 or -1 (thunder: `IndexError`). `torch.lerp` with a `start` smaller "
        "than the shape it broadcasts to (a 0-dim start) gets `start` expanded to that shape: thunder's meta gave the "
        "result `start`'s shape (wrong trace metadata; under grad `Failed to find a gradient transform ... "
        "prims.lerp`); eager's shape, values and gradients. A symbol that fails because its result's shape depends on "
        "values (thunder's automatic registration of `bincount`, `unique`, `nonzero(as_tuple=True)` on fake tensors; "
        "its refusal of tensor repeats and of `torch.where(condition)`) raises the `DataDependentShapeError` at which "
        "\"graph breaks at data-dependent ops\" breaks the graph.",
        features=("subclass.interception", "eager.tensor_to", "eager.tensor_api"),
    ),
    Patch(
        "subclass aliases", update_aliases, "_get_new_alias", interception.new_alias, "discover() compilations",
        "thunder's alias updates after an in-place op give each alias a fresh plain `TensorProxy`; an alias of a "
        "subclass value gets a subclass proxy, so that later ops on it stay subclass ops.",
        features=("subclass.interception",),
    ),
    Patch(
        "isinstance lookaside", _LOOKASIDES, isinstance, interception.isinstance_lookaside, "discover() compilations",
        "`isinstance` answers with the real subclass for subclass proxies.",
        features=("subclass.interception",),
    ),
    Patch(
        "type.__call__ lookaside", _LOOKASIDES, type.__call__, interception.type_call, "discover() compilations",
        "constructing a traceable subclass inside jitted code is traced on fakes (thunder would interpret "
        "`__new__` and fail on `Unknown attribute stride`).",
        features=("subclass.interception",),
    ),
    Patch(
        "Function.apply lookaside", _LOOKASIDES, _FUNCTION_APPLY,
        lambda original: interception.function_apply(
            fixes.function_apply_needs_input_grad(
                fixes.function_apply_outputs(
                    fixes.function_apply_outer_grad_mode(original, _compiling_with_core), _compiling_with_core
                ),
                _compiling_with_core,
                _subclass_reads,
            )
        ),
        "discover() compilations",
        "`apply` of an autograd.Function a plugin claimed whole (`FunctionClaim`) becomes one op traced on fakes. "
        "thunder bug: a Function whose forward computes its result under `no_grad` returns it tagged detached, so "
        "its backward is never called (no gradient for its inputs, silently): the output is detached only if grad "
        "was off at `apply`, as in eager and as thunder does for `autograd_function_apply`. thunder bug: its ctx has "
        "no `needs_input_grad` (`AttributeError` in a backward reading it): the ctx made during the `apply` gets "
        "eager's flags (patch \"autograd.Function ctx needs_input_grad\"). thunder limitation: its grad transform "
        "refuses a forward with several outputs ('has 2 proxies but expected 1') and its ctx has no "
        "`mark_non_differentiable`: such an op gets eager's engine's grad transform (a cotangent per output, zeros "
        "for the marked and the non-floating ones) and the marked outputs are detached.",
        features=("subclass.interception", "wiring.fixes"),
    ),
    Patch(
        "autograd.Function ctx needs_input_grad", TorchAutogradFunctionCtxProxy, "__init__", fixes.ctx_proxy_init,
        "discover() compilations",
        "a ctx proxy made while \"Function.apply lookaside\" traces an `apply` gets eager's `needs_input_grad` (one "
        "flag per `forward` argument: a tensor requiring grad under grad mode) and a `mark_non_differentiable` "
        "recording its tensors; outside those calls it is thunder's.",
        features=("wiring.fixes",),
    ),
    Patch(
        "tensor method calls", _LOOKASIDES, functools.partial.__call__,
        lambda original: speedups.method_calls_without_interpretation(
            original, lambda: active_core_executor() is not None
        ),
        "discover() compilations",
        "a tensor method call in jitted code (`x.t()`, `x.transpose(1, 2)`) calls a `functools.partial` of thunder's "
        "method function, which thunder interprets line by line (~60,000 Python calls for a symbol, ~330,000 for a "
        "DTensor dispatch wrapper) while it calls the same function opaquely for `torch.t(x)`: the partial's function "
        "(for the wrapper, the symbol it picks) is called through the interpreter directly.",
        features=("wiring.speedups",),
        saves="2-layer float8 GPT first step 33.3M -> 28.0M Python calls (commit 2e2b316)",
    ),
    Patch(
        "builtins lookups", interpreter, "globals_lookup",
        lambda original: speedups.builtins_without_interpretation(original, lambda: active_core_executor() is not None),
        "discover() compilations",
        "a builtin named in interpreted code (`hasattr`, `len`, ...; thunder's own helpers for `in`, `len()`, "
        "`bool()` and `nn.Module.__getattr__` use them) is looked up by interpreting `globals['__builtins__'][name]` "
        "as two lambdas and their two subscripts (~4,000 Python calls each time, ~40% of interpreting a float8 GPT): "
        "the lookaside those frames end in is called on the same wrapped dicts directly.",
        features=("wiring.speedups",),
        saves="2-layer float8 GPT first call 6.4 s -> 4.1 s, profiler events 56.4M -> 34.2M (commit ed44726)",
    ),
    *(
        Patch(
            f"{builtin.__name__}() of builtin values", default_lookaside_map(), builtin,
            functools.partial(speedups.container_sizes_without_interpretation, builtin, active=_compiling_with_core),
            "discover() compilations",
            f"`{builtin.__name__}(x)` of a builtin container (or None or a number) is two interpreted helper frames "
            "(`getattr(type(x), '__bool__', object())`, `hasattr`, `len`'s own) that end in the type's `__len__` "
            "(`__bool__`): `nn.Module.__call__` asks `bool()` of eight hook dicts per module call. That method is "
            "called through the interpreter directly (thunder's provenance-tracking one for dicts, lists, tuples).",
            features=("wiring.speedups",),
            saves="with `in` and subscripts below: 43% fewer Python calls interpreting a float8 GPT block "
            "(commit eda11bc)",
        )
        for builtin in (bool, len)
    ),
    Patch(
        "in of dicts and sets", default_opcode_handler_map(), "CONTAINS_OP",
        lambda original: speedups.membership_tests_without_interpretation(original, _compiling_with_core),
        "discover() compilations",
        "`k in d` is an interpreted helper frame (`hasattr`, `getattr(d, '__contains__')(k)`); for a dict or set "
        "that `__contains__` is called through the interpreter directly (thunder's provenance-tracking one for "
        "dicts, which tracks the dict's items as before).",
        features=("wiring.speedups",),
        saves="with bool()/len() and subscripts: 43% fewer Python calls interpreting a float8 GPT block "
        "(commit eda11bc)",
    ),
    Patch(
        "subscripts of dicts, lists, tuples", default_opcode_handler_map(), "BINARY_SUBSCR",
        lambda original: speedups.subscripts_without_interpretation(original, _compiling_with_core),
        "discover() compilations",
        "`c[i]` is an interpreted helper frame (`c.__getitem__(i)`); for a dict, list or tuple thunder's "
        "provenance-tracking `__getitem__` is called through the interpreter directly: the same wrapped item.",
        features=("wiring.speedups",),
        saves="with bool()/len() and `in`: 43% fewer Python calls interpreting a float8 GPT block (commit eda11bc)",
    ),
    Patch(
        "module calls without hook checks", _LOOKASIDES, torch.nn.Module._wrapped_call_impl,
        speedups.module_calls_without_hook_checks, "discover() compilations",
        "calling a submodule interprets torch's `Module.__call__` (the compiled-call and tracing checks, eight hook "
        "tables, then `forward_call(*args, **kwargs)`): for a module without hooks (its own or global), not "
        "`Module.compile`d and not under TorchScript tracing, that only calls `self.forward`, which is read and "
        "called through the interpreter directly; other modules' calls are interpreted as before.",
        features=("wiring.speedups",),
        saves="24% fewer Python calls interpreting a float8 GPT block (commit 322c784)",
    ),
    Patch(
        "one disassembly per code object", interpreter, "dis",
        lambda original: speedups.DisassemblyOnce(original, lambda: active_core_executor() is not None),
        "discover() compilations",
        "thunder's interpreter disassembles a function's code (`dis.get_instructions`) every time it runs a frame "
        "of it (~7% of a float8 GPT's first call): its `dis` keeps each live code object's instructions.",
        features=("wiring.speedups",),
        saves="2-layer float8 GPT first call: profiler events 34.2M -> 32.2M (commit 99e60f9)",
    ),
    Patch(
        "traceback frames without spinning", interpreter.InterpreterFrame, "get_or_make_python_frame",
        lambda original: speedups.python_frames_made_once(original, lambda: active_core_executor() is not None),
        "discover() compilations",
        "an exception leaving an interpreted frame (the `StopIteration` ending each interpreted `for` loop, through "
        "two or three of thunder's iterator helpers) gets a real Python frame for its traceback, which thunder makes "
        "in a new thread and waits for spinning with the GIL held: ~5 ms each (the switch interval), a fifth of the "
        "tiny Llama's `generate()` compilations. Each position's frame (file, function, first line, line) is made "
        "once, waiting on a lock, and given to every traceback at that position.",
        features=("wiring.speedups",),
        saves="tiny Llama generate(), 8 tokens, 3 compilations (benchmarks/dynamic_shapes.py's worker): 18.7 s -> "
        "9.9 s; 1,233 frames made, 6.6 s of 34 s under cProfile (this commit)",
    ),
    Patch(
        "autograd link tensors", torch_autograd, "torch", speedups.MetaRandnAsEmpty,
        "always (a meta tensor has no values to differ)",
        "thunder links the two autograd Functions of each compiled call by a one-element meta tensor made with "
        "`torch.randn` (in the forward and in the backward), which torch makes through its Python reference "
        "implementation (~0.1-0.5 ms each): a model whose repeated blocks are regions paid ~1 ms per block step, "
        "the gap to its one-trace step. Such meta tensors are made with `torch.empty` (same shape, dtype, device, "
        "`requires_grad`; no generator is drawn from on meta).",
        features=("wiring.speedups",),
        saves="~1 ms per region step of a model with repeated blocks, the regions step's gap to the one-trace step "
        "(commit 1cb59b8)",
    ),
    Patch(
        "ThunderModule.__init__", ThunderModule, "__init__", distributed.thunder_module_init,
        "discover() compilations; FSDP2 hooks: always",
        "thunder copies a module's parameters when jitting it, so a block jitted before `fully_shard` trains the "
        "full copies, not FSDP2's sharded parameters (silently): parameters nobody overrode are read through to "
        "the module. `thunder.jit(fully_shard(block))` fails tracing FSDP2's hooks: they are moved onto the "
        "ThunderModule and run eagerly, as under torch.compile. `thunder.jit(DDP(model))` and `thunder.jit(root)` "
        "with `fully_shard` blocks inside (stock: refused / fails tracing the hooks) run the root eagerly with each "
        "block compiled as a region (thunderplug.caching.regions); "
        "so does `thunder.jit(model)` of a model with repeated "
        "blocks (stock: every block traced and compiled again), whose blocks of one structure share one compilation.",
        features=("subclass.distributed", "caching.regions"),
    ),
    Patch(
        "TensorProxy.dtype lookaside", _LOOKASIDES, TensorProxy.dtype.fget, interception.dtype_property,
        "discover() compilations",
        "`x.dtype` in user code is a torch dtype, as in eager (thunder's dtypes compare unequal to torch's, so "
        "`x.dtype == torch.float32` is False under stock thunder).",
        features=("subclass.interception",),
    ),
    Patch(
        "TensorProxy.requires_grad lookaside", _LOOKASIDES, TensorProxy.requires_grad.fget,
        lambda original: tensor_api.requires_grad_property(original, _compiling_with_core, _subclass_reads),
        "discover() compilations",
        "`h.requires_grad` in the program of a tensor it computed was False (thunder sets the flag on inputs only), "
        "so `if h.requires_grad: h.register_hook(...)` skipped the hook and `h * 2 if h.requires_grad else h * 3` "
        "took the else branch, silently (stock thunder too). The program reads eager's flag: True where `h` is "
        "derived under grad mode from an input or parameter that requires grad through differentiable ops "
        "(`output_grads.requires_grad_while_tracing`); False after `detach`, under `torch.no_grad()`, for integer "
        "and boolean results and for `zeros_like`-like factories. thunder's transforms still read the proxy's flag.",
        features=("eager.tensor_api", "eager.output_grads"),
    ),
    Patch(
        "elementwise type promotion", thunder_utils, "elementwise_type_promotion",
        lambda original: type_promotion.eager_elementwise_type_promotion(original, _compiling_with_core),
        "discover() compilations",
        "thunder bug: the result dtype of an elementwise op mixing tensors with dimensions, 0-dim tensors and "
        "numbers was not eager's (`torch.result_type`) in the trace, silently: thunder tells 0-dim tensors by a "
        "weak dtype that `flatten` or `int_tensor * 2.5` leave on tensors with dimensions, so a float32 `(1,)` "
        "tensor times a 0-dim float64 one was float64 (under grad its values too: KI-8); bool tensor + 2 was "
        "int8, uint8 with 0-dim int8 int16. The dtype is eager's, from the arguments' shapes; thunder's type "
        "promotion kinds and its answer for numbers alone are kept.",
        features=("eager.type_promotion",),
    ),
    Patch(
        "is_compiling lookaside", _LOOKASIDES, torch.compiler.is_compiling,
        compile_branches.is_compiling_lookaside(_compiling_with_core), "discover() compilations",
        "`torch.compiler.is_compiling()` is False inside jitted code (eager's branch), except inside a function "
        "whose eager branch went on to read a tensor's value: True there (thunder answers True everywhere). "
        "torchao's compiling branches assume Inductor's code (`to_mx` drops its clamp before the float8 cast, "
        "which saturates only in Inductor), so only eager's branch gives eager's values; transformers' compiling "
        "branches compute the same values without reading tensors, which a trace cannot "
        "(`thunderplug.eager.compile_branches`).",
        features=("eager.compile_branches",),
    ),
    Patch(
        "TensorProxy.__bool__ lookaside", _LOOKASIDES, TensorProxy.__bool__,
        compile_branches.value_read_lookaside(TensorProxy.__bool__, _compiling_with_core), "discover() compilations",
        "a branch on a tensor's value notes which function asked `is_compiling()` before it (that function is "
        "interpreted again with True); otherwise the branch (`if mask.any():`, `bool(t)`) is a "
        "`DataDependentShapeError` naming the user's function and line, at which \"graph breaks at data-dependent "
        "ops\" breaks the graph, so Dynamo runs the branch eagerly on every call (thunder: an error).",
        features=("eager.compile_branches",),
    ),
    Patch(
        "functorch levels and modes left on failure", thunder, "thunder_general_jit",
        lambda original: functorch_transforms.levels_left_on_failure(original, _compiling_with_core),
        "discover() compilations",
        "a jitted function that fails inside a functorch transform (stock thunder interprets `torch.vmap`, enters "
        "a level, then fails on a proxy) or inside a `with` block of a TorchFunctionMode (thunder enters it for "
        "real) leaves the process inside it, and eager code run next fails: every level and mode a failed "
        "interpretation entered is left. Notes which modes were entered before the function (not its own).",
        features=("eager.functorch_transforms",),
    ),
    Patch(
        "graph breaks at changes to containers the function did not create", thunder, "thunder_general_jit",
        lambda original: fixes.breaking_at_outside_container_mutations(original, _compiling_with_core),
        "discover() compilations",
        "thunder bug: a jitted function that changes a container it did not create (`lst.append(x)` on an argument "
        "list, `box.items.append(x)`, `box.d[\"k\"] = y`, a global or module attribute list, `set.add`, a forward "
        "hook recording outputs) changes the real container while tracing, so it holds thunder's proxies after the "
        "first call, and later (cached) calls change nothing (silently wrong). When the container ends up holding a "
        "proxy it did not hold (an element, key or value that is or holds one), the containers are restored and "
        "the interpretation fails with a `DataDependentShapeError` naming the method, the container's type and the "
        "user's line, at which \"graph breaks at data-dependent ops\" breaks the graph: Dynamo replays the change "
        "on every call, as eager makes it (where the graph cannot break, under thunder transforms, it is the "
        "`NotImplementedError`). A container changed with other values only (`logging`'s and `re`'s memo dicts, a "
        "list a test appends to while tracing) is left as thunder leaves it, with a `ThunderplugWarning` naming the "
        "method and the line when the user's own code (not the standard library's or an installed package's) grew "
        "or shrank a list or deque (the change a later call skips where eager makes it again); so are containers "
        "the function creates and the attribute tables thunder records itself (`__dict__`, a module's `_buffers`).",
        features=("wiring.fixes",),
    ),
    Patch(
        "hooks of failed interpretations removed", thunder, "thunder_general_jit",
        lambda original: fixes.removing_hooks_of_failed_interpretations(original, _compiling_with_core),
        "discover() compilations",
        "module hooks that jitted code registered (see the hook registration lookasides) are removed when the "
        "interpretation that registered them fails, so a retried interpretation does not register them twice and "
        "a failed compilation leaves none.",
        features=("wiring.fixes",),
    ),
    Patch(
        "is_compiling retries", thunder, "thunder_general_jit",
        compile_branches.interpreted_with_retries(_compiling_with_core), "discover() compilations",
        "the interpretation of a jitted function is repeated when an `is_compiling()` answer of False led to a "
        "tensor's value being read, with the function that asked answered True (once per function and process; "
        "at most 8 per compilation).",
        features=("eager.compile_branches",),
    ),
    Patch(
        "torch.vmap lookaside", _LOOKASIDES, torch.vmap,
        functorch_transforms.vmap_lookaside(interpret_call, _compiling_with_core), "discover() compilations",
        "`torch.vmap(f, ...)` returns a `Vmapped`, whose call is one op that runs torch's vmap on the real tensors "
        "(thunder interprets functorch's code, enters a level, then fails on a proxy).",
        features=("eager.functorch_transforms",),
    ),
    Patch(
        "Vmapped call lookaside", _LOOKASIDES, functorch_transforms.Vmapped.__call__,
        functorch_transforms.call_lookaside(interpret_call, _compiling_with_core), "discover() compilations",
        "calling a `Vmapped` records `functorch_vmap`: its inputs are the call's tensors and those the function "
        "captures (closures, nested vmaps), its outputs' metadata comes from the same vmap on FakeTensors, and the "
        "TorchFunctionModes the function entered around the call are entered around it at run time; its gradient "
        "is `torch.func.vjp` of the same vmap at run time. Refused, with the user's line, for tensor subclass values.",
        features=("eager.functorch_transforms",),
    ),
    *(
        Patch(
            f"{name} lookaside", _LOOKASIDES, transform,
            functorch_transforms.refusal(name, interpret_call, _compiling_with_core), "discover() compilations",
            "functorch transforms other than `torch.vmap` are refused where they are called, with the user's line "
            "and what to do, before any functorch level is entered (thunder cannot trace them).",
            features=("eager.functorch_transforms",),
        )
        for name, transform in functorch_transforms.TRANSFORMS.items()
        if name != "torch.vmap"
    ),
    *(
        Patch(
            f"{name} lookaside", _LOOKASIDES, function,
            functorch_transforms.functional_call_break(name, interpret_call, _compiling_with_core),
            "discover() compilations",
            "`functional_call(module, params, args)` failed with `TypeError: unhashable type: 'TensorProxy'` (it "
            "keys the module's tensors by identity and swaps the parameters in place for the call, which a trace "
            "cannot record): it is a `DataDependentShapeError` naming the line, at which \"graph breaks at "
            "data-dependent ops\" breaks the graph, so Dynamo captures the call and thunder.jit compiles its graphs.",
            features=("eager.functorch_transforms",),
        )
        for name, function in functorch_transforms.FUNCTIONAL_CALLS.items()
    ),
    Patch(
        "ThunderCompiler.__call__", thunderfx.compiler_class(), "__call__", thunderfx.subclass_graphs_to_jit,
        "discover() compilations",
        "thunderfx: thunder's splitter cannot flatten tensor-subclass example values; a Dynamo graph with "
        "subclass inputs and thunderplug's executors is compiled whole by `thunder.jit` instead.",
        features=("wiring.thunderfx",),
    ),
    Patch(
        "aliased inputs: keyed by view", thunder, "_with_cache_info_ctx",
        lambda original: aliased_inputs.keyed_by_view(
            original, cache_info, uses_core_executor, speedups._closure_value),
        "discover() compilations",
        "thunder bug: thunder's key of a call records which arguments share a storage, not whether they are the "
        "same view, so a compilation that merged two arguments as one tensor served calls passing two views of one "
        "tensor: the key records which arguments sharing a storage are the same view (storage offset, shape, "
        "strides, dtype). Innermost of the wrappers of `_with_cache_info_ctx`.",
        features=("eager.aliased_inputs",),
    ),
    Patch(
        "symbolic sizes: cache lookup", thunder, "_with_cache_info_ctx",
        lambda original: dynamic_sizes.symbolic_calls(original, uses_core_executor),
        "discover() compilations",
        "thunder 0.2.6 traces static shapes: every new input size is a full compilation. A call whose cache "
        "lookup a template's re-specialization answered looks the cache up again (it now holds the concrete "
        "entry); a compilation that tracked dynamic dimensions keeps its entry as a template "
        "(docs/dynamic_shapes.md). Around \"aliased inputs: keyed by view\", inside the other wrappers of "
        "`_with_cache_info_ctx`.",
        features=("caching.dynamic_sizes",),
    ),
    Patch(
        "symbolic sizes: templates re-specialized", thunder, "thunder_general_jit", dynamic_sizes.general_jit,
        "discover() compilations",
        "on a cache miss, a template whose guards hold for the call's sizes gives a concrete entry (every "
        "symbolic size replaced by its value, callables generated again) without tracing the program again; "
        "otherwise the compilation tracks the input dimensions seen with two sizes or marked dynamic.",
        features=("caching.dynamic_sizes",),
    ),
    Patch(
        "symbolic sizes: input proxies", proxies, "tensorproxy", dynamic_sizes.tracked_tensorproxy,
        "discover() compilations",
        "a tracked input dimension's proxy size is a `SizeInt` (an int whose value is the size, carrying a "
        "symbolic expression): arithmetic keeps it symbolic, comparisons record guards, conversions specialize.",
        features=("caching.dynamic_sizes",),
    ),
    Patch(
        "SizeInt methods run opaquely", jit_ext, "general_jit_lookaside", dynamic_sizes.opaque_size_methods,
        "discover() compilations",
        "thunder's interpreter would interpret a SizeInt's methods (`+`, `<`, `int()`, ... and sympy below "
        "them, slowly, recording nothing useful): they run as opaque calls. The program's own `t.numel` of a "
        "proxy whose element count is a SizeInt is answered here too, with a method returning the symbolic count "
        "(thunder's `_Numel` specializes it: a DynamicCache's `keys.numel() == 0`).",
        features=("caching.dynamic_sizes",),
    ),
    Patch(
        "SizeInt printed as its value", printable_value_types(), dynamic_sizes.SizeInt,
        lambda original: int.__repr__, "discover() compilations",
        "generated code prints exact `int`s as literals and keeps other objects in the trace's context: a "
        "SizeInt in a trace is written as its value (the size of the call it was traced for), so a template's "
        "own callables are those of a static trace.",
        features=("caching.dynamic_sizes",),
    ),
    Patch(
        "SizeInt numel printed as its value", printable_value_types(), dynamic_sizes.NumelSize,
        lambda original: int.__repr__, "discover() compilations",
        "as \"SizeInt printed as its value\", for the element count `t.numel` of a tracked proxy.",
        features=("caching.dynamic_sizes",),
    ),
    Patch(
        "numel of a tracked proxy", TensorProxy, "__getattr__", dynamic_sizes.tracked_numel,
        "discover() compilations",
        "thunder answers `t.numel` with `_Numel(t._numel)`, an int made by `int.__new__`, which calls a SizeInt's "
        "`__int__` and so specializes every tracked size of the tensor (softmax's meta reads `a.numel == 0`): a "
        "proxy whose element count is a SizeInt answers a `NumelSize` (symbolic, callable as `t.numel()`). Every "
        "other attribute is thunder's `__getattr__` (whose interpreter lookaside stays keyed by it).",
        features=("caching.dynamic_sizes",),
    ),
    Patch(
        "symbolic slice gradient", grad_fn_map(), PrimIDs.SLICE, dynamic_sizes.symbolic_slice_grad,
        "discover() compilations",
        "thunder's grad rule of `slice_prim` computes the gradient's padding with NumPy (`np.subtract(a.shape, "
        "end_indices)`, then `int`), which specializes a tracked size (transformers' causal mask sliced to the "
        "key length): with a tracked shape or bound the same padding is computed with Python arithmetic.",
        features=("caching.dynamic_sizes",),
    ),
    Patch(
        "range lookaside", _LOOKASIDES, range,
        lambda original: interpreter.interpreter_needs_wrap(dynamic_sizes.specialized_range(range)),
        "discover() compilations",
        "`range()` reads an int subclass's value in C, without a method a SizeInt could record a guard in: its "
        "SizeInt arguments specialize (the trace is static in them), as `int()` does.",
        features=("caching.dynamic_sizes",),
    ),
    Patch(
        "symbolic arange length", clang, "arange", dynamic_sizes.symbolic_arange, "discover() compilations",
        "thunder's `arange` computes its length as `math.ceil((stop - start) / step)` after `math.isfinite` "
        "checks, which specialize a SizeInt bound (`torch.arange(x.shape[1])`, the causal mask of "
        "`scaled_dot_product_attention(is_causal=True)` through `tril`): with integer bounds one of them a "
        "SizeInt, the length is computed with integer floor division and stays symbolic; otherwise thunder's.",
        features=("caching.dynamic_sizes",),
    ),
    Patch(
        "full GCs deferred while compiling", thunder, "_with_cache_info_ctx",
        lambda original: speedups.deferred_full_collections_while_compiling(
            original, uses_core_executor, drop_kept_decompositions
        ),
        "discover() compilations",
        "a compilation keeps nearly everything it allocates until it ends, so the collector's full collections "
        "(each over the whole heap) run repeatedly for nothing (~1 s of a 2-layer GPT's first call): during "
        "thunder's `get_computation_and_inputs` of functions jitted with thunderplug's executors only young "
        "collections run; the threshold is restored afterwards. When it compiled, the traces kept in "
        "`thunder.last_traces` drop the decompositions (prims) of the ATen ops inside subclass ops, which nothing "
        "runs or prints (a 2-layer float8 GPT's kept traces: 4.9 MiB of 18).",
        features=("wiring.speedups",),
        saves="~1 s of full collections per first call, peak RSS unchanged (commit 1699050)",
    ),
    Patch(
        "interrupts leave tracing as themselves", jit_ext, "interpret", fixes.interpret_letting_interrupts_through,
        "always",
        "thunder bug: the interpreter wraps a `KeyboardInterrupt` or `SystemExit` raised while a function is traced "
        "(Ctrl-C during a compilation, `sys.exit()` in it) in an `InterpreterError`, which `except KeyboardInterrupt` "
        "does not catch: exceptions that are not `Exception`s are re-raised as themselves.",
        features=("wiring.fixes",),
    ),
    Patch(
        "default recipe without a missing nvFuser", BaseRecipe, "setup_executors", fixes.recipe_without_missing_nvfuser,
        "always",
        "thunder's default recipe lists nvFuser wherever CUDA is, installed or not, and `thunder.jit` fails on the "
        "`None` it gets (`An object of type NoneType is not a valid Executor`): with thunderplug's plugin in the "
        "recipe (`thunder.compile(model, plugins=\"thunderplug\")`), whose executors bring the fuser for this "
        "machine, the missing nvFuser is left out. Recipes without the plugin fail as in thunder.",
        features=("wiring.fixes", "recipe"),
    ),
    Patch(
        "autocast state per call", thunder, "_with_cache_info_ctx", fixes.autocast_state_per_call, "always",
        "thunder bug: each call under `torch.autocast` pushes the caller's autocast onto the jitted function's "
        "autocast stack and never pops it, so every later compilation of the function applies autocast (a plain "
        "call after an autocast one returns bfloat16) and the stack grows per call: it is restored after each call.",
        features=("wiring.fixes",),
    ),
    Patch(
        "autocast rules flag per thread", thunder_autocast, "is_autocast_enabled",
        lambda original: fixes.autocast_rules_enabled, "always",
        "thunder bug: whether autocast rules apply is a process-wide flag that each rule turns off and back on; "
        "compilations in two threads interleave and can leave it off for good (every later compilation under "
        "`torch.autocast` ignores it, stock `thunder.jit` too): the flag is per thread.",
        features=("wiring.fixes",),
    ),
    Patch(
        "autocast rules disabled per thread", thunder_autocast, "disable_autocast",
        lambda original: fixes.autocast_rules_disabled, "always",
        "turns the per-thread flag of \"autocast rules flag per thread\" off around a rule (thunder's own autocast "
        "rules and thunderplug's unrolled subclass graphs, whose casts are already in them).",
        features=("wiring.fixes",),
    ),
    Patch(
        "graph breaks at data-dependent ops", thunder, "_with_cache_info_ctx",
        lambda original: graph_breaks.broken_at_data_dependent_ops(original, uses_core_executor),
        "discover() compilations without thunder transforms",
        "an op whose output shape depends on values (`x[mask]`, `nonzero`, `masked_select`, `unique`) cannot be in "
        "a thunder 0.2.6 trace (static shapes); torch.compile breaks the graph there. When tracing meets one, the "
        "compilation runs its function through Dynamo from then on, each captured graph compiled whole by "
        "`thunder.jit` with the compilation's options, the op eager between them; a ThunderplugWarning names the op "
        "and line.",
        features=("wiring.graph_breaks",),
    ),
    Patch(
        "one compilation per module structure", thunder, "_with_cache_info_ctx",
        lambda original: sharing.shared_compilations(original, uses_core_executor),
        "discover() compilations of modules without thunder transforms",
        "thunder compiles each jitted module on its own, so `thunder.jit(block)` on each of a model's identical "
        "blocks compiles the same program once per block (~1.6 s each for a float8 GPT block). thunder's prologue "
        "reads the module from its globals and its parameters through it, and the computation only sees what the "
        "prologue returns: a module's new compilation is offered to the modules of the same structure (classes, "
        "attribute values, parameter metadata and aliasing, jit options: "
        "`thunderplug.caching.reuse.structure_of`), which "
        "append it to their own cache with the prologue rebound to themselves; its guards decide as for their own "
        "entries, and a miss compiles as before.",
        features=("wiring.sharing", "caching.reuse"),
        saves="4-layer float8 GPT, per block: blocks 2-4 first call 0.15 s each instead of ~1.4 s (commit b7c655a)",
    ),
    Patch(
        "Module.__getattr__ lookaside", _LOOKASIDES, torch.nn.Module.__getattr__,
        sharing.module_getattr_lookaside(interpret_call), "discover() compilations",
        "torch's `nn.Module.__getattr__` (a submodule, parameter or buffer read as an attribute) asks "
        "`\"_parameters\" in self.__dict__`, for which thunder's interpreter tracks every item of the module's "
        "`__dict__`: the prologue then checks every number and string attribute of the module, read or not (a "
        "`Linear`'s `in_features`, transformers' `layer_idx`), and blocks that differ only there cannot share a "
        "compilation. The tables are read by subscript, which tracks only what it reads; the rest is torch's code.",
        features=("wiring.sharing", "caching.reuse"),
        saves="the compilation of each block that differs only in number or string attributes it never reads "
        "(transformers' `layer_idx`, litgpt's `block_idx`), as \"one compilation per module structure\" (commit "
        "05ed97f; not measured apart from it)",
    ),
    Patch(
        "one signature per meta", Symbol, "normalize",
        lambda original: speedups.normalize_with_signature_once(original, lambda: active_core_executor() is not None),
        "discover() compilations",
        "`Symbol.normalize` (every bound symbol made) recomputes `inspect.signature` of the symbol's meta at each "
        "call: it is computed once per meta function while that lives; binding is `inspect`'s, as in thunder.",
        features=("wiring.speedups",),
        saves="0.04 s of a float8 GPT's first call (docs/benchmarks.md, issue 26's targets; commit 4992de7)",
    ),
    Patch(
        "random draws kept by dce", transform_common, "has_tags",
        lambda original: fixes.draws_kept(original, _compiling_with_core), "discover() compilations",
        "thunder bug: `dce` dropped a random op whose result is unused (`torch.rand(3)`, a dropout whose output is "
        "discarded, under grad or not), so every later draw (the next dropout's mask) took other numbers than "
        "eager's; a bound symbol that draws (tagged `RANDOM_OP` at any depth, or thunder's `randn`/`uniform_philox`) "
        "counts as `DONT_DCE` in `dce` and its subsymbol pruning.",
        features=("wiring.fixes",),
    ),
    Patch(
        "random draws stay in the forward", autodiff, "split_into_forward_and_backward",
        lambda original: fixes.draws_in_forward(original, _compiling_with_core), "discover() compilations",
        "thunder bug: the forward keeps only what its outputs need, so a draw whose result only the backward reads "
        "(the saved generator state of a discarded dropout) or nothing reads ran in the backward, after the "
        "forward's later draws: eager's stream shifted. The forward's draws stay in the forward.",
        features=("wiring.fixes",),
    ),
    Patch(
        "dce subsymbol pruning", transform_common, "_remove_noop_subsymbols",
        lambda original: speedups.remove_noop_subsymbols(
            original, lambda: active_core_executor() is not None, aten.is_registered_symbol
        ),
        "discover() compilations",
        "thunder's `dce` prunes no-op subsymbols asking, per subsymbol, whether the parent's whole subtree is "
        "tagged `DONT_DCE`: quadratic on the deep subsymbol trees of unrolled subclass ops; asked once per parent. "
        "An ATen op without subsymbols is kept: replays copy ATen ops that an operator executor runs as "
        "themselves without their decompositions (thunder would take them for no-ops).",
        features=("wiring.speedups",),
        saves="not measured alone (commit 3fa573b: one question per parent instead of one per subsymbol, quadratic on "
        "unrolled subclass ops)",
    ),
    Patch(
        "proxy swaps share unchanged subtrees", BoundSymbol, "from_bsym_swap_proxies",
        lambda original: speedups.swap_proxies_sharing_subtrees(original, lambda: active_core_executor() is not None),
        "discover() compilations",
        "every bound symbol a trace-substitution pass (autodiff, each claiming pass) keeps is copied with its whole "
        "subsymbol tree once anything is swapped; the unrolled subclass ops' deep trees made these copies most of a "
        "compilation's transient memory: only the subsymbols in which a proxy is swapped are copied, the rest "
        "shared (as thunder shares all of them when nothing is swapped).",
        features=("wiring.speedups",),
        saves="memory: a claiming pass over the 2-layer float8 GPT's joint trace keeps 0.8 MiB instead of 3.8, no "
        "slower (commit 47188c1)",
    ),
    Patch(
        "claims bound directly", passes, "_transform_for_operator_executor_execution",
        lambda original: speedups.direct_operator_claims(original, lambda: active_core_executor() is not None),
        "discover() compilations without thunder transforms",
        "thunder's claiming pass (five per compilation) hands a bound symbol to an operator executor by calling "
        "the operator again: its meta re-runs and its outputs become new proxies (~10% of a 2-layer float8 GPT's "
        "first call, mostly unrolled ATen ops and torch ops), and every later bound symbol is then copied to swap "
        "in those proxies. Before thunder's pass, they are bound to the operator with their own outputs (an "
        "execution transform's outputs are renamed to them); thunder's pass does the rest.",
        features=("wiring.speedups",),
        saves="claims of a 2-layer float8 GPT: 0.84 s -> 0.23 s (commit 7db14d4)",
    ),
    Patch(
        "grad_transform_on_trace", autodiff, "grad_transform_on_trace",
        lambda original: inplace_grads.keeping_gradient_identity(
            output_grads.marking_outputs(
                original, lambda: active_core_executor() is not None, cuts=_subclass_reads
            ),
            lambda: active_core_executor() is not None,
        ),
        "discover() compilations",
        "thunder marks every output of a function with autograd differentiable; eager does not (`y.cos()` of an "
        "input without grad, a value computed under `no_grad`, an inner tensor read from a subclass). Which outputs "
        "an input requiring grad reaches is read from the trace before autodiff, whose `no_grad` tags are right "
        "(autodiff re-traces ops under the grad mode the function ends in), and those outputs are flagged in the "
        "joint trace (`mark_non_differentiable`). While autodiff runs, executors ask the same analysis which values "
        "require grad (`output_grads.requires_grad`): thunder sets a proxy's `requires_grad` on inputs only, and "
        "eager_kernels' SDPA claim, reading it, gave a mask computed from parameters (T5's and Swin's relative "
        "position biases) no gradient, silently.",
        features=("eager.output_grads", "eager.inplace_grads"),
    ),
    Patch(
        "ThunderOutputFunction.forward", ThunderOutputFunction, "forward", output_grads.autograd_forward,
        "always (acts only on outputs a discover() trace flagged)",
        "outputs that no input requiring grad reaches do not require grad, as in eager (thunder marks every "
        "output differentiable): the forward trace flags them (`mark_non_differentiable`), the Function passes "
        "them to `ctx.mark_non_differentiable`. An input updated in place and returned (`x.mul_(w); return x`) is "
        "flagged `mark_dirty` and passed to `ctx.mark_dirty`, so the caller's tensor gets the update's history as "
        "in eager (thunder dropped the view torch made for it: `requires_grad=False`).",
        features=("eager.output_grads",),
    ),
    Patch(
        "ThunderFunction.forward", ThunderFunction, "forward", output_grads.autograd_forward,
        "always (acts only on outputs a discover() trace flagged)",
        "the same for thunder's unsplit autograd Function (thunderfx's `thunderfx_disable_split_autograd`).",
        features=("eager.output_grads",),
    ),
    Patch(
        "SigInfo.from_name_and_args", SigInfo, "from_name_and_args", fixes.siginfo_from_name_and_args, "always",
        "thunder bug: an autograd.Function argument thunder cannot proxy (a config object) crashes tracing; "
        "it is named as a constant instead.",
        features=("wiring.fixes",),
    ),
    Patch(
        "autograd_function_apply lookaside", _LOOKASIDES, torch.ops.higher_order.autograd_function_apply,
        fixes.autograd_function_apply, "always",
        "thunder bug: `non_differentiable_idx` is ignored; the outputs it lists are detached, as in eager.",
        features=("wiring.fixes",),
    ),
    Patch(
        "checkpoint lookaside", _LOOKASIDES, torch.utils.checkpoint.checkpoint,
        lambda original: fixes.checkpoint_reentrant(original, _compiling_with_core, _subclass_reads),
        "discover() compilations",
        "thunder bug: `checkpoint(fn, x, use_reentrant=True)` (eager's default when it is not passed) fails "
        "(`exceptions must derive from BaseException`) and an omitted `use_reentrant` was traced as `False`. Both "
        "are traced as thunder's checkpoint (recomputation changes no value or gradient); reentrant with no tensor "
        "argument requiring grad detaches the outputs, as eager's `CheckpointFunction` leaves them.",
        features=("wiring.fixes",),
    ),
    Patch(
        "general_jit_lookaside", jit_ext, "general_jit_lookaside",
        lambda original: fixes.general_jit_lookaside(original, runs_called_function_itself, _compiling_with_core),
        "discover() compilations",
        "thunder bug: thunder's jit iterates every sequence argument of every call to look for tensors, outside "
        "the interpreter; a user-defined `Sequence` runs its `__iter__` then, even as `self` of its `__init__` "
        "(transformers' `_PerLayerConfigView` fails every HF model): only functions thunder runs itself are "
        "shown such arguments.",
        features=("wiring.fixes",),
    ),
    Patch(
        "container changes noted", jit_ext, "general_jit_lookaside",
        lambda original: fixes.noting_container_mutations(original, _compiling_with_core),
        "discover() compilations",
        "before each call of a method that changes a list, deque, dict or set (`append`, `__setitem__`, `add`, ...) "
        "on a container the function did not create, its contents are noted (for the graph breaks at changes "
        "to containers the function did not create); thunder's lookaside is returned unchanged.",
        features=("wiring.fixes",),
    ),
    Patch(
        "lookasides of discover() only", jit_ext, "general_jit_lookaside",
        _hiding_discover_only_lookasides, "compilations without discover()",
        "the lookasides this table adds for Python functions thunder interprets (`nn.Module.__getattr__`, "
        "`nn.Module.__call__`) are not seen by other compilations, which interpret those functions exactly as "
        "before (interpreting a copy instead would give the module's globals another provenance, and stock "
        "thunder's prologue other guards).",
        features=("wiring.patches",),
    ),
    *(
        Patch(
            f"{operator.__qualname__} lookaside", _LOOKASIDES, operator,
            tensor_api.remainder_operator(operator, _compiling_with_core), "discover() compilations",
            "thunder bug: `x % y`, `2 % x` and `x %= y` of tensors failed (`TensorProxy.__mod__` looks up a method "
            "`mod` thunder's torch language has not: `TypeError: 'NoneType' object is not callable`; `Proxy.__imod__` "
            "refuses in-place operators): they are eager's `torch.remainder(x, y)`, `torch.remainder(2, x)` and "
            "`x.remainder_(y)` (the sign of the divisor; `eager_backward_kernels` differentiates them as eager).",
            features=("eager.tensor_api",),
        )
        for operator in tensor_api.REMAINDER_OPERATORS
    ),
    Patch(
        "torch.return_types results", jit_ext, "general_jit_lookaside",
        lambda original: tensor_api.structseq_results(original, _compiling_with_core), "discover() compilations",
        "`x.max(1)`, `torch.sort(x)`, `x.topk(2)`, `torch.median(x, 0)` and every other call whose eager result is "
        "a `torch.return_types` structseq return that structseq (thunder: the tuple of its fields, so "
        "`x.max(1).values` failed with `AttributeError: values`); a jitted function returning it returns eager's type.",
        features=("eager.tensor_api",),
    ),
    Patch(
        "structseqs printed as code", codeutils, "prettyprint",
        lambda original: tensor_api.structseq_printing(original, _compiling_with_core), "discover() compilations",
        "thunder printed a `torch.return_types` structseq in a trace (the epilogue returning `x.max(1)`) as its repr, "
        "`max(values=t0, indices=t1)`, which fails when run: it prints as `torch.return_types.max((t0, t1))`.",
        features=("eager.tensor_api",),
    ),
    Patch(
        "TensorProxy.__getattr__ lookaside", _LOOKASIDES, TensorProxy.__getattr__,
        lambda original: tensor_api.autograd_hook_break(original, _compiling_with_core), "discover() compilations",
        "`t.register_hook(fn)` (`register_post_accumulate_grad_hook`, `retain_grad`) inside a jitted function failed "
        "with `AttributeError: Unknown attribute register_hook`: a trace has no autograd graph to hook. It is a "
        "`DataDependentShapeError` naming the line, at which \"graph breaks at data-dependent ops\" breaks the graph, "
        "so the hook is registered on the real tensor and eager's backward calls it. So is `t.tolist()` (`Exception "
        "encountered when doing automatic registration for tolist`): Dynamo runs it on the real tensor. "
        "`t.H`/`t.mH` of a real tensor "
        "(`Unknown attribute H`: `parametrizations.spectral_norm`'s power method, `orthogonal`'s `X - X.mH`) are "
        "eager's transpose of the last two dimensions (eager's error for too few dimensions).",
        features=("eager.tensor_api",),
    ),
    Patch(
        "tensor methods from executors' lookasides", TorchCtx, "get_method",
        lambda original: tensor_api.executor_methods(original, _compiling_with_core), "discover() compilations",
        "a `torch.Tensor` method thunder's torch language has no entry for (`t.bernoulli_(p)`, `t.normal_()`: "
        "`AttributeError: Unknown attribute bernoulli_`) is that method, called through the lookaside an executor "
        "of the compilation has for it (the aten_ops plugin's random ops draw eager's numbers); without one, "
        "thunder's `AttributeError` as before.",
        features=("eager.tensor_api",),
    ),
    *(
        Patch(
            f"{method.__name__} lookaside", _LOOKASIDES, method, tensor_api.backward_hook_registration_break(method),
            "discover() compilations",
            f"`module.{method.__name__}(hook)` inside a jitted function: the hook was never called (thunder does not "
            "run eager's backward of the module) or the registration failed the prologue's guard on the hooks it "
            "changed. It is a `DataDependentShapeError` naming the line, at which \"graph breaks at data-dependent "
            "ops\" breaks the graph, so Dynamo runs the registration and the hooked module eagerly.",
            features=("eager.tensor_api",),
        )
        for method in tensor_api.BACKWARD_HOOK_REGISTRATIONS
    ),
    Patch(
        "is_tensor_like lookaside", _LOOKASIDES, torch.overrides.is_tensor_like,
        tensor_api.tensor_like(torch.overrides.is_tensor_like, _compiling_with_core), "discover() compilations",
        "`torch.overrides.is_tensor_like` said False for a tensor proxy (no `torch.Tensor`, no `__torch_function__`), "
        "so torch.distributions' `broadcast_all` refused every distribution built from tensors in a jitted "
        "function (`Normal(loc, scale)`: `ValueError: Input arguments must all be instances of Number, "
        "torch.Tensor ...`): a tensor proxy is tensor-like, as the tensor it stands for.",
        features=("eager.tensor_api",),
    ),
    Patch(
        "torch._is_all_true lookaside", _LOOKASIDES, torch._is_all_true,
        distributions.is_all_true(_compiling_with_core), "discover() compilations",
        "`torch._is_all_true` had no symbol (`NotImplementedError`), and torch.distributions' argument and sample "
        "validation (`if not torch._is_all_true(valid): raise ValueError(...)`) branches on a tensor's value: there "
        "the answer is True with a `check_distribution` operator recorded (never dead-code eliminated) that raises "
        "eager's ValueError at every call whose values are invalid, naming the user's line; elsewhere it is "
        "`torch.all`, whose branch breaks the graph.",
        features=("eager.distributions",),
    ),
    Patch(
        "NumberProxy.__bool__ lookaside", _LOOKASIDES, NumberProxy.__bool__,
        tensor_api.unknown_number_branch(NumberProxy.__bool__, _compiling_with_core), "discover() compilations",
        "`if x.sum().item() > 0:` took the else branch on every call, silently (thunder converts a number it has no "
        "value for to False and records no check; stock thunder still): the branch is a `DataDependentShapeError` "
        "naming the line, at which \"graph breaks at data-dependent ops\" breaks the graph, so Dynamo runs it eagerly.",
        features=("eager.tensor_api",),
    ),
    Patch(
        "boolean mask indexing as a data-dependent op", clang, "_advanced_indexing",
        lambda original: tensor_api.boolean_mask_refusal(original, _compiling_with_core), "discover() compilations",
        "`x[mask]` with a boolean mask tensor cannot be in a trace (its shape depends on the mask's values): thunder's "
        "bare `boolean advanced indexing is not implemented` becomes the `DataDependentShapeError` that names the "
        "op and the program's line, at which \"graph breaks at data-dependent ops\" breaks the graph.",
        features=("eager.tensor_api",),
    ),
    *(
        Patch(
            f"torch.{fn.__name__} lookaside", _LOOKASIDES, fn,
            lambda original, fn=fn: tensor_api.data_dependent_call(fn), "discover() compilations",
            f"thunder has no symbol for `torch.{fn.__name__}` (what `torch.unique` calls; `Trying to call function "
            "..., but it is not yet supported`): its result's shape depends on values, so it raises the "
            "`DataDependentShapeError` at which \"graph breaks at data-dependent ops\" breaks the graph.",
            features=("eager.tensor_api",),
        )
        for fn in tensor_api.UNSUPPORTED_DATA_DEPENDENT
    ),
    Patch(
        "starred arguments as tuples", default_opcode_handler_map(), "CALL_FUNCTION_EX",
        lambda original: fixes.starred_arguments_as_tuples(original, _compiling_with_core),
        "discover() compilations",
        "thunder bug: `f(*value)` of an iterable that is not a sequence (`x.permute(*reversed(range(x.ndim)))`, an "
        "iterator, a generator) failed (`object of type 'range_iterator' has no len()`), and of a dict passed its "
        "values: a tuple is made of it first, as Python does.",
        features=("wiring.fixes",),
    ),
    Patch(
        "torch.cat lookaside", _LOOKASIDES, torch.cat,
        lambda original: fixes.cat_lookaside(original, _compiling_with_core), "discover() compilations",
        "thunder bug: eager `torch.cat` skips 1-D empty tensors (`torch.tensor([])`, which transformers' "
        "dynamic KV cache starts from) that lack the concatenated dimension; thunder fails on them.",
        features=("wiring.fixes",),
    ),
    Patch(
        "mark_static_address lookaside", _LOOKASIDES, torch._dynamo.mark_static_address,
        lambda original: fixes.mark_static_address_lookaside(original, _compiling_with_core),
        "discover() compilations",
        "`torch._dynamo.mark_static_address` (a tag only Dynamo reads; transformers' `StaticCache` calls it when "
        "the first forward allocates the cache) does nothing: thunder failed replaying the tag onto a tensor input.",
        features=("wiring.fixes",),
    ),
    Patch(
        "process_recorded_modifications", jit_ext, "process_recorded_modifications",
        lambda original: fixes.process_recorded_modifications(original, _compiling_with_core),
        "discover() compilations",
        "thunder bug: writes to the buffers of a module the function constructs itself (transformers' "
        "`BertForMaskedLM` builds `CrossEntropyLoss()` in its forward) are replayed after the computation and "
        "fail; objects made inside the function are left out. thunder bug: attributes written on the module "
        "`thunder.jit` was given (`self.flag = True` in its forward; transformers' "
        "`_output_capturing_hooks_installed`) were dropped, silently: they are replayed onto it. thunder bug: a "
        "dtype or string written to an attribute of an object the function did not create (transformers 4.57's "
        "`StaticCache` allocated in the first compiled call) failed with `AssertionError`: such writes are replayed "
        "as torch values; a value thunder cannot replay (a function: transformers 4.57's wrapped `forward`) is "
        "refused with `NotImplementedError` naming the attribute (`self.model.layers[0].forward`).",
        features=("wiring.fixes",),
    ),
    Patch(
        "objects made inside and returned", jit_ext, "build_value_from_wrapped",
        lambda original: fixes.build_objects_made_inside(original, _compiling_with_core), "discover() compilations",
        "thunder bug: a result holding an object of a plain class that the function made (transformers' "
        "`DynamicCache`, which causal LMs return under the config's default `use_cache=True`, in training too) "
        "failed with `NotImplementedError: unhandled value of type`: it is rebuilt after the call, a new instance "
        "of its class whose attributes are the values the function left (the cache's key and value tensors). A "
        "returned value thunder kept no current wrapper for (Falcon's cache in its `return_dict=False` tuple, an "
        "attribute written through `obj.__dict__`) came back as in tracing, holding proxies or an earlier value "
        "(silently): it is rebuilt from its values where tracing left proxies, dtypes or devices in it. A returned "
        "dict's number or string key that came from an input (a layer's index: T5's cache's `is_updated`) was "
        "rebuilt as a proxy of the input (`unhashable type: 'AnyProxy'`): it is its value. A returned NamedTuple "
        "(alone or nested) failed (`NT.__new__() missing 1 required positional argument`: thunder calls "
        "`type(value)(items)`): it is made with `_make` in the trace.",
        features=("wiring.fixes",),
    ),
    *(
        Patch(
            f"dict literals keep their items ({opname})", default_opcode_handler_map(), opname,
            lambda original: fixes.dict_literals_keep_their_items(original, _compiling_with_core),
            "discover() compilations",
            "thunder bug: a dict literal (`{'cache': cache}`) forgot its items' wrappers, so an object the function "
            "made and returned in it (a cache) reached the caller holding proxies where eager has tensors "
            "(silently); the dict keeps them, as thunder's `dict(...)` and list and tuple literals do, and the "
            "object is rebuilt as in 'objects made inside and returned'.",
            features=("wiring.fixes",),
        )
        for opname in ("BUILD_MAP", "BUILD_CONST_KEY_MAP")
    ),
    Patch(
        "copyreg.__newobj__ lookaside", _LOOKASIDES, copyreg.__newobj__, fixes.newobj_made_inside,
        "discover() compilations",
        "thunder bug: `copy.copy` and `copy.deepcopy` of an object failed (`'MappingKeysView' object has no attribute "
        "'_mapping'`): the copy is made by `cls.__new__(cls)`, which thunder does not know as an object the function "
        "made, so filling its `__dict__` failed. T5 and Whisper deep-copy their config to build their default cache "
        "(`use_cache=True`). For a class whose `__new__` is `object.__new__`, that is called, as thunder expects.",
        features=("wiring.fixes",),
    ),
    Patch(
        "Dynamo's module generation tag lookaside", _LOOKASIDES, GenerationTracker.tag.__func__,
        fixes.dynamo_generation_tag, "discover() compilations",
        "once Dynamo has run in the process (a graph break, `torch.compile`), its `nn.Module.__init__` wrapper tags "
        "every new module in a process-wide weak dictionary; thunder interpreted that, wrapping each item of the "
        "dictionary while weakref callbacks removed items (`dictionary changed size during iteration`, now and then, "
        "for a module built inside the function): Dynamo's bookkeeping runs as itself.",
        features=("wiring.fixes",),
    ),
    Patch(
        "slice bounds clamped", clang, "_basic_indexing",
        lambda original: fixes.slices_clamped(original, _compiling_with_core), "discover() compilations",
        "thunder bug: a slice bound below minus the dimension's length (`t[-4095:]` of 16 rows: transformers' "
        "sliding-window cache under Mistral's default window of 4096) is refused (`start=-4095 is not a valid "
        "index`); torch clamps it to 0, and so does this.",
        features=("wiring.fixes",),
    ),
    Patch(
        "config attribute_map getattr", _LOOKASIDES, getattr,
        lambda original: fixes.config_attribute_map_getattr(original, _compiling_with_core),
        "discover() compilations",
        "thunder bug: the interpreter never calls a class's own `__getattribute__`, so a transformers config's "
        "mapped name (`GPT2Config().num_hidden_layers`, which is `n_layer`) failed with `AttributeError` (GPT-2 "
        "with its default `use_cache=True`); a name in the `attribute_map` of such a class is read as the name "
        "it maps to.",
        features=("wiring.fixes",),
    ),
    Patch(
        "symbol arguments as called", Symbol, "__call__",
        lambda original: fixes.symbol_arguments_as_called(original, _compiling_with_core), "discover() compilations",
        "thunder bug: a bound symbol kept the program's own list and dict arguments, so a program that changed the "
        "list after the call changed the recorded op (`shape = [2, 8]; y = x.view(shape); shape[0], shape[1] = 8, "
        "2` ran `view(x, [8, 2])` under the metadata of `[2, 8]`: silently other values, stock thunder too; "
        "torchao's QAT fake quantizer failed on it). They are copied at the call. `torch.split` by a size returns "
        "a tuple to the program as in eager (thunder's list let `parts + (y,)` fail and the program change what "
        "the trace records).",
        features=("wiring.fixes",),
    ),
    Patch(
        "graph breaks at reads the prologue cannot write", jit_ext, "unpack_inputs",
        lambda original: fixes.unreadable_inputs_break(original, _compiling_with_core), "discover() compilations",
        "thunder limit: the prologue cannot read a value the program took through a dict entry keyed by a "
        "`torch.dtype` (torchao's QAT fake quantizers read `_DTYPE_TO_BIT_WIDTH[torch.int4]`) or another "
        "constant that is no int or str (`NotImplementedError: Exception occured unpacking object from "
        "ProvenanceRecord(...)`). It is a `DataDependentShapeError`, at which \"graph breaks at data-dependent "
        "ops\" runs the function through Dynamo, whose guards check the read, thunder compiling its graphs.",
        features=("wiring.fixes",),
    ),
    Patch(
        "unpack_inputs", jit_ext, "unpack_inputs",
        lambda original: fixes.hooks_read_from_the_module(original, _compiling_with_core),
        "discover() compilations",
        "thunder bug: the prologue read the jitted module's hook tables through its ThunderModule, whose own are "
        "empty: a hook whose code the prologue guards (it reads a global or a closure cell: transformers 5's "
        "output-capturing hooks, a hook appending to a list) failed every call with `KeyError`. They are read from "
        "the module, whose hooks the program ran.",
        features=("wiring.fixes",),
    ),
    Patch(
        "constraints keep their reads", jit_ext, "unpack_inputs",
        lambda original: fixes.constraints_keep_their_reads(original, _compiling_with_core), "discover() compilations",
        "thunder bug: the prologue's constraints get their proxies swapped for inputs of the same name, but names are "
        "unique per trace only: the epilogue's proxy of a returned object (`any0`) replaced a `None` read's guard "
        "named alike in the computation (`any0`), which then checked the object itself (transformers 4.57's "
        "`StaticCache`: a failed check at every call). A constraint's proxy named like an input of another read is "
        "renamed first.",
        features=("wiring.fixes",),
    ),
    Patch(
        "None reads guarded", jit_ext.general_jit_callbacks, INTERPRETER_CALLBACKS.WRAP_CALLBACK,
        lambda original: fixes.none_reads_guarded(original, _compiling_with_core), "discover() compilations",
        "thunder bug: the prologue checks the numbers and strings the program read from its arguments, the "
        "module's attributes, globals and attributes of arguments, but not a `None`: a program traced for "
        "`f(x, mask=None)` ran for `f(x, mask=m)` without the mask, silently (a TransformerEncoderLayer region "
        "compiled without a padding mask was adopted by a block called with one: 113 of 120 values off, max "
        "0.80), and one traced while `self.scale` (a global, `box.scale`) was `None` kept that branch after it "
        "became a tensor. Such a `None` read gets a proxy and a `check_none` constraint, as thunder gives those "
        "constants theirs, so a call where it is something else compiles its own program.",
        features=("wiring.fixes",),
    ),
    Patch(
        "default values read from the function", interpreter, "_setup_frame_and_run_python_function",
        lambda original: fixes.defaults_read_from_the_function(original, _compiling_with_core),
        "discover() compilations",
        "thunder bug: a call's missing arguments are bound to the function's default values as constants, which the "
        "prologue never checks: after `f.__defaults__` (a module `forward`'s, `__kwdefaults__`) changed, or a list "
        "default changed in place, a call relying on the default ran the first call's program with the first "
        "call's value, silently. Such a default is passed as an argument read from the function "
        "(`fn.__defaults__[i]`), which thunder checks as any value read from the inputs.",
        features=("wiring.fixes",),
    ),
    Patch(
        "object.__setattr__ lookaside", _LOOKASIDES, object.__setattr__,
        lambda original: fixes.object_setattr_lookaside(original, _compiling_with_core), "discover() compilations",
        "thunder bugs: of the attributes a function writes on an object it did not create, only the first one "
        "written reaches the object after the call (thunder swaps the object's recorded `__dict__` for a copy at "
        "the first write and records none of the later ones): transformers' `StaticCache` allocated in the first "
        "compiled call kept `device` and lost its key and value tensors, so each later token got an empty cache "
        "(wrong tokens, silently); every write is recorded and replayed. An object the function creates and "
        "returns is rebuilt from the values its attributes had when first read, not from later writes "
        "(transformers' `ModelOutput` returned `hidden_states=None` under `output_hidden_states=True`): a write "
        "replaces the value thunder keeps.",
        features=("wiring.fixes",),
    ),
    Patch(
        "ThunderModule.__getattr__", ThunderModule, "__getattr__",
        lambda original: fixes.thunder_module_getattr(
            original, lambda module: uses_core_executor(thunder.compile_data(module))
        ),
        "discover() ThunderModules",
        "a method of the model that the ThunderModule lacks (transformers' `generate`) is found on the original "
        "module, so `thunder.jit(model).generate(...)` ran the model uncompiled (its `self(...)` is the original "
        "module): it is bound to a view of the model (a subclass sharing the model's `__dict__`) whose call and "
        "`forward` are the ThunderModule's, so every call it makes is compiled.",
        features=("wiring.fixes",),
    ),
    *(
        Patch(
            f"{method.__name__} lookaside", _LOOKASIDES, method,
            fixes.hook_registration_lookaside(method, interpret_call, _compiling_with_core), "discover() compilations",
            "a module hook registered inside jitted code (transformers 5 installs its output-capturing hooks in the "
            "first call with `output_hidden_states=True`) is registered for real, as in eager: thunder interpreted "
            "the registration and its prologue guarded on torch's hook-handle counter, which the registration "
            "advances, so the call failed (`Expected 8 to be equal to and have the type of 4`).",
            features=("wiring.fixes",),
        )
        for method in fixes.HOOK_REGISTRATIONS
    ),
    *(
        Patch(
            "graph breaks at modules with backward hooks", _LOOKASIDES, method,
            fixes.backward_hook_break(method, interpret_call, _compiling_with_core), "discover() compilations",
            "a module with backward hooks (`register_full_backward_hook`, `register_full_backward_pre_hook`) called "
            "in jitted code breaks the graph at its call (a `DataDependentShapeError` naming the module and the "
            "user's line, at which \"graph breaks at data-dependent ops\" breaks), so Dynamo runs the hooked module "
            "eagerly and the hooks see eager's gradients: torch attaches them to the eager graph's autograd nodes, "
            "which a trace has none of, so thunder silently ran the module without them (issue 42; stock thunder "
            "too).",
            features=("wiring.fixes",),
        )
        for method in fixes.BACKWARD_HOOK_SETUPS
    ),
    Patch(
        "boolean mask setitem gradient", grad_fn_map(), PrimIDs.COPY_WITH_SETITEM,
        lambda original: fixes.boolean_mask_setitem_grad(original, lambda: active_core_executor() is not None),
        "discover() compilations",
        "thunder limit: the value's gradient of `a[mask] = value` is `g[mask]`, a data-dependent shape a trace "
        "refuses, so the forward traced and its gradient raised (after a graph break too: torchvision's "
        "`generalized_box_iou_loss`); it has the value's shape and is computed by torch (`masked_cotangent`).",
        features=("wiring.fixes",),
    ),
    Patch(
        "index_put backward", backward_impls, "torch.index_put",
        lambda original: fixes.index_put_backward(original, lambda: active_core_executor() is not None),
        "discover() compilations",
        "thunder bug: `torch.index_put`'s gradients are matched with the wrong arguments, so `values` silently "
        "gets none; they are returned in the arguments' places.",
        features=("wiring.fixes",),
    ),
    Patch(
        "gradients through tuple and list arguments", autodiff, "_get_gradfn_and_executor",
        lambda original: fixes.nested_argument_grads(original, lambda: active_core_executor() is not None),
        "discover() compilations",
        "thunder bug: autodiff's joint of a symbol without a grad transform (its augmented forward and backward) "
        "puts no gradient to a tensor inside a tuple or list argument, silently: `nn.LSTMCell` in a Python loop "
        "(`torch.lstm_cell(x, (h, c), ...)`) gave the earlier steps no gradient (the weights 2e-1 off eager's); "
        "for such calls the joint is built the same way with each gradient put in its tensor's place.",
        features=("wiring.fixes",),
    ),
    Patch(
        "cross_entropy label smoothing", ltorch, "_cross_entropy_loss_label_smoothing",
        lambda original: fixes.cross_entropy_label_smoothing(original, lambda: active_core_executor() is not None),
        "discover() compilations",
        "thunder bug: `F.cross_entropy` with `label_smoothing` divides the unmasked smoothing term by the targets "
        "kept, so a mean loss with `ignore_index` hit is silently wrong; with class weights it squeezes every unit "
        "dim. ATen's composition instead (its `nll_loss` part runs eager's kernels, `eager_kernels`).",
        features=("wiring.fixes",),
    ),
    Patch(
        "TensorProxy.data", torch_property_map(), "data",
        lambda original: tensor_data.data_property(_compiling_with_core), "discover() compilations",
        "`t.data` failed (`AttributeError: Unknown attribute data`): it is `t.detach()`, as in eager (the same values, "
        "no gradient through it).",
        features=("eager.tensor_data",),
    ),
    Patch(
        "in-place updates through .data", thunder, "insert_alias_updates",
        lambda original: tensor_data.updates_through_data(original, _compiling_with_core), "discover() compilations",
        "an in-place update through `.data` (`self.gain.data.mul_(0.9)`) changes the tensor without autograd seeing "
        "it: before thunder's alias updates it is written as the same update of the tensor under `no_grad`, which "
        "`grad_transform_on_trace` (eager.inplace_grads) makes exact; refused with `NotImplementedError` naming "
        "`.data`, the op and the user's line where something read the tensor before the update (eager's backward "
        "would read the updated values) or the update goes through a view of `.data`.",
        features=("eager.tensor_data",),
    ),
    Patch(
        "zeros of no dims", torchex.ex.implmap, ltorch.zeros.id,
        lambda original: fixes.zeros_of_no_dims(original, _compiling_with_core), "discover() compilations",
        "thunder bug: the gradient autodiff gives a 0-dim value no gradient reached is `ltorch.zeros()`, which the "
        "torch executor runs as `torch.zeros()` (`TypeError: zeros() received an invalid combination of arguments`: "
        "the backward of `torch.var_mean(x)[0]`, of `torch.aminmax(x).max`); it runs `torch.zeros(())`.",
        features=("wiring.fixes",),
    ),
    Patch(
        "aliased inputs: merged only when the same view", thunder, "insert_alias_updates",
        lambda original: aliased_inputs.merged_by_view(original, _compiling_with_core), "discover() compilations",
        "thunder bug: in a function with an in-place op, thunder replaces every input sharing a storage with the "
        "first (`replace_args_with_alias_map`), so two different views passed as two arguments read as one "
        "(`base.unbind(-1)`'s columns: `[-2, -4]` where eager gives `[2, 2]`), and its groups, positions among the "
        "call's arguments, were applied to the computation's inputs (an unused argument shifted them). Inputs are "
        "found from their provenance; only the same views of arguments are merged; any other input sharing memory "
        "(another view, a module's parameter passed as an argument) stays an input linked to the first of its "
        "group (`aliased_input`), so thunder orders its reads after the other's in-place updates.",
        features=("eager.aliased_inputs",),
    ),
    Patch(
        "aliased inputs: links are views", update_aliases, "_is_view_creation_op", aliased_inputs.view_creation,
        "discover() compilations",
        "thunder's alias updates order the reads of a tensor's views after in-place updates of the tensor; "
        "`aliased_input` (\"aliased inputs: merged only when the same view\") is one such view.",
        features=("eager.aliased_inputs",),
    ),
    Patch(
        "insert_alias_updates", update_aliases, "insert_alias_updates", fixes.insert_alias_updates, "always",
        "thunder bug: the augmented forward of an autograd.Function is a fresh trace that knows none of its ops' "
        "names, so alias updates for its in-place ops can reuse one (`Variable t5 is being overwritten`); the "
        "trace's names are reserved first.",
        features=("wiring.fixes",),
    ),
)

_originals: dict[str, tuple[Any, bool]] = {}
_lock = threading.Lock()


def install() -> None:
    """Apply every patch once per process (idempotent, thread-safe)."""
    with _lock:
        if _originals:
            return
        for patch in PATCHES:
            had_key = not isinstance(patch.owner, dict) or patch.key in patch.owner
            original = patch.read()
            _originals[patch.name] = (original, had_key)
            patch.write(patch.make(original.__func__ if isinstance(original, staticmethod) else original))
        _discover_only_ids.update(id(_LOOKASIDES[fn]) for fn in _DISCOVER_ONLY_LOOKASIDES)


def uninstall() -> None:
    """Restore thunder exactly as it was before :func:`install`."""
    with _lock:
        _discover_only_ids.clear()
        for patch in reversed(PATCHES):
            if patch.name in _originals:
                patch.restore(*_originals.pop(patch.name))


def is_installed() -> bool:
    return bool(_originals)


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """The patches for the duration of a block (restored afterwards if this block installed them)."""
    was_installed = is_installed()
    install()
    try:
        yield
    finally:
        if not was_installed:
            uninstall()


@contextlib.contextmanager
def recording_jitted_functions() -> Iterator[list]:
    """``thunder.jit`` wrapped to collect the functions a script compiles (``thunderplug explain``);
    only inside this block."""
    import thunder

    recorded: list = []
    original = thunder.jit

    def jit(*args: Any, **kwargs: Any) -> Any:
        jitted = original(*args, **kwargs)
        recorded.append(jitted)
        return jitted

    thunder.jit = jit
    try:
        yield recorded
    finally:
        thunder.jit = original


def markdown() -> str:
    """docs/patches.md, generated from :data:`PATCHES`."""
    lines = [
        "# Patches of thunder 0.2.6",
        "",
        "Generated by `python -m thunderplug.wiring.patches` from `PATCHES` in",
        "`core/src/thunderplug/wiring/patches.py`; do not edit by hand. Everything else thunderplug does",
        "is registration (symbols, executors, grad rules, lookasides of its own executor). `install()` applies",
        "the table (done by `discover()`), `uninstall()` restores thunder exactly, `installed()` is the context",
        "manager. Private thunder names are read only in `thunderplug.thunder_compat`. \"owned by\" names the",
        "modules (under `thunderplug.`) whose code each replacement is; \"saves\" is filled in for the patches",
        "that exist only for speed or memory: what each saves, measured (with where), or that it was not, so",
        "that a thunder upgrade knows what dropping one costs.",
        "",
        "| patch | replaces | active in | owned by | why | saves |",
        "|---|---|---|---|---|---|",
    ]
    for patch in PATCHES:
        owners = ", ".join(f"`{feature}`" for feature in patch.features)
        lines.append(f"| {patch.name} | `{_where(patch)}` | {patch.active} | {owners} | {patch.why} | {patch.saves} |")
    return "\n".join(lines) + "\n"


_TABLE_NAMES = {
    id(_LOOKASIDES): "thunder.core.jit_ext._general_jit_lookaside_map",
    id(default_lookaside_map()): "thunder.core.default_lookaside_map()",
    id(default_opcode_handler_map()): "thunder.core.default_opcode_handler_map()",
    id(backward_impls): "thunder.core.transforms.backward_impls",
    id(torchex.ex.implmap): "thunder.executors.torchex.ex.implmap",
    id(torch_property_map()): "thunder.torch.langctx._property_name_to_fn_map",
    id(printable_value_types()): "thunder.core.baseutils._printable_value_types",
    id(grad_fn_map()): "thunder.core.transforms._grad_fn_map",
    id(jit_ext.general_jit_callbacks): "thunder.core.jit_ext.general_jit_callbacks",
}


def _where(patch: Patch) -> str:
    if isinstance(patch.owner, dict):
        key = patch.key
        name = getattr(key, "__qualname__", None) or getattr(key, "__name__", None) or (
            str(key) if isinstance(key, enum.Enum) else repr(key))
        return f"{_TABLE_NAMES[id(patch.owner)]}[{name}]"
    owner = getattr(patch.owner, "__qualname__", None) or patch.owner.__name__
    return f"{getattr(patch.owner, '__module__', '') + '.' if isinstance(patch.owner, type) else ''}{owner}.{patch.key}"


def owners_markdown() -> str:
    """The patches grouped by the modules that own them, for docs/architecture.md (a patch of two
    owners is listed under each); the speed-only ones with what they save."""
    owners: dict[str, list[Patch]] = {}
    for patch in PATCHES:
        for feature in patch.features:
            owners.setdefault(feature, []).append(patch)
    lines = ["| owner | patches |", "|---|---|"]
    for feature in sorted(owners):
        names = "; ".join(f"{patch.name} (saves {patch.saves})" if patch.saves else patch.name
                          for patch in owners[feature])
        lines.append(f"| `{feature}` | {names} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    print(owners_markdown() if sys.argv[1:] == ["--owners"] else markdown(), end="")
