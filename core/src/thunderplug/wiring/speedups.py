"""Replacements that make compilations with ``discover()``'s executors cheaper without changing
what they produce (issue 14: the first call of a float8 GPT against plain thunder's).

* **No full garbage collections while compiling.** A compilation allocates hundreds of thousands
  of objects (proxies, bound symbols, traces) that stay alive until it ends, so the collector's
  full collections, each over the whole heap (torch, thunder, the model), run again and again and
  free almost nothing: ~1 s of a 2-layer GPT's first call. Young collections (a quarter of that
  time) still run, so short-lived cycles are freed as before and the peak memory stays the same.
  The oldest generation's threshold is raised for the duration of thunder's
  ``get_computation_and_inputs`` (cache lookup, and compilation on a miss) of functions jitted
  with thunderplug's executors, and restored afterwards (nested and concurrent compilations
  counted: restored when the last one ends).
* **dce without quadratic pruning.** thunder's ``_remove_noop_subsymbols`` asks, for every
  subsymbol, whether the *parent's* whole subtree carries ``DONT_DCE``; on the deep subsymbol trees
  of unrolled subclass ops that is quadratic. The replacement tags the tree in one pass; it keeps
  the same subsymbols (or, where a tagged leaf composite was pruned earlier in the same loop, more).
  It also reads whether a subsymbol has proxy outputs without filling the bound symbol's cached
  ``flat_outs``/``flat_proxy_outs`` (a list, a tuple and a tree spec on every bound symbol at every
  depth, kept as long as the traces are: ~6 MiB of a 2-layer float8 GPT's compilation, ~20% of
  what it keeps); nothing else reads those properties of deep subsymbols.
* **Proxy swaps that share unchanged subtrees.** ``BoundSymbol.from_bsym_swap_proxies`` (every
  bound symbol a trace-substitution pass keeps, in autodiff and in each claiming pass) copies the
  whole subsymbol tree whenever the swap map is not empty, although it swaps only the proxies the
  bound symbol reads or writes; the unrolled subclass ops' trees (ATen ops and their
  decompositions) were copied in full by every such pass: ~15,000 bound symbols in a 2-layer
  float8 GPT's compilation. The replacement copies the path to each subsymbol in which something
  is swapped and shares the rest, as thunder shares them all when the map is empty; the copy of
  the bound symbol itself is new as before. A tree holding a ``CollectionProxy`` (which the
  original updates in place) is copied as before.
* **Builtins found without interpreting two subscripts.** Interpreted code that names a builtin
  (``hasattr``, ``getattr``, ``len``, ``isinstance``: thunder's own helpers for ``in``, ``len()``,
  ``bool()``, and ``nn.Module.__getattr__`` through them) has it looked up as
  ``globals["__builtins__"][name]``, each subscript an interpreted ``lambda d, k: d[k]`` whose
  ``d[k]`` is another interpreted frame: four frames (~4,000 Python calls) per lookup, about 40%
  of what interpreting a 2-layer float8 GPT costs. The replacement calls the lookaside those
  frames end in (for a dict, thunder's provenance-tracking ``dict.__getitem__``) on the same
  wrapped dict and key: the same wrapped value, with the same provenance, cached in the same
  item wrappers. Module globals, builtins modules (``__main__``) and names that are not there
  (the ``NameError``) are looked up as before.
* **Builtin containers read without interpreting helpers.** ``bool(d)`` and ``len(d)`` of a
  builtin container, ``k in d`` of a dict or set and ``c[i]`` of a dict, list or tuple are, in
  thunder's interpreter, interpreted helper frames (``bool``'s: ``getattr(type(x), "__bool__",
  object())``, ``hasattr``; ``len``'s: ``hasattr``, ``getattr``; the subscript's and ``in``'s:
  ``obj.__getitem__(i)``, ``getattr(d, "__contains__")(k)``) that end in the container's own method
  (thunder's provenance-tracking ``__len__``, ``__contains__``, ``__getitem__`` for dicts, lists
  and tuples; the type's own for the rest). ``nn.Module.__call__`` asks ``bool()`` of eight hook
  dicts per module call; these frames were a quarter of the Python calls of interpreting a float8
  GPT block. The replacements call that method through the interpreter directly, on the same
  wrapped values: the same result, the same item tracking (and so the same prologue checks).
  Other types (subclasses of these, user containers, proxies) take thunder's own path.
* **Module calls without hook checks.** Calling a submodule in interpreted code interprets torch's
  ``Module.__call__`` (``_wrapped_call_impl``, ``_call_impl``: the compiled-call and tracing
  checks, eight hook tables, ``forward_call(*args, **kwargs)``), about a tenth of interpreting a
  float8 GPT block. For a module with no hooks of its own and no global ones, not compiled by
  ``Module.compile``, outside TorchScript tracing, that code only calls ``self.forward``: its
  ``forward`` is read and called through the interpreter directly. Any other module's call is
  interpreted as before (so hooks run as they did).
* **Claims bound directly.** thunder's claiming pass (``_transform_for_operator_executor_execution``,
  run five times per compilation) hands a bound symbol that an operator executor takes without an
  execution transform to that executor's operator by *calling* it: the operator's meta runs
  again and its outputs are new proxies swapped in for the old ones. The unrolled subclass ops
  (ATen ops the ``aten`` executor runs) and the ops the torch executor runs are all of this kind:
  ~10% of a 2-layer float8 GPT's first call, and the new proxies make every later bound symbol
  (with its subsymbol tree) be copied to swap them in. They are bound to the operator with the
  outputs they have, and with what thunder's pass gives them: an operator registered ``like=`` a
  symbol has one subsymbol, a call of that symbol (the bound symbol itself, which holds the
  symbol's own decomposition), and the arguments are rebuilt as thunder's proxy swap rebuilds
  them (a ``torch.Size`` becomes a tuple, which the generated code can print); what an execution
  transform records is renamed to the original outputs where they match; unclaimed composites are
  flattened into their subsymbols as thunder does. thunder's pass gets the result: it keeps what
  is claimed and does the rest itself. Not applied when the compilation has thunder transforms:
  those may re-shape inputs (sharding, quantization) and rely on the metas running again.
* **Each code object disassembled once.** thunder's interpreter runs every frame from
  ``tuple(dis.get_instructions(code))``, disassembling the function again at every call (the same
  few helpers thousands of times per compilation: ~7% of a float8 GPT's first call). Its ``dis``
  is given a ``get_instructions`` that keeps the (immutable) instruction tuple of each code
  object while the code object lives; everything else is ``dis``'s own.
* **Frames for tracebacks made without spinning.** When an exception leaves an interpreted frame
  (the ``StopIteration`` that ends every interpreted ``for`` loop over a list or dict, through
  thunder's iterator helpers, two or three frames each), thunder's interpreter gives the traceback
  a real Python frame at that function's line: it raises in a code object compiled for that
  position, in a new thread (so that the frame's ``f_back`` is not the interpreter's handler), and
  waits for it in a loop that holds the GIL, which the new thread gets only when the interpreter's
  switch interval (5 ms) takes it away: ~5 ms per frame, 1,233 frames (6.6 s, a fifth) of the
  tiny Llama's three ``generate()`` compilations. Here the thread is waited for on a lock (which
  releases the GIL), and each position's frame (a finished frame of an empty function: no locals,
  nothing of the program) is made once and kept: every traceback at that position gets the same
  frame, with the same file, function name, first line and line as thunder's.
* **Each meta's signature computed once.** thunder's ``Symbol.normalize`` (every bound symbol a
  compilation makes) recomputes ``inspect.signature`` of the symbol's meta each time (~2,500 times
  for one float8 GPT block, ~3% of its compilation); it is kept per meta function while it lives.
* **Autograd links made without drawing numbers.** thunder connects each compiled call to autograd
  through two Functions linked by a one-element *meta* tensor, made with ``torch.randn(1,
  device="meta", ...)`` in the forward and again in the backward. A meta tensor holds no values,
  but torch makes a random one through its Python reference implementation: ~80 µs idle and up to
  ~0.5 ms under load per call, twice per step of each compiled call, which a model whose repeated
  blocks are regions (``thunderplug.caching.regions``) pays once per block: ~1 ms per block step, about
  the whole gap between a 16-layer float8 GPT's regions and its one-trace step. thunder's
  ``torch_autograd`` module is given a ``torch`` whose ``randn`` makes such meta tensors with
  ``torch.empty`` (same shape, dtype, device and ``requires_grad``; the generator is not drawn
  from on meta either); every other call is torch's own.
"""

