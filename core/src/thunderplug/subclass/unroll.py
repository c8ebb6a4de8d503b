"""Unrolling a torch op on subclass values into ATen ops: run it on FakeTensor instances of the
subclasses under ``make_fx``, then replay the graph with thunderplug's ATen symbols.

Output metadata comes from that fake run, never from guessing. The graph of one op depends only
on its arguments' metadata (shapes, dtypes, devices, requires_grad, subclass layouts, constants),
so it is traced once per metadata key and process, and replayed for every call. The key holds
the torch state the trace depends on too (``trace_state``: the op's autocast, grad mode, default
dtype, deterministic mode, backend flags); the graph is traced under that autocast and grad mode,
and replayed with autocast off (its casts are in it).

thunder proxies carry no strides, so the core notes the memory layout of the tensors it knows
(subclass inputs' inner tensors, the outputs of unrolled graphs: ``MXTensor.t()`` transposes its
inner data, permutations such as ``weight.t()``) on their proxies, and fakes take it; other
proxies, such as cotangents, are traced as contiguous. Graphs that depend on their inputs'
strides (``aten.view``, ``_scaled_mm`` layouts) coerce their plain inputs to the traced layouts
first: a no-op at run time where the layout is as traced, a copy elsewhere (a transposed
gradient). AOTAutograd coerces runtime tangents the same way.
"""

from __future__ import annotations

import dataclasses
import operator
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import thunder.torch as ltorch
import torch
import torch.utils._pytree as torch_pytree
from thunder.core.proxies import TensorProxy
from thunder.core.pytree import tree_flatten, tree_unflatten
from thunder.core.trace import get_tracectx
from thunder.transforms import autocast as thunder_autocast
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.fx.experimental.proxy_tensor import make_fx
from torch.multiprocessing.reductions import StorageWeakRef

from thunderplug.caching import dynamic_sizes
from thunderplug.subclass import replay
from thunderplug.subclass.plan import OutputPlan, PlainOutput, build, plan_of, tensor_leaves
from thunderplug.subclass.values import SubclassTensorProxy, flatten_to_leaves
from thunderplug.tracing.aten import AtenTable, data_dependent, user_location
from thunderplug.tracing.compilation import current_record
from thunderplug.tracing.fake import (
    fake_like,
    fake_mode,
    frozen,
    hashable_or_none,
    memory_order_of,
    set_memory_order,
    tensor_memory_order,
    to_fake,
    to_torch_value,
    value_key,
)
from thunderplug.tracing.trace_state import NO_AUTOCAST, AutocastState, ambient_key, applied_autocast, grad_enabled
from thunderplug.tracing.trace_state import without_autocast as torch_without_autocast


class SubclassDispatchError(RuntimeError):
    """A torch op on a tensor subclass could not be unrolled into ATen ops."""


@dataclass(frozen=True)
class UnrolledOp:
    """One traced op: its ATen graph over the plain leaves of its arguments, and its outputs, with
    the memory orders (``fake.memory_order``) of the graph's input and output leaves."""

    graph: torch.fx.GraphModule
    out_spec: Any
    plans: tuple[OutputPlan, ...]
    stride_sensitive: bool
    in_orders: tuple[tuple[int, ...] | None, ...]
    out_orders: tuple[tuple[int, ...] | None, ...]
    #: whether an output shares memory with the first tensor argument (``x[0]``, ``x.t()``): thunder's
    #: alias updates must then see an in-place op on the output as one on that argument
    views_first_input: bool = False


#: ATen ops whose result or validity depends on their inputs' strides.
_STRIDE_SENSITIVE = {
    torch.ops.aten.view.default,
    torch.ops.aten._unsafe_view.default,
    torch.ops.aten.as_strided.default,
    torch.ops.aten._reshape_alias.default,
    torch.ops.aten._scaled_mm.default,
}

_graphs: weakref.WeakKeyDictionary[AtenTable, dict[Any, UnrolledOp]] = weakref.WeakKeyDictionary()
_lock = threading.RLock()  # make_fx and the graph cache are shared by every thread


def call_key(display: str, tensors: list[TensorProxy]) -> tuple[str, tuple[str, ...]]:
    """How an op call is found again in the compilation record (its inputs' names)."""
    return (display, tuple(t.name for t in tensors))


