"""Torch ops on tensor-subclass proxies: one trace symbol each, decomposed into the unrolled dispatch.

``TwoTensor.torch.mul(x, 2)`` is recorded as one bound symbol whose subsymbols are what the
subclass's ``__torch_dispatch__`` does, obtained by running the real torch op on FakeTensor
instances of the subclass under ``make_fx`` and replaying the ATen graph with thunderplug's ATen
symbols. Output metadata comes from that fake run, never from guessing. Subclass outputs are
rebuilt by ``subclass_unflatten`` (run by thunder's python executor, only where a subclass value
is really needed at run time: at the outputs).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils._pytree as torch_pytree
from thunder.core.prims import OpTags
from thunder.core.proxies import TensorProxy
from thunder.core.pytree import tree_flatten, tree_unflatten
from thunder.core.symbol import Symbol, default_python_printer
from thunder.executors.pythonex import ex as pythonex
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from thunderplug.aten import AtenTable, user_location
from thunderplug.fake import fake_like, fake_mode, to_fake
from thunderplug.subclass_proxy import SubclassLayout, SubclassTensorProxy, to_fake_tensor


class SubclassDispatchError(RuntimeError):
    """A torch op on a tensor subclass could not be unrolled into ATen ops."""


# -- boundary operations, executed by thunder's python executor -----------------------------


def _unflatten_meta(layout: SubclassLayout, *inner: TensorProxy) -> SubclassTensorProxy:
    inner_by_name = dict(zip(layout.attrs, inner))
    with fake_mode():
        outer = layout.unflatten({name: to_fake_tensor(p) for name, p in inner_by_name.items()})
    return SubclassTensorProxy(layout, inner_by_name, outer=outer)


def _unflatten(layout: SubclassLayout, *inner: torch.Tensor) -> torch.Tensor:
    return layout.unflatten(dict(zip(layout.attrs, inner)))


subclass_unflatten = pythonex.register_operator("subclass_unflatten", meta=_unflatten_meta, fn=_unflatten)


def _flatten_meta(value: SubclassTensorProxy, layout: SubclassLayout) -> tuple[TensorProxy, ...]:
    return tuple(type(inner)(like=inner) for inner in value.inner.values())


def _flatten(value: torch.Tensor, layout: SubclassLayout) -> tuple[torch.Tensor, ...]:
    if type(value) is not layout.cls:
        value = _coerce_tangent(value, layout)
    return tuple(getattr(value, name) for name in layout.attrs)


def _coerce_tangent(value: torch.Tensor, layout: SubclassLayout) -> torch.Tensor:
    """A gradient that arrived with another type than the one the backward was traced for."""
    coerce = getattr(value, "__coerce_same_metadata_as_tangent__", None)
    coerced = coerce(layout.ctx, layout.cls) if coerce is not None else None
    if coerced is None:
        raise TypeError(
            f"expected a {layout.cls.__name__} (e.g. the gradient of a {layout.cls.__name__} output), got "
            f"{type(value).__name__}; define __coerce_same_metadata_as_tangent__ on {layout.cls.__name__} to convert it"
        )
    return coerced


subclass_flatten = pythonex.register_operator("subclass_flatten", meta=_flatten_meta, fn=_flatten)


def flatten_to_leaves(value: TensorProxy) -> list[TensorProxy]:
    """Record ``subclass_flatten`` for a subclass value (recursively for nested ones) and return
    the plain proxies it is made of; a plain proxy is its own leaf."""
    if not isinstance(value, SubclassTensorProxy):
        return [value]
    parts = subclass_flatten(value, value.layout)
    return [leaf for part in parts for leaf in flatten_to_leaves(part)]


def _check_subclass(value: Any, layout: SubclassLayout) -> None:
    if type(value) is not layout.cls:
        raise TypeError(f"expected {layout.cls.__name__}, got {type(value).__name__}")
    attrs, ctx = value.__tensor_flatten__()
    if tuple(attrs) != layout.attrs:
        raise ValueError(f"{layout.cls.__name__} inner tensors changed: {attrs} != {layout.attrs}")
    guard = getattr(layout.cls, "__metadata_guard__", None)
    if not (guard(layout.ctx, ctx) if guard is not None else ctx == layout.ctx):
        raise ValueError(f"{layout.cls.__name__} flatten context changed: {ctx!r} != {layout.ctx!r}")


check_subclass = pythonex.register_operator(
    "check_subclass", meta=lambda value, layout: None, fn=_check_subclass, tags=(OpTags.DONT_DCE,)
)


def _check_not_subclass(value: Any) -> None:
    if type(value) is not torch.Tensor and is_traceable_wrapper_subclass(value):
        raise TypeError(f"expected a plain tensor, got {type(value).__name__}")


check_not_subclass = pythonex.register_operator(
    "check_not_subclass", meta=lambda value: None, fn=_check_not_subclass, tags=(OpTags.DONT_DCE,)
)


# -- subclass op symbols ----------------------------------------------------------------------

_op_symbols: dict[tuple[str, Any, int], Symbol] = {}
_op_symbol_ids: set[str] = set()


def is_subclass_op(symbol: Symbol) -> bool:
    return symbol.id in _op_symbol_ids


def subclass_op_symbol(
    display: str, torch_fn: Callable[..., Any], table: AtenTable, *, differentiable: bool = True
) -> Symbol:
    """The symbol ``<Class>.<op>`` (e.g. ``TwoTensor.torch.mul``), created once per name and function.

    ``differentiable`` symbols get the gradient of their outer torch op (subclass_autodiff).
    """
    key = (display, torch_fn, id(table))
    if key not in _op_symbols:

        def meta(*args: Any, **kwargs: Any) -> Any:
            return unroll(display, torch_fn, table, args, kwargs)

        def printer(bsym, out_printables, arg_printables, kwarg_printables):
            line = default_python_printer(bsym, out_printables, arg_printables, kwarg_printables)
            return line.replace(f"{bsym.name_with_module()}(", f"{display}(", 1)

        symbol = Symbol(
            name=_identifier(display),
            meta=meta,
            id=f"thunderplug.subclass.{display}",
            python_printer=printer,
            _module=__import__(__name__, fromlist=["_"]),
        )
        _op_symbol_ids.add(symbol.id)
        _op_symbols[key] = symbol
        if differentiable:
            from thunderplug.subclass_autodiff import register_vjp

            register_vjp(symbol, display, torch_fn, table)
    return _op_symbols[key]


def torch_function_of(display: str) -> Callable[..., Any]:
    """The torch function a subclass op name stands for (``TwoTensor.torch.mul`` -> ``torch.mul``)."""
    _, _, path = display.partition(".")
    function = _torch_attribute(path)
    if function is None:
        raise AttributeError(f"{display} names no torch function ({path} does not exist)")
    return function


def _torch_attribute(path: str) -> Any:
    """``torch.nn.functional.linear`` -> that object, or ``None`` if the dotted path does not exist."""
    target: Any = torch
    for part in path.split(".")[1:]:
        target = getattr(target, part, None)
        if target is None:
            return None
    return target


def _identifier(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)


# Where in the user's code each subclass op was traced, for errors raised later (in autodiff).
source_locations: dict[tuple, str] = {}


def call_key(display: str, tensors: list) -> tuple:
    return (display, tuple(t.name for t in tensors))


def unroll(display: str, torch_fn: Callable[..., Any], table: AtenTable, args: tuple, kwargs: dict) -> Any:
    """Run ``torch_fn`` on fake subclass instances under make_fx and replay the ATen graph."""
    flat, spec = tree_flatten((args, kwargs))
    tensors = [x for x in flat if isinstance(x, TensorProxy)]
    location = user_location()
    if location:
        source_locations[call_key(display, tensors)] = location
    # flatten -> ATen ops -> unflatten: the decomposition only reads this symbol's own arguments
    leaves = [leaf for t in tensors for leaf in flatten_to_leaves(t)]
    output_plan: list = []

    def on_fakes(*fake_leaves: torch.Tensor) -> list[torch.Tensor]:
        remaining = iter(fake_leaves)
        fake_flat = [_rebuild_fake(x, remaining) if isinstance(x, TensorProxy) else to_fake(x) for x in flat]
        fake_args, fake_kwargs = tree_unflatten(fake_flat, spec)
        result = torch_fn(*fake_args, **fake_kwargs)
        out_flat, out_spec = torch_pytree.tree_flatten(result)
        output_plan[:] = [out_spec, [_describe(o) for o in out_flat]]
        return [leaf for o in out_flat if isinstance(o, torch.Tensor) for leaf in _fake_leaves(o)]

    try:
        with fake_mode():
            graph = make_fx(on_fakes, decomposition_table=table.decompositions)(*[fake_like(leaf) for leaf in leaves])
    except Exception as error:
        raise SubclassDispatchError(f"{display} failed in the subclass's __torch_dispatch__{user_location()}: {error}") from error
    out_leaves = iter(_replay(graph, leaves, table, display))
    out_spec, plans = output_plan
    outputs = [_build_output(plan, out_leaves) for plan in plans]
    return torch_pytree.tree_unflatten(outputs, out_spec)


def _rebuild_fake(proxy: TensorProxy, fake_leaves) -> torch.Tensor:
    if isinstance(proxy, SubclassTensorProxy):
        return proxy.layout.unflatten({name: _rebuild_fake(inner, fake_leaves) for name, inner in proxy.inner.items()})
    return next(fake_leaves)


def _fake_leaves(tensor: torch.Tensor) -> list[torch.Tensor]:
    if is_traceable_wrapper_subclass(tensor):
        attrs, _ = tensor.__tensor_flatten__()
        return [leaf for name in attrs for leaf in _fake_leaves(getattr(tensor, name))]
    return [tensor]


def _describe(value: Any) -> Any:
    """What to build for one output: a layout tree for subclasses, ``"plain"``, or the constant."""
    if isinstance(value, torch.Tensor):
        if is_traceable_wrapper_subclass(value):
            layout = SubclassLayout.of(value)
            return (layout, [_describe(getattr(value, name)) for name in layout.attrs])
        return "plain"
    return ("constant", value)


def _build_output(plan: Any, leaves) -> Any:
    if plan == "plain":
        return next(leaves)
    if plan[0] == "constant":
        return plan[1]
    layout, inner_plans = plan
    return subclass_unflatten(layout, *[_build_output(inner, leaves) for inner in inner_plans])


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
    env: dict[torch.fx.Node, Any] = {}
    inputs = iter(leaves)
    for node in graph.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(inputs)
        elif node.op == "call_function":
            args, kwargs = _plain_containers(torch.fx.node.map_arg((node.args, node.kwargs), env.__getitem__))
            if isinstance(node.target, torch._ops.OpOverload) and _is_inplace(node.target):
                mutated = node.args[0]
                if mutated.op == "placeholder":
                    raise SubclassDispatchError(
                        f"{display}: the subclass's dispatch mutates an input in place ({node.target}){user_location()}; "
                        "thunderplug does not support in-place updates of subclass inner tensors"
                    )
                # dispatch code mutating its own temporary (torchao's addmm does ``out.add_(bias)``):
                # compute the out-of-place op and let every later use of the temporary see the result
                env[node] = env[mutated] = table.call(_functional(node.target), *args, **kwargs)
            elif isinstance(node.target, torch._ops.OpOverload):
                env[node] = table.call(node.target, *args, **kwargs)
            elif node.target is operator.getitem:
                env[node] = args[0][args[1]]
            else:
                raise SubclassDispatchError(
                    f"{display}: the subclass's dispatch produced {node.target}, which is not an ATen op{user_location()}"
                )
        elif node.op == "output":
            return list(torch.fx.node.map_arg(node.args[0], env.__getitem__))
    raise AssertionError("fx graph without output")


# -- which symbol a call on subclass proxies becomes --------------------------------------------

# Prims that only inspect or move values (guards, unpacking, returns) accept subclass proxies as they are.
_BOOKKEEPING_PRIM_PREFIXES = (
    "check_", "unpack_", "python_return", "return", "python_del", "del", "comment", "sink", "put_grad", "get_grad"
)


def subclass_proxies(args: tuple, kwargs: dict) -> Iterator[SubclassTensorProxy]:
    """The subclass proxies among a call's arguments, also one level inside lists and tuples
    (``torch.cat([x, y])``); this runs for every symbol call while tracing, so it stays shallow."""
    for value in (*args, *kwargs.values()):
        if type(value) is SubclassTensorProxy:
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (item for item in value if type(item) is SubclassTensorProxy)


def has_subclass_proxy(args: tuple, kwargs: dict) -> bool:
    return next(subclass_proxies(args, kwargs), None) is not None


def passes_through(symbol: Symbol) -> bool:
    """Symbols that take subclass proxies as they are: ours, executor operations, bookkeeping prims."""
    return (
        is_subclass_op(symbol)
        or symbol.executor is not None
        or (symbol.is_prim and symbol.name.startswith(_BOOKKEEPING_PRIM_PREFIXES))
    )


def dispatch(symbol: Symbol, table: AtenTable, args: tuple, kwargs: dict) -> Symbol | None:
    """The subclass op symbol a call of ``symbol`` on subclass proxies becomes, or ``None`` to
    let ``symbol`` run as itself (a composite whose parts will be dispatched one by one)."""
    cls = next(subclass_proxies(args, kwargs)).subclass_type
    overload = table.overloads_by_id.get(symbol.id)
    if overload is not None:
        return subclass_op_symbol(f"{cls.__name__}.{symbol.id}", overload, table)
    torch_fn, op_name = torch_function_for(symbol)
    if torch_fn is not None:
        return subclass_op_symbol(f"{cls.__name__}.{op_name}", torch_fn, table)
    torch_fn = _torch_function_for_prim(symbol) if symbol.is_prim else None
    if torch_fn is not None:  # e.g. prims.add from accumulating two gradients
        return subclass_op_symbol(f"{cls.__name__}.{torch_fn.__module__}.{torch_fn.__name__}", torch_fn, table)
    if symbol.is_prim:
        raise SubclassDispatchError(
            f"prims.{symbol.name} was applied to a {cls.__name__} value{user_location()}; thunderplug only "
            "unrolls torch-level operations on tensor subclasses"
        )
    return None


def _torch_function_for_prim(symbol: Symbol) -> Callable[..., Any] | None:
    """The torch function thunder's torch executor runs a prim with, when it runs it directly."""
    from thunder.executors.torchex import ex as torchex

    impl = torchex.implmap.get(symbol.id)
    if impl is None or impl.execution_transform is not None or impl.symbol is None:
        return None
    module = impl.symbol.module
    return getattr(module, impl.symbol.name, None) if module is not None else None


