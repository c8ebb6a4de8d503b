"""A function with an op whose output shape depends on values (``x[mask]``, ``nonzero``, ``masked_select``,
``unique``) runs as ``torch.compile`` runs it: with a graph break at the op.

thunder 0.2.6 traces have one static shape per tensor, so such an op cannot be in a trace; Dynamo breaks the
graph there and runs the op eagerly. When tracing a ``discover()`` compilation raises
:class:`~thunderplug.tracing.aten.DataDependentShapeError`, the compilation runs its function through Dynamo
from then on: each graph Dynamo captures is compiled whole by ``thunder.jit`` with the compilation's own options
(discover()'s executors), so the code around the op is thunder traces as before, the op and the Python between
the graphs run eagerly, and torch's autograd joins the graphs' gradients across the break. A
``ThunderplugWarning`` names the op and the line once per compilation; ``explain`` shows the graphs' rows
(``thunder.last_traces`` of the function is ``[]``: it has no trace of its own; ``thunder.last_prologue_traces``
is the first graph's, the one that receives the function's inputs: what checks them, as thunder's own tests read
it).

A graph Dynamo captured with sizes known only at run time (``t.tolist()`` of an integer tensor: Dynamo reads each
value as an unbacked size, e.g. for ``torch.split``) is split around the nodes using them: thunder.jit compiles the
nodes before and after, and that region runs as in eager.

From the second count of selected elements on, Dynamo hands the graph after the break over with the count symbolic:
the tensor's size and a ``SymInt`` argument of it. thunder.jit would check that int by value (a compilation per
count), so the argument is dropped, or read from the tensor's shape where the graph uses it, and the dims Dynamo
made symbolic are tracked from the graph's first call (``caching.dynamic_sizes``): every later count re-specializes
the graph's trace (issue 44 item 3).

Not broken, the error stands: compilations with thunder ``transforms`` (they apply to one ThunderModule), the
graphs themselves (a data-dependent op Dynamo kept in a graph would break again forever), and a thunder symbol
jitted itself (``thunder.jit(ltorch.where)``, as thunder's own op tests do): a symbol runs only inside a trace, so
Dynamo could not run it.
"""

from __future__ import annotations

import copy
import operator
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import thunder
import torch
from thunder.core.symbol import Symbol
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.fx.passes.split_module import split_module

from thunderplug.caching import dynamic_sizes
from thunderplug.plugin_api.notices import ThunderplugWarning
from thunderplug.thunder_compat import jit_options
from thunderplug.tracing.aten import DataDependentShapeError
from thunderplug.tracing.compilation import record_for
from thunderplug.wiring.speedups import _closure_value
from thunderplug.wiring.thunderfx import jit_graph

#: compile option of the graphs' own compilations: they do not break again
OPTION = "thunderplug_graph_part"