from __future__ import annotations

import _thread
import collections
import functools
import gc
import inspect
import operator
import threading
import types
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from thunder.core.compile_data import get_compile_data
from thunder.core.interpreter import INTERPRETER_SIGNALS
from thunder.core.prims import OpTags, PrimIDs
from thunder.core.proxies import CollectionProxy, Proxy, TensorProxy, variableify
from thunder.core.pytree import tree_flatten, tree_flatten_with_dataclass, tree_unflatten
from thunder.core.symbol import BoundSymbol, BoundSymbolTag, Symbol
from thunder.core.trace import TraceCtx, from_trace, tracectx
from thunder.extend import Executor, OperatorExecutor
from thunder.torch.experimental.dtensor_torch_and_prims import dispatch_to_impl

from thunderplug.thunder_compat import claiming_executor, interpret_call

_gc_lock = threading.Lock()
_gc_state: dict[str, Any] = {"depth": 0, "threshold": None}
_NO_FULL_COLLECTION = 2**30  # young collections between two full ones: never, within a compilation


def deferred_full_collections_while_compiling(
    original: Callable[..., Any],
    uses_thunderplug: Callable[[Any], bool],
    after_compiling: Callable[[list], None] = lambda traces: None,
) -> Callable:
    """thunder's ``_with_cache_info_ctx`` (it wraps each jitted function's ``get_computation_and_inputs``
    when ``thunder.jit`` is called), wrapping also a deferral of full garbage collections for jitted
    functions whose executors ``uses_thunderplug``; the compile data is read from the function's closure.
    When the call compiled (a cache miss; a hit on a compilation another module shared also brings
    new traces), ``after_compiling`` gets the new list of computation traces before the step runs."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        wrapped = original(fn)
        compile_data_ref = _closure_value(fn, "weakref_cd")
        compile_stats_ref = _closure_value(fn, "weakref_cs")
        if compile_data_ref is None:
            return wrapped

        def call(*args: Any, **kwargs: Any) -> Any:
            compile_data = compile_data_ref()
            if compile_data is None or not uses_thunderplug(compile_data):
                return wrapped(*args, **kwargs)
            stats = compile_stats_ref() if compile_stats_ref is not None else None
            misses_before = getattr(stats, "cache_misses", None)
            _defer_full_collections()
            try:
                result = wrapped(*args, **kwargs)
                traces = getattr(stats, "last_traces", None)
                if traces is not None and getattr(stats, "cache_misses", None) != misses_before:
                    after_compiling(traces)
                return result
            finally:
                _restore_full_collections()

        return call

    return decorate


def _closure_value(fn: Callable[..., Any], name: str) -> Any:
    code = getattr(fn, "__code__", None)
    if code is None or name not in code.co_freevars or fn.__closure__ is None:
        return None
    return fn.__closure__[code.co_freevars.index(name)].cell_contents


def _defer_full_collections() -> None:
    with _gc_lock:
        if _gc_state["depth"] == 0:
            threshold = gc.get_threshold()
            _gc_state["threshold"] = threshold
            gc.set_threshold(threshold[0], threshold[1], _NO_FULL_COLLECTION)
        _gc_state["depth"] += 1


def _restore_full_collections() -> None:
    with _gc_lock:
        _gc_state["depth"] -= 1
        if _gc_state["depth"] == 0:
            gc.set_threshold(*_gc_state["threshold"])
            _gc_state["threshold"] = None


def direct_operator_claims(original: Callable[..., TraceCtx], active: Callable[[], bool]) -> Callable:
    """thunder's claiming pass, given a trace in which what operator executors take is already bound
    to their operators (see the module docstring)."""

    @functools.wraps(original)
    def replacement(trace: TraceCtx, executors_list: Sequence[Executor]) -> TraceCtx:
        compile_data = get_compile_data()
        if not active() or compile_data is None or compile_data.transforms:
            return original(trace, executors_list)
        claimed = from_trace(trace)
        claimed.bound_symbols = _claimed(trace.bound_symbols, executors_list, claimed, backward=False)
        return original(claimed, executors_list)

    return replacement


def _claimed(
    bsyms: Sequence[BoundSymbol], executors: Sequence[Executor], trace: TraceCtx, backward: bool
) -> list[BoundSymbol]:
    """``bsyms`` with thunder's claims made in its order: the first operator executor that can execute
    a bound symbol, or fusion executor that can fuse it, takes it; a composite nobody takes is
    replaced by its subsymbols (tagged ``BACKWARD`` when it was). What a fusion executor takes, and
    what thunder keeps as it is, are left to thunder's pass."""
    result: list[BoundSymbol] = []
    for bsym in bsyms:
        if backward:
            bsym.tags.add(BoundSymbolTag.BACKWARD)  # as thunder tags the subsymbols it descends into
        if bsym.sym.python_impl is not None or bsym.sym.id == PrimIDs.GET_GRAD:
            result.append(bsym)
            continue
        taker = claiming_executor(bsym, executors)
        if taker is None and bsym.sym.executor is None and not bsym.sym.is_prim:
            result += _claimed(bsym.subsymbols, executors, trace, backward or BoundSymbolTag.BACKWARD in bsym.tags)
        elif isinstance(taker, OperatorExecutor) and (transform := taker.get_execution_transform(bsym)) is not None:
            result += _transformed(transform, bsym, trace) or [bsym]
        elif isinstance(taker, OperatorExecutor) and (operator := _own_operator(taker, bsym)) is not None:
            result.append(_bound_to(operator, bsym))
        else:
            result.append(bsym)
    return result