def unroll(
    display: str,
    torch_fn: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    autocast: AutocastState = NO_AUTOCAST,
    on_view: Callable[[], None] | None = None,
) -> Any:
    """Trace ``torch_fn(*args, **kwargs)`` under ``autocast`` on fakes (or reuse the graph traced
    for the same metadata and state) and record its ATen ops in the current trace; return the
    outputs as proxies. ``on_view`` is called when an output views the first tensor argument."""
    table = _current_table(display)
    flat, spec = tree_flatten((args, kwargs))
    tensors = [x for x in flat if isinstance(x, TensorProxy)]
    location = user_location()
    record = current_record()
    if record is not None and location:  # interpreting the user's program
        record.source_locations[call_key(display, tensors)] = location
        record.note_alive(get_tracectx())
    unrolled = _unrolled(display, torch_fn, table, (args, kwargs), flat, spec, autocast)
    if on_view is not None and unrolled.views_first_input:
        on_view()
    leaves = [leaf for t in tensors for leaf in flatten_to_leaves(t)]
    if unrolled.stride_sensitive:
        leaves = [_in_layout(leaf, order) for leaf, order in zip(leaves, unrolled.in_orders)]
    replayed = _replay(unrolled.graph, leaves, table, display)
    for leaf, order in zip(replayed, unrolled.out_orders):
        if isinstance(leaf, TensorProxy):
            set_memory_order(leaf, order)
    out_leaves = iter(replayed)
    outputs = [build(plan, out_leaves) for plan in unrolled.plans]
    return torch_pytree.tree_unflatten(outputs, unrolled.out_spec)


def traced(
    display: str, torch_fn: Callable[..., Any], args: tuple, kwargs: dict, autocast: AutocastState = NO_AUTOCAST
) -> UnrolledOp:
    """The graph and output plans of ``torch_fn`` on these arguments, recording nothing."""
    flat, spec = tree_flatten((args, kwargs))
    return _unrolled(display, torch_fn, _current_table(display), (args, kwargs), flat, spec, autocast)


def _current_table(display: str) -> AtenTable:
    """The ATen table of the ``discover()`` list the compilation in progress uses."""
    from thunder.core.compile_data import get_compile_data

    compile_data = get_compile_data()
    for executor in compile_data.executors_list if compile_data is not None else ():
        table = getattr(executor, "aten", None)
        if isinstance(table, AtenTable):
            return table
    raise SubclassDispatchError(f"{display} was traced outside a compilation with thunderplug.discover()'s executors")


def _unrolled(
    display: str,
    torch_fn: Callable[..., Any],
    table: AtenTable,
    call: tuple[tuple, dict],
    flat: list,
    spec: Any,
    autocast: AutocastState,
) -> UnrolledOp:
    key = _metadata_key(display, torch_fn, call, flat, autocast)
    state = _tracked(flat)
    with _lock:
        if state is None:
            cache = _graphs.setdefault(table, {})
        else:  # traced on symbolic sizes: the graph holds this compilation's symbols
            cache = dynamic_sizes.compilation_cache(state, "unrolled graphs")
            key = None if key is None else (table, key)
        if key is not None and key in cache:
            return cache[key]
        unrolled = _trace(display, torch_fn, table, flat, spec, autocast, state)
        if key is not None:
            cache[key] = unrolled
        return unrolled


def _tracked(flat: list) -> dynamic_sizes.Symbolic | None:
    """The tracked compilation in progress where a tensor argument's shape holds its symbolic sizes."""
    state = dynamic_sizes.active()
    if state is None or not any(dynamic_sizes.tracked(x) for x in flat if isinstance(x, TensorProxy)):
        return None
    return state


def _trace(
    display: str,
    torch_fn: Callable[..., Any],
    table: AtenTable,
    flat: list,
    spec: Any,
    autocast: AutocastState,
    state: dynamic_sizes.Symbolic | None = None,
) -> UnrolledOp:
    """The graph of ``torch_fn`` on fakes of the arguments. In a tracked compilation (``state``), on fakes
    with its symbolic sizes, so that the graph computes its sizes from its inputs' and one trace serves
    every size (torch's guards go to the compilation's ShapeEnv, checked at each re-specialization);
    where that fails, or the graph's outputs are not plain tensors or it computes with sizes in a way the
    replay does not know, the sizes are specialized and the graph traced for them."""
    if state is not None:
        try:
            unrolled = _trace_on_fakes(display, torch_fn, table, flat, spec, autocast, state)
        except Exception:  # noqa: BLE001 - traced again for this call's sizes, where torch's error stands
            unrolled = None
        if unrolled is not None and _replayable(unrolled):
            return unrolled
        why = f"{display} is not traced on symbolic sizes"
        for x in flat:
            for size in x._shape if isinstance(x, TensorProxy) else ():
                if isinstance(size, dynamic_sizes.SizeInt):
                    size.specialize(why)
    return _trace_on_fakes(display, torch_fn, table, flat, spec, autocast, None)