class _Broken:
    """One compilation's function run through Dynamo; made at the first data-dependent op, kept after."""

    def __init__(self, compile_data: Any, error: DataDependentShapeError):
        record = record_for(compile_data)
        record.graph_break = f" {error.op}{error.location}"
        options = {**jit_options(compile_data), OPTION: True}
        parts = record.graph_parts

        def backend(graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
            graph, dropped = _sizes_read_from_tensors(graph)
            region = _data_dependent_region(graph)
            if region is None:
                compiled = jit_graph(graph, options)
                dynamic_sizes.mark_dynamic(thunder.compile_data(compiled), _symbolic_dims(graph))
                parts.append(compiled)
            else:
                compiled = _split_around(graph, region, options, parts)
            return _without_arguments(_eager_where_inputs_gain_grad(graph, compiled), dropped)

        self.run = _compiled(compile_data.fn, backend)
        self.parts = parts
        self.compile_data = weakref.ref(compile_data)

    def cache_entry(self, args: tuple, kwargs: dict, stats: Any) -> tuple[Any, list, tuple]:
        """What thunder's ``get_computation_and_inputs`` returns: an entry whose computation runs the call
        through Dynamo (no thunder backward: the graphs' own autograd Functions carry the gradients)."""

        def computation(args: tuple, kwargs: dict) -> tuple[Any]:
            result = self.run(*args, **kwargs)
            compile_data = self.compile_data()
            if compile_data is not None:  # thunder's jitted function sets this grad mode after the call
                compile_data.is_grad_enabled = torch.is_grad_enabled()
            if stats is not None and self.parts:
                stats.last_prologue_traces = thunder.last_prologue_traces(self.parts[0])
            return (result,)

        entry = thunder.CacheEntry(None, [], computation, [], _result, [], None, [], False)
        return entry, [args, kwargs], ()


def _sizes_read_from_tensors(graph: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, list[int]]:
    """Dynamo hands a graph after the break its symbolic sizes as ``SymInt`` arguments too (``s38`` beside the
    tensor of ``s38`` rows: the count of selected elements); thunder.jit checks an int argument by value, so each
    new count compiled the graph again. Each such argument the graph does not read is dropped; one it reads is read
    from the first tensor argument with that size in its shape (``x.size(d)``), where thunderplug's symbolic
    dimensions (``caching.dynamic_sizes``) track it. Returns the graph so changed (a copy: Dynamo calls the
    compiled graph with the arguments of the graph it handed over) and the positions of the arguments dropped
    (others stay, read as ints)."""
    if not any(isinstance(node.meta.get("example_value"), torch.SymInt) for node in _placeholders(graph)):
        return graph, []
    graph = torch.fx.GraphModule(graph, copy.deepcopy(graph.graph))
    placeholders = _placeholders(graph)
    dims = [(placeholders[position], d, expr) for position, d, expr in _tensor_symbolic_sizes(placeholders)]
    dropped = []
    for position, node in enumerate(placeholders):
        size = node.meta.get("example_value")
        if not isinstance(size, torch.SymInt):
            continue
        source = next(((tensor, d) for tensor, d, expr in dims if expr == size.node.expr), None)
        if node.users and source is None:
            continue
        if node.users:
            with graph.graph.inserting_after(placeholders[-1]):
                read = graph.graph.call_method("size", source)
            read.meta["example_value"] = size
            node.replace_all_uses_with(read)
        graph.graph.erase_node(node)
        dropped.append(position)
    graph.recompile()
    return graph, dropped


def _placeholders(graph: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [node for node in graph.graph.nodes if node.op == "placeholder"]


def _tensor_symbolic_sizes(placeholders: list[torch.fx.Node]) -> list[tuple[int, int, Any]]:
    """(argument position, dim, size expression) of each size Dynamo made symbolic in a tensor argument."""
    return [(position, d, size.node.expr) for position, node in enumerate(placeholders)
            if isinstance(value := node.meta.get("example_value"), torch.Tensor)
            for d, size in enumerate(value.shape) if isinstance(size, torch.SymInt)]


def _symbolic_dims(graph: torch.fx.GraphModule) -> set[tuple[int, int]]:
    """The (argument, dim) of ``graph``'s tensor arguments whose sizes Dynamo made symbolic."""
    return {(position, d) for position, d, _ in _tensor_symbolic_sizes(_placeholders(graph))}


def _without_arguments(compiled: Callable[..., Any], dropped: list[int]) -> Callable[..., Any]:
    """``compiled``, called by Dynamo with every argument of its graph, given those not at ``dropped``."""
    if not dropped:
        return compiled
    gone = set(dropped)

    def call(*args: Any) -> Any:
        return compiled(*(a for i, a in enumerate(args) if i not in gone))

    return call


def _requires_grad(value: Any) -> bool:
    return isinstance(value, torch.fx.Node) and bool(getattr(value.meta.get("example_value"), "requires_grad", False))


def _eager_where_inputs_gain_grad(graph: torch.fx.GraphModule, compiled: Callable[..., Any]) -> Callable[..., Any]:
    """``compiled``, except for a call where ``graph`` updates in place an input not requiring grad with a value
    that does (``inter[mask] = (x2[mask] - x1[mask]) * ...`` on ``inter = torch.zeros_like(x1)`` made before the
    break, in torchvision's ``_loss_inter_union``): in eager the input then requires grad and its later reads send
    gradients through the update, but a thunder trace updates only the input's memory, so the code after the graph
    sent none (generalized_box_iou_loss's box gradients 0.2 off). Such a call runs the graph as Dynamo captured it,
    eagerly."""
    placeholders = _placeholders(graph)
    updated = set()
    for node in graph.graph.nodes:
        if not node.args or node.args[0] not in placeholders:
            continue
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
        in_place = node.target is operator.setitem or (name.endswith("_") and not name.endswith("__"))
        if in_place and any(_requires_grad(a) for a in (*node.args[1:], *node.kwargs.values())):
            updated.add(placeholders.index(node.args[0]))
    if not updated:
        return compiled

    def call(*args: Any) -> Any:
        if torch.is_grad_enabled() and any(isinstance(args[i], torch.Tensor) and not args[i].requires_grad
                                           for i in updated):
            return graph(*args)
        return compiled(*args)

    return call


def _unbacked(node: torch.fx.Node) -> bool:
    """Whether ``node``'s value or an input's has a size or number known only at run time (an unbacked symbol:
    ``t.tolist()`` and ``t.item()`` read as sizes, the ``torch.split`` sizes made of them, their checks)."""
    return any(
        free_unbacked_symbols(n.meta.get("example_value")) for n in (node, *node.all_input_nodes)
    )


def _data_dependent_region(graph: torch.fx.GraphModule) -> tuple[int, int] | None:
    """The positions of the first and last node of ``graph`` that :func:`_unbacked` finds, or ``None``."""
    found = [i for i, node in enumerate(graph.graph.nodes) if node.op == "call_function" or node.op == "call_method"
             if _unbacked(node)]
    return (found[0], found[-1]) if found else None


def _split_around(graph: torch.fx.GraphModule, region: tuple[int, int], options: dict, parts: list) -> Callable:
    """``graph`` split in three: the nodes before ``region`` and after it compiled by ``thunder.jit`` (each a
    part of the compilation), the region itself, whose sizes depend on values (Dynamo captures ``t.tolist()`` of an
    integer tensor as unbacked sizes, which a thunder 0.2.6 trace cannot have), run as eager runs it."""
    positions = {node: i for i, node in enumerate(graph.graph.nodes)}
    first, last = region

    def partition(node: torch.fx.Node) -> int:
        i = positions[node]
        return 0 if i < first else 1 if i <= last else 2

    split = split_module(graph, None, partition, keep_original_order=True)
    for name, module in list(split.named_children()):
        if name != "submod_1":
            compiled = jit_graph(module, options)
            parts.append(compiled)
            setattr(split, name, compiled)
    return split


def _compiled(fn: Callable[..., Any], backend: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile(fn, backend=backend)``, leaving eager's torch.distributions validation default as it was:
    Dynamo's first ``torch.compile`` of the process turns it off for the whole process (its ``TorchPatcher``:
    ``Distribution.set_default_validate_args(False)``), so after a discover() graph break eager's own
    ``Normal(0.0, -1.0)`` no longer raised, and nor did the distributions in the graphs Dynamo runs."""
    validating = torch.distributions.Distribution._validate_args
    try:
        return torch.compile(fn, backend=backend)
    finally:
        torch.distributions.Distribution.set_default_validate_args(validating)


def _result(result: Any) -> Any:
    return result


def broken_at_data_dependent_ops(original: Callable[..., Any], uses_thunderplug: Callable[[Any], bool]) -> Callable:
    """thunder's ``_with_cache_info_ctx`` (it wraps each jitted function's ``get_computation_and_inputs``
    when ``thunder.jit`` is called), for ``discover()`` compilations running the function through Dynamo
    from the call whose tracing met an op with a data-dependent output shape."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        wrapped = original(fn)
        compile_data_ref = _closure_value(fn, "weakref_cd")
        compile_stats_ref = _closure_value(fn, "weakref_cs")
        if compile_data_ref is None or compile_stats_ref is None:
            return wrapped
        broken: list[_Broken] = []
        lock = threading.Lock()

        def call(*args: Any, **kwargs: Any) -> Any:
            if not broken:
                try:
                    return wrapped(*args, **kwargs)
                except DataDependentShapeError as error:
                    compile_data = compile_data_ref()
                    if not _breakable(compile_data, uses_thunderplug):
                        raise
                    with lock:
                        if not broken:
                            broken.append(_Broken(compile_data, error))
                            _warn(compile_data, error)
            stats = compile_stats_ref()
            if stats is not None:  # no trace of its own: thunder.last_traces says so with [] (explain: the graphs')
                stats.last_traces, stats.last_backward_traces = [], []
            return broken[0].cache_entry(args, kwargs, stats)

        return call

    return decorate


def _breakable(compile_data: Any, uses_thunderplug: Callable[[Any], bool]) -> bool:
    return (
        compile_data is not None
        and not isinstance(compile_data.fn, Symbol)
        and uses_thunderplug(compile_data)
        and not compile_data.transforms
        and not compile_data.compile_options.get(OPTION, False)
    )


def _warn(compile_data: Any, error: DataDependentShapeError) -> None:
    name = getattr(compile_data.fn, "__qualname__", type(compile_data.fn).__name__)
    warnings.warn(
        f"{name}: {error.op}{error.location} {error.why}; the function runs as torch.compile runs it: Dynamo "
        "breaks the graph at the op, which runs eagerly, and thunder.jit compiles each graph around it with the "
        f"same executors (thunderplug explain shows them). {error.advice}",
        ThunderplugWarning,
        stacklevel=_user_frame_level(),
    )


_LIBRARIES = (os.path.dirname(thunder.__file__), os.path.dirname(os.path.dirname(__file__)))


def _user_frame_level() -> int:
    """The ``stacklevel`` of the first frame outside thunder and thunderplug, seen from :func:`_warn`
    (the user's call of the jitted function; thunder's wrappers and the patches between vary)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARIES):
        frame, level = frame.f_back, level + 1
    return level