def _transformed(transform: Callable[..., Any], bsym: BoundSymbol, trace: TraceCtx) -> list[BoundSymbol] | None:
    """What an execution transform records for ``bsym``, as thunder's pass records it, but with the
    transform's outputs renamed to ``bsym``'s own, so that nothing after it needs swapping (every
    later bound symbol thunder's pass keeps is copied when its swap map is not empty). ``None``
    where an output is not a new proxy like ``bsym``'s (an input returned, other metadata): thunder's
    pass claims that one itself."""
    with tracectx(trace):
        trace.push_scope([])
        try:
            result = transform(*bsym.args, **bsym.kwargs)
        finally:
            produced = trace.pop_scope()
    made = {variableify(out) for recorded in produced for out in tree_flatten(recorded.output)[0]}
    new_leaves, old_leaves = tree_flatten(result)[0], tree_flatten(bsym.output)[0]
    if len(new_leaves) != len(old_leaves):
        return None
    renames: dict = {}
    for new, old in zip(new_leaves, old_leaves):
        if isinstance(new, Proxy) or isinstance(old, Proxy):
            if not _same_metadata(new, old) or variableify(new) not in made or variableify(new) in renames:
                return None
            renames[variableify(new)] = old
    return [_in_place_of(recorded.from_bsym_swap_proxies(renames), bsym) for recorded in produced]


