"""The ``thunderplug`` executor: first in every ``discover()`` list.

It owns what must happen for thunderplug's symbols to exist in a trace at all:

* interpretation-time lookasides that route ``torch.ops.aten`` calls to ATen symbols;
* tensor-subclass op symbols (``TwoTensor.torch.mul``): listed first, it is asked first, so it
  keeps them whole through claiming (as a fusion executor) and then, in its fusion pass, replaces
  each by its unrolled ATen ops and lets the executors after it claim those. Autodiff therefore
  sees subclass ops, and executors see ATen ops.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import torch
from thunder.core.compile_data import get_compile_data
from thunder.core.jit_ext import get_methods_properties, record_source_loc_in_symbol_header
from thunder.core.proxies import TensorProxy, variableify
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import TraceCtx, from_trace, tracectx
from thunder.core.transform_common import cse_single_bsym, dce, replace_redundant_inputs
from thunder.extend import FusionExecutor, TemporaryExecutor

from thunderplug.plugin_api import settings
from thunderplug.plugin_api.specs import AtenOp
from thunderplug.subclass.autodiff import vjp_of
from thunderplug.subclass.distributed import distributed_lookasides
from thunderplug.subclass.gradient_layouts import with_eager_gradient_layouts
from thunderplug.subclass.symbols import unrolled_op_symbol
from thunderplug.subclass.values import (
    SubclassLayout,
    SubclassTensorProxy,
    is_subclass_op,
    subclass_flatten,
    subclass_unflatten,
)
from thunderplug.thunder_compat import transform_for_operator_executor_execution
from thunderplug.tracing.aten import AtenTable

CORE_EXECUTOR_NAME = "thunderplug"


class ThunderplugExecutor(FusionExecutor):
    def __init__(self, aten_ops: list[AtenOp], version: str):
        super().__init__(CORE_EXECUTOR_NAME, version=version)
        self.aten = AtenTable(aten_ops, backward_symbol=_torch_autograd_backward)
        self._lookasides.update(self.aten.lookasides())
        self._lookasides.update(distributed_lookasides(self.aten))
        self._lookasides.update(_opaque_proxy_methods())

    def can_execute(self, bsym: BoundSymbol) -> bool:
        return False

    def can_fuse(self, bsym: BoundSymbol) -> bool:
        """Keep subclass ops whole for unrolling, unless another executor claims the op itself."""
        if not is_subclass_op(bsym.sym):
            return False
        compile_data = get_compile_data()
        others = compile_data.executors_list if compile_data is not None else ()
        return not any(ex is not self and ex.can_execute(bsym) for ex in others)

    def fusion_pass(self, trace: TraceCtx) -> TraceCtx:
        if not any(_needs_unrolling(bsym) for bsym in trace.bound_symbols):
            return trace
        compile_data = get_compile_data()
        others = [ex for ex in compile_data.executors_list if ex is not self]
        before_unrolling = None
        # An autograd.Function inlined by thunder's ad-hoc executor can expose more subclass ops
        # (and nested autograd.Functions); repeat until none is left.
        while any(_needs_unrolling(bsym) for bsym in trace.bound_symbols):
            unrolled = from_trace(trace)
            retyped = _retrace_stale(trace.bound_symbols, unrolled)
            if before_unrolling is None:
                before_unrolling = (retyped, unrolled)  # the backward's subclass ops, for gradient_layouts
            unrolled.bound_symbols = _fold_round_trips([b for bsym in retyped for b in _unroll(bsym)])
            trace = transform_for_operator_executor_execution(_cse(unrolled, self.aten), others)
        trace = dce(trace)
        if before_unrolling is not None and not any(_inlinable(b) for b in before_unrolling[0]):
            trace = with_eager_gradient_layouts(trace, *before_unrolling, compile_data, _retrace_stale)
        return trace


def _torch_autograd_backward(display: str, overload: Any) -> Symbol:
    """The backward of an ATen op no plugin registered: torch's autograd of the op, unrolled on fakes."""
    return unrolled_op_symbol(f"{display}.backward", vjp_of(overload), differentiable=False)