_torch_keys_by_symbol_id: dict[Any, list[Callable[..., Any]]] = {}


def _torch_keys(symbol: Symbol) -> list[Callable[..., Any]]:
    """The torch callables thunder maps to ``symbol`` (thunder's map is keyed the other way)."""
    if not _torch_keys_by_symbol_id:
        from thunder.torch import _torch_to_thunder_function_map

        for torch_fn, target in _torch_to_thunder_function_map.items():
            if isinstance(target, Symbol) and callable(torch_fn):
                _torch_keys_by_symbol_id.setdefault(target.id, []).append(torch_fn)
    return _torch_keys_by_symbol_id.get(symbol.id, [])


def torch_function_for(symbol: Symbol) -> tuple[Callable[..., Any], str] | tuple[None, None]:
    """The torch callable a thunder.torch symbol stands for, and the name to show it under.

    A ``torch.Tensor`` method comes first: it accepts every calling convention the function does
    (``x.reshape(2, 3)`` and ``((2, 3),)``), and its name is the one users call (thunder files
    ``torch.mm`` under the id of its alias ``torch.spmm``).
    """
    methods = [
        fn for fn in _torch_keys(symbol) if _is_method(fn) and not getattr(fn, "__name__", "_").startswith("_")
    ]
    if isinstance(symbol.id, str) and symbol.id.count(".") == 1 and symbol.id.startswith("torch."):
        method = getattr(torch.Tensor, symbol.id.split(".")[1], None)
        if callable(method):
            methods.insert(0, method)
    if methods:
        return methods[0], f"torch.{methods[0].__name__}"
    if isinstance(symbol.id, str) and symbol.id.startswith("torch."):
        target = _torch_attribute(symbol.id)
        if callable(target):
            return target, symbol.id
    keys = _torch_keys(symbol)
    return (keys[0], str(symbol.id)) if keys else (None, None)


def _is_method(torch_fn: Any) -> bool:
    return "Tensor" in getattr(torch_fn, "__qualname__", "").split(".")[0]


def construct(cls: type, table: AtenTable, args: tuple, kwargs: dict) -> Any:
    """Build a subclass inside a jitted function: ``<Class>.construct`` with the unrolled constructor."""
    return subclass_op_symbol(f"{cls.__name__}.construct", cls, table)(*args, **kwargs)