def _same_metadata(new: Any, old: Any) -> bool:
    if type(new) is not type(old) or not isinstance(new, Proxy):
        return False
    if not isinstance(new, TensorProxy):
        return True
    return all(getattr(new, name) == getattr(old, name) for name in ("shape", "dtype", "device", "requires_grad"))


def _own_operator(executor: OperatorExecutor, bsym: BoundSymbol) -> Symbol | None:
    """The operator thunder would call for ``bsym`` (which has no execution transform), where calling
    it would record just itself: a meta of its own or ``bsym``'s symbol (whose subsymbols it then has)."""
    operator = executor.implmap[bsym.sym.id].symbol
    return operator if operator.is_prim or operator.meta is bsym.sym else None


def _bound_to(operator: Symbol, bsym: BoundSymbol) -> BoundSymbol:
    """``bsym`` as a call of an executor's ``operator``, with its own outputs, tags and source line,
    its subsymbols and arguments as thunder's pass gives them (a call of ``bsym``'s symbol under an
    operator registered ``like=`` it; the arguments rebuilt by thunder's pytree, as every bound
    symbol thunder's pass records is when it swaps in the operator's new outputs).
    ``Symbol.bind`` would first normalize the arguments against the operator's meta (an
    ``inspect.signature`` each time); they already are when the meta is ``bsym``'s symbol or
    takes anything (``*args, **kwargs``: the ``aten`` executor's operators)."""
    subsymbols = () if operator.is_prim else (_symbol_call(bsym),)
    args, kwargs = _rebuilt(bsym.args), _rebuilt(bsym.kwargs)
    normalized = operator.meta is bsym.sym or (not isinstance(operator.meta, Symbol) and _takes_anything(operator.meta))
    if normalized:
        bound = BoundSymbol(operator, args=args, kwargs=kwargs, output=bsym.output, subsymbols=subsymbols)
        if operator._bind_postprocess is not None:
            operator._bind_postprocess(bound)
    else:
        bound = operator.bind(*args, output=bsym.output, subsymbols=subsymbols, **kwargs)
    bound.header = bsym.header
    return _in_place_of(bound, bsym)


def _symbol_call(bsym: BoundSymbol) -> BoundSymbol:
    """``bsym`` as the subsymbol thunder records when an operator registered ``like=`` its symbol
    runs that symbol: a new bound symbol (tags of its own) sharing ``bsym``'s decomposition."""
    return bsym.from_bsym(tags=set())


def _rebuilt(value: Any) -> Any:
    """``value`` flattened and unflattened by thunder's pytree, as thunder's proxy swap does
    (``torch.Size`` -> tuple); unchanged where it holds a ``CollectionProxy`` (which the swap
    rewrites in place)."""
    flat, spec = tree_flatten_with_dataclass(value)
    if any(isinstance(leaf, CollectionProxy) for leaf in flat):
        return value
    return tree_unflatten(flat, spec)


def _in_place_of(recorded: BoundSymbol, bsym: BoundSymbol) -> BoundSymbol:
    """``recorded`` with ``bsym``'s tags and source line, as thunder's pass gives what replaces ``bsym``."""
    recorded.tags.update(bsym.tags)
    recorded.source_filename, recorded.source_positions = bsym.source_filename, bsym.source_positions
    return recorded


@functools.cache
def _takes_anything(meta: Callable[..., Any]) -> bool:
    kinds = [p.kind for p in inspect.signature(meta).parameters.values()]
    return kinds == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]


def remove_noop_subsymbols(
    original: Callable[[BoundSymbol], None], active: Callable[[], bool], runs_itself: Callable[[Symbol], bool]
) -> Callable:
    """thunder's ``transform_common._remove_noop_subsymbols`` (called by ``dce`` on every kept bound
    symbol), with the parent's ``DONT_DCE`` question asked once instead of once per subsymbol. A
    composite without subsymbols is a no-op to thunder, except a symbol for which ``runs_itself``
    holds: an operator runs it (an ATen op copied without its decomposition)."""

    def replacement(bsym: BoundSymbol) -> None:
        if not active():
            return original(bsym)
        tagged: dict[int, bool] = {}
        _tag(bsym, tagged)
        _prune(bsym, tagged, runs_itself)
        return None

    return replacement