def _cse(trace: TraceCtx, table: AtenTable) -> TraceCtx:
    """Common subexpressions of the unrolled ops, removed before executors claim them: each
    subclass op unrolls on its own, so the same cast or scale (torchao's float8 casts of a weight
    used twice) appears once per use. Ops with random or side effects are never merged. A view
    of a value to its own shape is the value itself, so that a cast of ``x`` and a cast of
    ``x.reshape(x.shape)`` (torchao's backward re-shapes what its forward cast) are one."""
    rhs_to_bsym: dict = {}
    redundant: dict = {}
    kept = []
    returned = {variableify(p) for p in trace.bound_symbols[-1].flat_proxy_args} if trace.bound_symbols else set()
    for bsym in trace.bound_symbols:
        if _same_shape_view(bsym, table) and variableify(bsym.output) not in returned:
            source = bsym.args[0]
            redundant[variableify(bsym.output)] = redundant.get(variableify(source), source)
        elif table.has_effects(bsym):
            kept.append(_swapped(bsym, redundant, skip_output=True))
        elif _reads(bsym, redundant):
            if (new := cse_single_bsym(redundant, rhs_to_bsym, bsym)) is not None:
                kept.append(new)
        else:  # nothing to swap (thunder would still copy the whole subsymbol tree): an empty map
            found: dict = {}
            if (new := cse_single_bsym(found, rhs_to_bsym, bsym)) is not None:
                kept.append(new)
            redundant.update(found)
    result = from_trace(trace)
    result.bound_symbols = replace_redundant_inputs(redundant, kept)
    return result


#: ATen views that only re-shape; one to the shape its input already has is that input
_RESHAPES = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default, torch.ops.aten.reshape.default)


def _same_shape_view(bsym: BoundSymbol, table: AtenTable) -> bool:
    if table.overloads_by_id.get(bsym.sym.id) not in _RESHAPES:
        return False
    source, out = bsym.args[0], bsym.output
    return isinstance(source, TensorProxy) and isinstance(out, TensorProxy) and tuple(out.shape) == tuple(source.shape)


def _reads(bsym: BoundSymbol, swap: dict) -> bool:
    """Whether ``bsym`` reads a proxy of ``swap`` (its subsymbols read only its arguments and what
    they compute themselves)."""
    return any(variableify(p) in swap for p in bsym.flat_proxy_args)


def _swapped(bsym: BoundSymbol, swap: dict, *, skip_output: bool = False) -> BoundSymbol:
    """``bsym`` with the proxies of ``swap`` replaced, itself when it reads none of them (thunder's
    ``from_bsym_swap_proxies`` copies the whole subsymbol tree either way)."""
    writes = not skip_output and any(variableify(o) in swap for o in bsym.flat_proxy_outs)
    if not swap or not (writes or _reads(bsym, swap)):
        return bsym
    return bsym.from_bsym_swap_proxies(swap, skip_output=skip_output)


def _opaque_proxy_methods() -> dict:
    """SubclassTensorProxy's own methods run as Python, not through thunder's interpreter (as
    thunder does for TensorProxy's): ``x._data`` must read the proxy, not trace its lookup."""
    own = {value for value in vars(SubclassTensorProxy).values() if callable(value)}
    return {
        fn: record_source_loc_in_symbol_header(lookaside)
        for fn, lookaside in get_methods_properties(SubclassTensorProxy)
        if fn in own or getattr(fn, "__qualname__", "").startswith("SubclassTensorProxy.")
    }


def _needs_unrolling(bsym: BoundSymbol) -> bool:
    """A subclass op, or an autograd.Function symbol that thunder left un-inlined (nested ones)."""
    return is_subclass_op(bsym.sym) or _inlinable(bsym)


def _inlinable(bsym: BoundSymbol) -> bool:
    executor = bsym.sym.executor
    return isinstance(executor, TemporaryExecutor) and executor.get_execution_transform(bsym) is not None