def _replayable(unrolled: UnrolledOp) -> bool:
    """Whether a graph traced on symbolic sizes replays with them: plain tensor outputs (a subclass layout or
    a constant would hold torch's symbols) and only ATen ops, ``getitem`` and :data:`_SIZE_OPS`."""
    if not all(isinstance(plan, PlainOutput) for plan in unrolled.plans):
        return False
    return all(
        node.op != "call_function"
        or node.target in _SIZE_OPS
        or node.target is operator.getitem
        or (isinstance(node.target, torch._ops.OpOverload) and node.target not in _SYMBOLIC_OPS)
        for node in unrolled.graph.graph.nodes
    )


def _trace_on_fakes(
    display: str,
    torch_fn: Callable[..., Any],
    table: AtenTable,
    flat: list,
    spec: Any,
    autocast: AutocastState,
    state: dynamic_sizes.Symbolic | None,
) -> UnrolledOp:
    leaves = [leaf for x in flat if isinstance(x, TensorProxy) for leaf in _proxy_leaves(x)]
    first = next((x for x in flat if isinstance(x, TensorProxy)), None)
    first_count = len(_proxy_leaves(first)) if first is not None else 0
    found: dict[str, Any] = {}

    def on_fakes(*fake_leaves: torch.Tensor) -> list[torch.Tensor]:
        remaining = iter(fake_leaves)
        fake_flat = [_rebuild_fake(x, remaining) if isinstance(x, TensorProxy) else as_fake(x) for x in flat]
        fake_args, fake_kwargs = tree_unflatten(fake_flat, spec)
        result = torch_fn(*fake_args, **fake_kwargs)
        out_flat, found["out_spec"] = torch_pytree.tree_flatten(result)
        found["plans"] = tuple(plan_of(o) for o in out_flat)
        out_leaves = [leaf for o in out_flat if isinstance(o, torch.Tensor) for leaf in tensor_leaves(o)]
        found["out_orders"] = tuple(tensor_memory_order(t) for t in out_leaves)
        first_storages = {StorageWeakRef(t.untyped_storage()) for t in fake_leaves[:first_count]}
        found["views"] = any(StorageWeakRef(t.untyped_storage()) in first_storages for t in out_leaves)
        return out_leaves

    if state is None:
        mode, as_fake, fake_of = fake_mode(), to_fake, fake_like
    else:
        mode = dynamic_sizes.fake_mode_of(state)

        def as_fake(x: Any) -> Any:
            return to_fake(dynamic_sizes.symbolic_value(x))

        def fake_of(leaf: TensorProxy) -> torch.Tensor:
            return dynamic_sizes.symbolic_fake(
                leaf, memory_order_of(leaf), to_torch_value(leaf.device), to_torch_value(leaf.dtype)
            )

    try:
        with mode, applied_autocast(autocast), torch.set_grad_enabled(grad_enabled()):
            graph = make_fx(on_fakes, decomposition_table=table.decompositions)(*[fake_of(leaf) for leaf in leaves])
    except (DynamicOutputShapeException, DataDependentOutputException) as error:
        raise data_dependent(display) from error  # under discover(), the graph breaks there (wiring.graph_breaks)
    except Exception as error:
        raise SubclassDispatchError(
            f"{display} failed in the subclass's __torch_dispatch__{user_location()}: {error}"
        ) from error
    sensitive = any(node.op == "call_function" and node.target in _STRIDE_SENSITIVE for node in graph.graph.nodes)
    in_orders = tuple(memory_order_of(leaf) for leaf in leaves)
    return UnrolledOp(
        graph, found["out_spec"], found["plans"], sensitive, in_orders, found["out_orders"], found["views"]
    )


def _in_layout(leaf: TensorProxy, order: tuple[int, ...] | None) -> TensorProxy:
    """``leaf`` with the memory layout its graph was traced for (views and a no-op ``contiguous``
    where it has it already)."""
    if order is None:
        return ltorch.contiguous(leaf)
    inverse = tuple(sorted(range(len(order)), key=order.__getitem__))
    return ltorch.permute(ltorch.contiguous(ltorch.permute(leaf, order)), inverse)