def _tag(bsym: BoundSymbol, tagged: dict[int, bool]) -> bool:
    """Whether ``bsym`` or a subsymbol at any depth carries ``DONT_DCE`` (thunder's ``has_tags``),
    for every bound symbol of the tree in one pass."""
    found = OpTags.DONT_DCE in (bsym.sym.tags or ()) or OpTags.DONT_DCE in bsym.tags
    for sub in bsym.subsymbols:
        found = _tag(sub, tagged) or found
    tagged[id(bsym)] = found
    return found


def _prune(bsym: BoundSymbol, tagged: dict[int, bool], runs_itself: Callable[[Symbol], bool]) -> None:
    keeps_constant_outputs = tagged[id(bsym)]
    kept = []
    for sub in bsym.subsymbols:
        if not sub.subsymbols and not sub.sym.is_prim and not runs_itself(sub.sym):
            continue  # a composite that decomposed into nothing
        if not keeps_constant_outputs and not _has_proxy_output(sub):
            continue  # only constant outputs
        _prune(sub, tagged, runs_itself)
        kept.append(sub)
    if len(kept) != len(bsym.subsymbols) or not isinstance(bsym.subsymbols, list):
        bsym.subsymbols = kept  # else the list stays, shared with the copies of ``bsym`` that share it


def _has_proxy_output(bsym: BoundSymbol) -> bool:
    """``bool(bsym.flat_proxy_outs)``, without caching the flattened outputs on ``bsym`` when they are
    not cached already."""
    cached = bsym.__dict__.get("flat_proxy_outs")
    if cached is not None:
        return bool(cached)
    return _any_proxy(bsym.output)


def _any_proxy(value: Any) -> bool:
    if isinstance(value, Proxy):
        return True
    if isinstance(value, (tuple, list)):
        return any(_any_proxy(v) for v in value)
    if value is None or isinstance(value, (bool, int, float, complex, str)):
        return False
    flat, _ = tree_flatten_with_dataclass(value)  # dicts, dataclasses, ...: as thunder flattens them
    return any(isinstance(v, Proxy) for v in flat)


def swap_proxies_sharing_subtrees(original: Callable[..., BoundSymbol], active: Callable[[], bool]) -> Callable:
    """thunder's ``BoundSymbol.from_bsym_swap_proxies``, sharing the subsymbols in which nothing is swapped."""

    def replacement(
        self: BoundSymbol,
        swap_map: dict,
        skip_inputs: bool = False,
        skip_output: bool = False,
        skip_subsymbols: bool = False,
    ) -> BoundSymbol:
        if skip_subsymbols or not swap_map or not self.subsymbols or not active():
            return original(self, swap_map, skip_inputs, skip_output, skip_subsymbols)

        def swapped(bsym: BoundSymbol) -> BoundSymbol:
            subsymbols = [swapped(sub) for sub in bsym.subsymbols]
            changed = any(new is not old for new, old in zip(subsymbols, bsym.subsymbols))
            if bsym is not self and not changed and not _swaps(bsym, swap_map, skip_inputs, skip_output):
                return bsym
            copy = original(bsym, swap_map, skip_inputs, skip_output, True)  # a new bound symbol, subsymbols shared
            if changed:
                copy.subsymbols = subsymbols
            return copy

        return swapped(self)

    return replacement


def _swaps(bsym: BoundSymbol, swap_map: dict, skip_inputs: bool, skip_output: bool) -> bool:
    """Whether swapping ``bsym``'s own arguments and outputs would change one (or it holds a
    ``CollectionProxy``, which the original rewrites in place)."""
    values = ([] if skip_inputs else [bsym.args, bsym.kwargs]) + ([] if skip_output else [bsym.output])
    for value in values:
        flat, _ = tree_flatten_with_dataclass(value)
        for leaf in flat:
            if isinstance(leaf, CollectionProxy):
                return True
            if isinstance(leaf, Proxy):
                target = swap_map.get(variableify(leaf))
                if target is not None and target is not leaf:
                    return True
    return False