def _unroll(bsym: BoundSymbol) -> list[BoundSymbol]:
    if not is_subclass_op(bsym.sym):
        return [bsym]
    result = []
    for sub in bsym.subsymbols:
        sub.tags.update(bsym.tags)  # keep e.g. the BACKWARD tag
        result.extend(_unroll(sub))
    return result


def _retrace_stale(bsyms: list[BoundSymbol], trace: TraceCtx, swap: dict | None = None) -> list[BoundSymbol]:
    """Re-decompose subclass ops whose argument types (or DTensor placements) changed after autodiff.

    A gradient rule traces its backward assuming the gradient of a subclass value has that value's
    type; autodiff then substitutes the gradient really computed, which eager PyTorch may make a
    plain tensor (a float8 value used by a matmul gets a plain gradient). Such ops are traced again
    for the real types, and their new outputs replace the old ones downstream.

    ``swap`` (updated in place) maps proxies to their replacements, e.g. cotangents to ones of other
    layouts (``gradient_layouts``).
    """
    swap = {} if swap is None else swap
    result = []
    for bsym in bsyms:
        bsym = _swapped(bsym, swap)
        if is_subclass_op(bsym.sym) and _has_stale_flatten(bsym):
            with tracectx(trace):
                trace.push_scope([])
                bsym.sym(*bsym.args, **bsym.kwargs)
                (fresh,) = trace.pop_scope()
            fresh.tags.update(bsym.tags)
            for old, new in zip(bsym.flat_proxy_outs, fresh.flat_proxy_outs):
                swap[variableify(old)] = new
            bsym = fresh
        result.append(bsym)
    return result


def _has_stale_flatten(bsym: BoundSymbol) -> bool:
    """A ``subclass_flatten`` of the op was traced for another value than its argument now is.

    * Another nesting of types: a plain gradient where a subclass was assumed, or, for nested
      subclasses, another inner type (eager gives a DTensor gradient a Float8TrainingTensor local
      tensor when a float8 cast's backward produced it, a plain one otherwise). Its outputs would
      then be read as the wrong types at run time.
    * The same types with another context that the subclass converts between (a DTensor gradient
      with other placements than the forward value it is the gradient of). ``subclass_flatten``
      would redistribute it to the assumed placements, and the op would then propagate those: eager
      autograd converts nothing, each backward op takes the gradient as the previous one made it,
      so the gradients that reach the inputs have eager's placements only if the op is traced for
      the real ones.
    """
    return any(
        sub.sym == subclass_flatten
        and (_structure(sub.args[0]) != _flattened_structure(sub) or _other_context(sub.args[0], sub.args[1]))
        for sub in bsym.subsymbols
    )


def _other_context(value: Any, layout: SubclassLayout) -> bool:
    """Whether ``value`` is placed otherwise than ``layout`` says (inner values are flattened by
    their own ``subclass_flatten``, checked there)."""
    if not isinstance(value, SubclassTensorProxy):
        return False
    return not layout.places_like(value.layout)


def _structure(value: Any) -> Any:
    """A value's nesting of subclass types, down to its plain tensors (contexts left out: those
    are compared by :func:`_other_context`)."""
    if not isinstance(value, SubclassTensorProxy):
        return None
    return (value.layout.cls, value.layout.attrs, tuple(_structure(inner) for inner in value.inner.values()))


def _flattened_structure(flatten: BoundSymbol) -> Any:
    """The structure a ``subclass_flatten`` was traced for: its layout, and what its outputs are."""
    layout = flatten.args[1]
    return (layout.cls, layout.attrs, tuple(_structure(out) for out in flatten.flat_proxy_outs))