def _proxy_leaves(proxy: TensorProxy) -> list[TensorProxy]:
    """The plain proxies of a value without recording anything (for tracing on fakes)."""
    if isinstance(proxy, SubclassTensorProxy):
        return [leaf for inner in proxy.inner.values() for leaf in _proxy_leaves(inner)]
    return [proxy]


def _rebuild_fake(proxy: TensorProxy, fake_leaves: Iterator[torch.Tensor]) -> torch.Tensor:
    if isinstance(proxy, SubclassTensorProxy):
        return proxy.layout.unflatten({name: _rebuild_fake(inner, fake_leaves) for name, inner in proxy.inner.items()})
    return next(fake_leaves)


# -- the cache key: everything the traced graph depends on -------------------------------------


def _metadata_key(
    display: str, torch_fn: Callable[..., Any], call: tuple[tuple, dict], flat: list, autocast: AutocastState
) -> Any:
    """A hashable key of the call's metadata and the torch state it is traced in, or ``None`` when
    some constant cannot be hashed.

    Built from the arguments themselves, not from their pytree flattening: thunder's pytree
    flattens a dataclass only once some pass has registered its type (``tree_flatten_with_dataclass``),
    so the same call (torchao's ``Float8LinearConfig`` argument) is flattened one way while thunder
    interprets the function and another way when autodiff re-emits it, and would be traced twice.
    The tensors of the flattening (the graph's inputs, in order) are part of the key too."""
    tensors = tuple(_value_key(x) for x in flat if isinstance(x, TensorProxy))
    return hashable_or_none(lambda: (display, torch_fn, _call_key(call), tensors, autocast, ambient_key()))


def _call_key(value: Any) -> Any:
    """Containers, dataclasses and named tuples by their type and items, the rest by ``_value_key``."""
    if isinstance(value, TensorProxy):
        return _value_key(value)
    if isinstance(value, dynamic_sizes.SizeInt):
        return dynamic_sizes.size_key(value)
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_call_key(item) for item in value))
    if isinstance(value, dict):
        return (dict, tuple((key, _call_key(item)) for key, item in value.items()))
    if isinstance(value, slice):
        return (slice, _call_key(value.start), _call_key(value.stop), _call_key(value.step))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return (type(value), tuple((field.name, _call_key(getattr(value, field.name))) for field in fields))
    return _value_key(value)


def _value_key(value: Any) -> Any:
    """``fake.value_key``, and a subclass value by its layout and its inner tensors' keys."""
    if isinstance(value, SubclassTensorProxy):
        layout = value.layout
        inner = tuple(_value_key(p) for p in value.inner.values())
        ctx = frozen(layout.ctx)
        return ("subclass", layout.cls, layout.attrs, ctx, layout.outer_size, layout.outer_stride, inner)
    if isinstance(value, TensorProxy) and dynamic_sizes.tracked(value):
        return dynamic_sizes.symbolic_value_key(value)
    return value_key(value)


# -- replaying the graph as thunder symbols ------------------------------------------------------


def _is_inplace(overload: torch._ops.OpOverload) -> bool:
    return overload._opname.endswith("_") and not overload._opname.startswith("_")


def _functional(overload: torch._ops.OpOverload) -> torch._ops.OpOverload:
    packet = getattr(torch.ops.aten, overload._opname[:-1])
    return getattr(packet, overload._overloadname)