def method_calls_without_interpretation(original: Callable[..., Any], active: Callable[[], bool]) -> Callable:
    """thunder's lookaside for ``functools.partial.__call__``, calling a tensor method's thunder
    function directly: ``x.t()`` on a proxy is ``partial(ltorch.t, x)()``, which thunder interprets
    (``partial_call_impl``: ~60,000 Python calls, a dict merge and global lookups, to reach a
    symbol thunder then calls opaquely); ``x.transpose(1, 2)``'s function, a DTensor dispatch
    wrapper, is interpreted in full (~330,000), where ``torch.transpose(x, 1, 2)`` is opaque.
    The replacement reads the partial's function and arguments as the interpreted code would and
    calls the function through the interpreter (for a symbol: thunder's symbol lookaside; for the
    DTensor wrapper: the symbol the wrapper picks, by its rule). Other partials, and partials
    with keywords, are interpreted as before."""
    from thunder.core.interpreter import unwrap, wrap_const

    def replacement(wrapped_partial: Any, *args: Any, **kwargs: Any) -> Any:
        partial = unwrap(wrapped_partial)
        if not active() or type(partial) is not functools.partial or partial.keywords:
            return original(wrapped_partial, *args, **kwargs)
        fn = partial.func
        symbol = fn if isinstance(fn, Symbol) else _dtensor_dispatch_choice(fn, partial.args, args, kwargs)
        if symbol is None:
            return original(wrapped_partial, *args, **kwargs)
        bound = interpret_call(getattr, wrapped_partial, wrap_const("args"))
        if bound is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
            return bound
        bound.track_items()
        return interpret_call(wrap_const(symbol), *bound.item_wrappers, *args, **kwargs)

    return replacement


def _dtensor_dispatch_choice(fn: Any, bound: tuple, args: tuple, kwargs: dict) -> Symbol | None:
    """The symbol a method function made by thunder's ``dispatch_to_impl`` calls for these
    arguments (its DTensor symbol when every tensor is a DTensor proxy, else its single-device
    one), or ``None`` for any other function."""
    from thunder.core.interpreter import unwrap
    from thunder.torch.experimental.dtensor_proxy import DTensorProxy

    if getattr(fn, "__code__", None) is not _DISPATCH_WRAPPER_CODE:
        return None
    cells = dict(zip(fn.__code__.co_freevars, (cell.cell_contents for cell in fn.__closure__)))
    values = (*bound, *(unwrap(a) for a in args), *(unwrap(v) for v in kwargs.values()))
    try:
        flat = tree_flatten(values)[0]
    except Exception:  # noqa: BLE001 - the wrapper itself fails here: let the interpreter raise it
        return None
    tensors = [x for x in flat if isinstance(x, TensorProxy)]
    if tensors and all(isinstance(t, DTensorProxy) for t in tensors):
        return cells["dtensor_symbol"]
    return cells["single_device_symbol"]


_DISPATCH_WRAPPER_CODE = dispatch_to_impl(None, None).__code__


def builtins_without_interpretation(original: Callable[..., Any], active: Callable[[], bool]) -> Callable:
    """thunder's interpreter ``globals_lookup`` (``LOAD_GLOBAL``, ``LOAD_NAME``), finding a builtin
    through the ``dict.__getitem__`` lookaside directly instead of interpreting the two subscripts
    that reach it."""
    from thunder.core.interpreter import WrappedValue, get_interpretercompilectx, unwrap, wrap_const

    def replacement(globals_dict: Any, name: Any) -> Any:
        if not active() or type(globals_dict) is not WrappedValue or type(globals_dict.value) is not dict:
            return original(globals_dict, name)
        module_globals, key = globals_dict.value, unwrap(name)
        builtins = module_globals.get("__builtins__")
        if key in module_globals or type(builtins) is not dict or key not in builtins:
            return original(globals_dict, name)
        compilectx = get_interpretercompilectx()
        if not compilectx.with_provenance_tracking:
            return original(globals_dict, name)
        builtins_key = wrap_const("__builtins__")
        getitem = compilectx.lookaside(dict.__getitem__, globals_dict, builtins_key)
        if not callable(getitem):
            return original(globals_dict, name)
        wrapped_builtins = getitem(globals_dict, builtins_key)
        if wrapped_builtins is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
            return wrapped_builtins
        return getitem(wrapped_builtins, name)

    return replacement