def _fold_round_trips(bsyms: list[BoundSymbol]) -> list[BoundSymbol]:
    """``t = subclass_flatten(subclass_unflatten(layout, *inner))`` -> use ``inner`` directly, so no
    subclass object is built at run time just to be taken apart again."""
    built_from: dict = {}  # variable of an unflatten output -> its inner proxies
    layouts: dict = {}  # ... -> the layout it was built with
    swap: dict = {}
    result = []
    for bsym in bsyms:
        bsym = _swapped(bsym, swap)
        if bsym.sym == subclass_unflatten:
            built_from[variableify(bsym.output)] = bsym.args[1:]
            layouts[variableify(bsym.output)] = bsym.args[0]
        elif (
            bsym.sym == subclass_flatten
            and variableify(bsym.args[0]) in built_from
            and bsym.args[1].same_as(layouts[variableify(bsym.args[0])])  # else coerced at run time
        ):
            for out, inner in zip(bsym.output, built_from[variableify(bsym.args[0])]):
                swap[variableify(out)] = inner
            continue
        result.append(bsym)
    return result


_core_of: weakref.WeakKeyDictionary[Any, ThunderplugExecutor | None] = weakref.WeakKeyDictionary()


def core_executor_of(compile_data: Any) -> ThunderplugExecutor | None:
    """The thunderplug executor a jitted function's ``CompileData`` lists (``discover()``'s list), if any.
    Asked for every call the interpreter makes, so found once per jitted function: its executors are fixed
    when ``thunder.jit`` is called."""
    try:
        return _core_of[compile_data]
    except TypeError:  # not weakly referenceable (None: a module thunder did not jit): not kept
        return _listed_core(compile_data)
    except KeyError:
        found = _core_of[compile_data] = _listed_core(compile_data)
        return found


def _listed_core(compile_data: Any) -> ThunderplugExecutor | None:
    executors = getattr(compile_data, "executors_list", ())
    return next((ex for ex in executors if isinstance(ex, ThunderplugExecutor)), None)


def uses_core_executor(compile_data: Any) -> bool:
    """Whether a jitted function's ``CompileData`` lists a thunderplug executor (``discover()``'s list)."""
    return core_executor_of(compile_data) is not None


def active_core_executor() -> ThunderplugExecutor | None:
    """The thunderplug executor of the compilation in progress, if ``discover()``'s list is used."""
    compile_data = get_compile_data()
    return None if compile_data is None else core_executor_of(compile_data)


def drop_kept_decompositions(traces: list[TraceCtx]) -> None:
    """After a compilation, the traces thunder keeps (``thunder.last_traces``) hold the subclass ops
    of the traces before unrolling with their ATen ops' whole decompositions (prims): most of what a
    float8 model's compilation keeps, and nothing runs them. The ATen ops under each subclass op keep
    their arguments and outputs but lose their own subsymbols. Bound symbols are replaced by copies,
    never changed: the recorded replays and the final traces share them. A top-level bound symbol
    shared by several traces stays shared; only those are remembered, so that no large temporary
    table is freed just before the step (glibc would then serve the step's tensors from its heap
    instead of fresh pages: a larger peak). ``THUNDERPLUG_KEEP_DECOMPOSITIONS=1`` keeps everything."""
    if settings.flag(os.environ, settings.KEEP_DECOMPOSITIONS):
        return
    copies: dict[int, tuple[BoundSymbol, BoundSymbol]] = {}  # id -> (original, kept alive: ids stay unique; copy)
    for trace in traces:
        kept = []
        for bsym in trace.bound_symbols:
            found = copies.get(id(bsym))
            if found is None:
                found = copies[id(bsym)] = (bsym, _without_decompositions(bsym))
            kept.append(found[1])
        if any(new is not old for new, old in zip(kept, trace.bound_symbols)):
            trace.bound_symbols = kept


def _without_decompositions(bsym: BoundSymbol) -> BoundSymbol:
    if is_subclass_op(bsym.sym):
        subsymbols = [sub.from_bsym(subsymbols=[]) if sub.subsymbols else sub for sub in bsym.subsymbols]
    else:
        subsymbols = [_without_decompositions(sub) for sub in bsym.subsymbols]
    changed = any(new is not old for new, old in zip(subsymbols, bsym.subsymbols))
    return bsym.from_bsym(subsymbols=subsymbols) if changed else bsym