def _plain_containers(value: Any) -> Any:
    """fx's immutable_list/immutable_dict as plain list/dict: thunder prints only the built-in kinds."""
    if isinstance(value, dict):
        return {key: _plain_containers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain_containers(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain_containers(item) for item in value)
    return value


def _replay(graph: torch.fx.GraphModule, leaves: list[TensorProxy], table: AtenTable, display: str) -> list[Any]:
    """Record the graph's ATen calls on ``leaves`` in the current trace scope; return its outputs.
    A graph replayed before on inputs of the same metadata has its bound symbols copied
    (``replay``), not its ATen symbols called again. Autocast is off (torch's and thunder's
    rules): the graph's casts are in it, and thunder runs its ATen ops under ``no_autocast``."""
    # looked up per call: thunderplug's patches make thunder's flag per thread
    with torch_without_autocast(), thunder_autocast.disable_autocast():
        return _replay_below_autocast(graph, leaves, table, display)


def _replay_below_autocast(
    graph: torch.fx.GraphModule, leaves: list[TensorProxy], table: AtenTable, display: str
) -> list[Any]:
    trace = get_tracectx()
    scope = trace.peek_scope() if trace is not None else None
    key = replay.replay_key(leaves)
    recording = replay.recorded(graph, key)
    if recording is not None and scope is not None:
        bsyms, outputs = replay.copy_into(recording, trace, leaves)
        scope.extend(bsyms)
        return outputs
    if scope is None:
        return _call_graph(graph, leaves, table, display)
    recorded: list = []
    trace.push_scope(recorded)
    try:
        outputs = _call_graph(graph, leaves, table, display)
    finally:
        trace.pop_scope()
    scope.extend(recorded)
    replay.record(graph, key, leaves, recorded, outputs)
    return outputs


def _call_graph(graph: torch.fx.GraphModule, leaves: list[TensorProxy], table: AtenTable, display: str) -> list[Any]:
    env: dict[torch.fx.Node, Any] = {}
    inputs = iter(leaves)
    for node in graph.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(inputs)
        elif node.op == "call_function":
            args, kwargs = _plain_containers(torch.fx.node.map_arg((node.args, node.kwargs), env.__getitem__))
            size = _SIZE_OPS.get(node.target)
            if size is not None:  # a graph traced on symbolic sizes computes with its inputs' sizes
                env[node] = size(*args, **kwargs)
            elif isinstance(node.target, torch._ops.OpOverload) and _is_inplace(node.target):
                mutated = node.args[0]
                if mutated.op == "placeholder":
                    raise SubclassDispatchError(
                        f"{display}: the subclass's dispatch mutates an input in place ({node.target})"
                        f"{user_location()}; thunderplug does not support in-place updates of subclass inner tensors"
                    )
                # dispatch code mutating its own temporary (torchao's addmm does ``out.add_(bias)``):
                # compute the out-of-place op and let every later use of the temporary see the result
                env[node] = env[mutated] = table.call(_functional(node.target), *args, **kwargs)
            elif isinstance(node.target, torch._ops.OpOverload):
                env[node] = table.call_traced(node.target, node.meta.get("val"), *args, **kwargs)
            elif node.target is operator.getitem:
                env[node] = args[0][args[1]]
            else:
                raise SubclassDispatchError(
                    f"{display}: the subclass's dispatch produced {node.target}, which is not an ATen op"
                    f"{user_location()}"
                )
        elif node.op == "get_attr":
            env[node] = _constant(getattr(graph, node.target), display)
        elif node.op == "output":
            return list(torch.fx.node.map_arg(node.args[0], env.__getitem__))
        else:
            raise SubclassDispatchError(
                f"{display}: the subclass's dispatch produced a {node.op} node ({node.target}){user_location()}; "
                "thunderplug replays only ATen calls"
            )
    raise AssertionError("fx graph without output")


#: what a graph traced on symbolic sizes computes its sizes with: read from the replayed proxies, and
#: Python's arithmetic, which keeps SizeInts symbolic
_SIZE_OPS: dict[Any, Callable[..., Any]] = {
    torch.ops.aten.sym_size.int: lambda t, dim: t.shape[dim],
    torch.ops.aten.sym_numel.default: lambda t: t.numel,
    **{getattr(operator, name): getattr(operator, name) for name in (
        "add", "sub", "mul", "floordiv", "mod", "neg", "eq", "ne", "lt", "le", "gt", "ge", "pos", "abs")},
}


#: ATen ops on sizes the replay does not compute (:func:`_replayable`)
_SYMBOLIC_OPS = frozenset((torch.ops.aten.sym_stride.int, torch.ops.aten.sym_storage_offset.default))


#: the most elements a tensor constant of a dispatch may have to be written into the trace
_MAX_CONSTANT_NUMEL = 4096


def _constant(value: Any, display: str) -> Any:
    """A tensor the dispatch built from Python data (torchao's ``torch.tensor(bits, dtype=torch.int32)``),
    which make_fx keeps as a graph constant: recorded as ``torch.tensor(values)`` in the trace."""
    if not isinstance(value, torch.Tensor) or value.numel() > _MAX_CONSTANT_NUMEL:
        raise SubclassDispatchError(
            f"{display}: the subclass's dispatch uses a constant {type(value).__name__} "
            f"{tuple(getattr(value, 'shape', ()))} thunderplug cannot write into a trace{user_location()}"
        )
    return ltorch.tensor(value.tolist(), device=value.device, dtype=value.dtype)