class DisassemblyOnce(types.ModuleType):
    """``dis`` for thunder's interpreter, with ``get_instructions(code)`` computed once per code
    object (by identity, while it lives) in ``discover()`` compilations."""

    def __init__(self, original: types.ModuleType, active: Callable[[], bool]):
        super().__init__(original.__name__, original.__doc__)
        self.__dict__.update({k: v for k, v in vars(original).items() if k != "get_instructions"})  # plain reads
        self._original = original
        self._active = active
        # No lock: one dict read or write at a time is atomic, two threads disassembling the same code
        # store equal tuples, and ``_forget`` runs while a code object is freed, possibly inside such a
        # write (the tuple it replaces holds nested code objects in its ``LOAD_CONST`` instructions).
        self._instructions: dict[int, tuple[weakref.ref, tuple]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)

    def get_instructions(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or type(x) is not types.CodeType or not self._active():
            return self._original.get_instructions(x, *args, **kwargs)
        key = id(x)
        found = self._instructions.get(key)
        if found is not None and found[0]() is x:
            return found[1]
        instructions = tuple(self._original.get_instructions(x))
        self._instructions[key] = (weakref.ref(x, functools.partial(self._forget, key)), instructions)
        return instructions

    def _forget(self, key: int, ref: weakref.ref) -> None:
        """Drop a freed code object's entry (no live object can have its id yet)."""
        found = self._instructions.get(key)
        if found is not None and found[0] is ref:
            self._instructions.pop(key, None)


_FramePosition = tuple[str, int, int, str, str]  # file, first line, line, name, qualified name


def python_frames_made_once(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder's ``InterpreterFrame.get_or_make_python_frame`` (the frame an exception's traceback gets
    when it leaves an interpreted frame), with each position's frame made once (:func:`_made_frame`) in
    ``discover()`` compilations; thunder's own elsewhere."""
    frames: dict[_FramePosition, types.FrameType] = {}  # one dict read or write at a time is atomic

    @functools.wraps(original)
    def replacement(self: Any) -> types.FrameType:
        if not active():
            return original(self)
        code = self.code
        assert self.positions is not None
        line = self.positions.lineno if self.positions.lineno is not None else code.co_firstlineno
        position = (code.co_filename, code.co_firstlineno, line, code.co_name, self.qualname)
        frame = frames.get(position)
        if frame is None:
            frame = frames[position] = _made_frame(position)
        return frame

    return replacement


def _made_frame(position: _FramePosition) -> types.FrameType:
    """A finished Python frame at ``position``: a code object that raises at that line is run in a new
    thread (its frame's ``f_back`` is then that thread's, not the caller's), which hands the frame back
    and releases a lock the caller waits on."""
    filename, first_line, line, name, qualname = position
    code = compile("\n" * (line - first_line) + "raise RuntimeError", filename, "exec")
    raiser = types.FunctionType(code.replace(co_firstlineno=first_line, co_name=name, co_qualname=qualname), {})
    made: list[types.FrameType] = []
    done = _thread.allocate_lock()
    done.acquire()

    def run() -> None:
        try:
            raiser()
        except RuntimeError as e:
            tb = e.__traceback__
            assert tb is not None
            while tb.tb_next is not None:
                tb = tb.tb_next
            made.append(tb.tb_frame)
        finally:
            done.release()

    _thread.start_new_thread(run, ())
    done.acquire()  # waits without holding the GIL
    return made[0]


def normalize_with_signature_once(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder's ``Symbol.normalize`` (every bound symbol made: each symbol call, each claim and
    copy) binds the arguments to ``inspect.signature(self.meta)``, which it computes again at every
    call; here the signature of each meta function is kept while the function lives, in
    ``discover()`` compilations. Binding and defaults are ``inspect``'s own, as in thunder."""
    signatures: weakref.WeakKeyDictionary[Any, inspect.Signature] = weakref.WeakKeyDictionary()
    lock = threading.Lock()

    @functools.wraps(original)
    def normalize(self: Symbol, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        meta = self.meta
        if meta is None or not active():
            return original(self, *args, **kwargs)
        try:
            signature = signatures.get(meta)
        except TypeError:  # a meta that cannot be weakly referenced
            return original(self, *args, **kwargs)
        if signature is None:
            signature = inspect.signature(meta)
            with lock:
                signatures[meta] = signature
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.args, bound.kwargs

    return normalize


class MetaRandnAsEmpty(types.ModuleType):
    """``torch`` for thunder's ``torch_autograd`` module, with ``randn`` of a meta tensor made by
    ``torch.empty`` (a meta tensor has no values to draw; see the module docstring)."""

    _EMPTY_KEYWORDS = frozenset({"device", "dtype", "layout", "requires_grad"})

    def __init__(self, original: types.ModuleType):
        super().__init__(original.__name__, original.__doc__)
        self._original = original

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)  # read through: torch patched later is seen here too

    def randn(self, *size: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        on_meta = device == "meta" or (isinstance(device, self._original.device) and device.type == "meta")
        if on_meta and kwargs.keys() <= self._EMPTY_KEYWORDS:
            return self._original.empty(*size, **kwargs)
        return self._original.randn(*size, **kwargs)


_LENGTH_TYPES = frozenset({dict, collections.OrderedDict, list, tuple, set, frozenset, str})
_TRUTH_TYPES = frozenset({type(None), int, float})  # a ``__bool__`` of their own
_MEMBERSHIP_TYPES = frozenset({dict, collections.OrderedDict, set, frozenset})  # answers a plain bool
_SUBSCRIPT_TYPES = frozenset({dict, collections.OrderedDict, list, tuple})


def container_sizes_without_interpretation(
    builtin: Callable[[Any], Any], original: Callable[..., Any], active: Callable[[], bool]
) -> Callable[..., Any]:
    """thunder's lookaside for ``bool`` or ``len`` (``builtin``): for a value of a builtin type it
    calls the type's ``__len__`` (``__bool__`` for None and numbers) through the interpreter instead
    of interpreting thunder's helper frames that reach it (see the module docstring)."""
    from thunder.core.interpreter import unwrap, wrap_const

    def replacement(x: Any) -> Any:
        typ = type(unwrap(x))
        if not active():
            return original(x)
        if builtin is bool and typ in _TRUTH_TYPES:
            return interpret_call(wrap_const(typ.__bool__), x)
        if typ not in _LENGTH_TYPES:
            return original(x)
        length = interpret_call(wrap_const(typ.__len__), x)
        if builtin is len or length is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
            return length
        return interpret_call(wrap_const(operator.truth), length)

    return replacement


def membership_tests_without_interpretation(original: Callable[..., Any], active: Callable[[], bool]) -> Callable:
    """thunder's ``CONTAINS_OP`` handler: ``k in d`` / ``k not in d`` of a dict or set calls its
    ``__contains__`` through the interpreter directly (see the module docstring)."""
    from thunder.core.interpreter import unwrap, wrap_const

    def contains_op_handler(inst: Any, /, **state: Any) -> Any:
        stack = state["stack"]
        if not active() or len(stack._stack) < 2 or type(unwrap(stack._stack[-1])) not in _MEMBERSHIP_TYPES:
            return original(inst, **state)
        container = stack.pop_wrapped()
        key = stack.pop_wrapped()
        result = interpret_call(wrap_const(type(unwrap(container)).__contains__), container, key)
        if result is not INTERPRETER_SIGNALS.EXCEPTION_RAISED and inst.arg == 1:
            result = interpret_call(wrap_const(operator.not_), result)
        if result is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
            return result
        stack.append(result)
        return None

    return contains_op_handler


def subscripts_without_interpretation(original: Callable[..., Any], active: Callable[[], bool]) -> Callable:
    """thunder's ``BINARY_SUBSCR`` handler: ``c[i]`` of a dict, list or tuple calls its
    ``__getitem__`` (thunder's provenance-tracking one) through the interpreter directly (see the
    module docstring)."""
    from thunder.core.interpreter import unwrap, wrap_const

    def binary_subscr_handler(inst: Any, /, **state: Any) -> Any:
        stack = state["stack"]
        if not active() or len(stack._stack) < 2 or type(unwrap(stack._stack[-2])) not in _SUBSCRIPT_TYPES:
            return original(inst, **state)
        index = stack.pop_wrapped()
        container = stack.pop_wrapped()
        result = interpret_call(wrap_const(type(unwrap(container)).__getitem__), container, index)
        if result is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
            return result
        stack.append(result)
        return None

    return binary_subscr_handler


_MODULE_CALL = torch.nn.Module._wrapped_call_impl
_HOOK_TABLES = ("_backward_hooks", "_backward_pre_hooks", "_forward_hooks", "_forward_pre_hooks")
_GLOBAL_HOOK_TABLES = (
    "_global_backward_pre_hooks", "_global_backward_hooks", "_global_forward_hooks", "_global_forward_pre_hooks",
)  # fmt: skip


def module_calls_without_hook_checks(_no_lookaside: Any) -> Callable[..., Any]:
    """A lookaside for ``nn.Module.__call__`` (``_wrapped_call_impl``) in discover() compilations
    (other compilations do not see it: patches' "lookasides of discover() only"): a module without
    hooks (its own and torch's global ones), not compiled by ``Module.compile`` and not under
    TorchScript tracing has its ``forward`` interpreted directly, which is all ``_call_impl`` does
    for it; any other module's call interprets torch's code as before."""
    from thunder.core.interpreter import unwrap, wrap_const

    # the same code as another function object, which has no lookaside: thunder interprets it as before
    unlooked = types.FunctionType(
        _MODULE_CALL.__code__, _MODULE_CALL.__globals__, _MODULE_CALL.__name__,
        _MODULE_CALL.__defaults__, _MODULE_CALL.__closure__,
    )  # fmt: skip

    def lookaside(wrapped_module: Any, *args: Any, **kwargs: Any) -> Any:
        if not _calls_forward_only(unwrap(wrapped_module)):
            return interpret_call(unlooked, wrapped_module, *args, **kwargs)
        forward = interpret_call(getattr, wrapped_module, wrap_const("forward"))
        if forward is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
            return forward
        return interpret_call(forward, *args, **kwargs)

    return lookaside


def _calls_forward_only(module: Any) -> bool:
    """Whether torch's ``Module.__call__`` of ``module`` does nothing but call ``module.forward``."""
    cls = type(module)
    if not isinstance(module, torch.nn.Module) or cls.__call__ is not _MODULE_CALL:
        return False
    if cls._call_impl is not torch.nn.Module._call_impl:
        return False
    state = module.__dict__
    if getattr(module, "_compiled_call_impl", None) is not None or torch._C._get_tracing_state():
        return False
    if not all(name in state for name in _HOOK_TABLES) or any(state[name] for name in _HOOK_TABLES):
        return False
    return not any(getattr(torch.nn.modules.module, name) for name in _GLOBAL_HOOK_TABLES)
