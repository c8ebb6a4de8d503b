"""functorch transforms (``torch.vmap``, ``torch.func.grad``, ...) called inside a jitted function.

thunder 0.2.6 interprets the transform's Python code: it enters a functorch level for real, then hands a
proxy to ``torch._C._functorch._add_batch_dim`` (``TypeError: incompatible function arguments``), and the
level is never left: eager code run next in the process fails too (``vmap: called random operation while
in randomness error mode``).

Inside discover() compilations, ``torch.vmap(f, ...)`` returns a :class:`Vmapped` instead of functorch's
wrapper, and calling it records one trace op, ``functorch_vmap``, that runs torch's own vmap on the real
tensors at run time (Hugging Face transformers 4.x builds attention masks with nested ``torch.vmap`` of
closures). Its outputs' metadata comes from running the same vmap on FakeTensors. The tensors the function
captures (closure cells, defaults, ``functools.partial`` arguments, bound methods' functions and selves, in
tuples, lists and dicts, through nested closures and nested vmaps) that are proxies become inputs of the op;
at run time a copy of the function with those tensors in their places is vmapped (the user's closures are
never changed, so calls from several threads do not interfere). The TorchFunctionModes the jitted function
entered around the call (transformers' ``TransformGetItemToIndex``) are entered around it at run time too.
Gradients flow through it: its backward, ``functorch_vmap_backward``, is ``torch.func.vjp`` of the same
vmapped function at run time (which runs the forward again). Tensor subclass values in a vmap, and the
other transforms (``torch.func.grad``, ``jacrev``, ...), are refused with the user's line before any level
is entered. Any functorch level or TorchFunctionMode a failed compilation entered is left, so the process
stays usable whatever failed.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.func
import torch.utils._pytree as torch_pytree
from thunder.core import devices, dtypes, prims
from thunder.core.interpreter import do_raise, interpreter_needs_wrap
from thunder.core.proxies import NumberProxy, TensorProxy
from thunder.core.transforms import register_grad
from thunder.executors.pythonex import ex as pythonex

from thunderplug.tracing.aten import DataDependentShapeError, user_location
from thunderplug.tracing.fake import fake_like, fake_mode
from thunderplug.tracing.trace_state import grad_enabled

_NAMES = ("grad", "grad_and_value", "vjp", "jvp", "jacrev", "jacfwd", "hessian", "functionalize", "linearize")
#: the public entry points of functorch's transforms, by the name users call them with
TRANSFORMS: dict[str, Callable[..., Any]] = {
    "torch.vmap": torch.vmap,
    **{f"torch.func.{name}": getattr(torch.func, name) for name in _NAMES if hasattr(torch.func, name)},
}


class Vmapped:
    """What ``torch.vmap(fn, in_dims, out_dims, randomness, chunk_size=...)`` returns inside a discover()
    compilation. Calling it in jitted code records one ``functorch_vmap`` op (:func:`call_lookaside`);
    called anywhere else, it is torch's vmap."""

    __slots__ = ("fn", "in_dims", "out_dims", "randomness", "chunk_size", "__weakref__")

    def __init__(self, func: Callable[..., Any], in_dims: Any = 0, out_dims: Any = 0, randomness: str = "error",
                 *, chunk_size: int | None = None):  # torch.vmap's signature
        self.fn, self.in_dims, self.out_dims, self.randomness, self.chunk_size = (
            func, in_dims, out_dims, randomness, chunk_size
        )

    def eager(self) -> Callable[..., Any]:
        """torch's vmap of the function (a nested :class:`Vmapped` as torch's nested vmap)."""
        fn = self.fn.eager() if isinstance(self.fn, Vmapped) else self.fn
        return torch.vmap(fn, self.in_dims, self.out_dims, self.randomness, chunk_size=self.chunk_size)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """torch's vmap; in discover() compilations a lookaside records the op instead (:func:`call_lookaside`)."""
        return self.eager()(*args, **kwargs)


class VmapCall:
    """One recorded vmap call: the :class:`Vmapped`, the call's arguments, the proxies that are the op's
    tensor inputs (arguments first, then captured tensors) and the TorchFunctionModes to enter. ``on(tensors)``
    runs it: on the real tensors at run time, on FakeTensors for its outputs' metadata."""

    def __init__(self, vmapped: Vmapped, args: tuple, kwargs: dict, modes: tuple, location: str):
        self.vmapped, self.modes, self.location = vmapped, modes, location
        leaves, self.spec = torch_pytree.tree_flatten((args, kwargs))
        self.leaves = [x.value if isinstance(x, NumberProxy) else x for x in leaves]
        found: dict[str, TensorProxy] = {x.name: x for x in self.leaves if isinstance(x, TensorProxy)}
        _substituted(vmapped, lambda proxy: found.setdefault(proxy.name, proxy), {})
        self.inputs: tuple[TensorProxy, ...] = tuple(found.values())

    def on(self, tensors: tuple) -> Any:
        """The vmapped function applied to the call's arguments, ``tensors`` in place of the inputs."""
        by_name = {proxy.name: tensor for proxy, tensor in zip(self.inputs, tensors)}

        def swap(proxy: TensorProxy) -> Any:
            return by_name[proxy.name]

        vmapped = _substituted(self.vmapped, swap, {})
        args, kwargs = torch_pytree.tree_unflatten(
            [swap(x) if isinstance(x, TensorProxy) else x for x in self.leaves], self.spec
        )
        active = torch.overrides._get_current_function_mode_stack()
        with contextlib.ExitStack() as stack:
            for mode in self.modes:
                if not any(mode is other for other in active):  # while thunder interprets the block, it is
                    stack.enter_context(mode)
            return vmapped.eager()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"VmapCall({getattr(self.vmapped.fn, '__qualname__', type(self.vmapped.fn).__name__)})"


def _run(call: VmapCall, *tensors: torch.Tensor) -> Any:
    return call.on(tensors)


def _meta(call: VmapCall, *tensors: TensorProxy) -> Any:
    try:
        with fake_mode(), torch.no_grad():
            result = call.on(tuple(fake_like(t) for t in tensors))
    except Exception as error:  # noqa: BLE001 - any failure is the user's vmap, named with its line
        raise NotImplementedError(
            f"`torch.vmap` of {call!r}{call.location} failed on FakeTensors (its outputs' metadata could not be "
            f"computed): {type(error).__name__}: {error}. Tensors it uses must be arguments, or captured in "
            "closures, defaults, functools.partial, tuples, lists or dicts."
        ) from error
    differentiable = grad_enabled() and any(t.requires_grad and _inexact(t) for t in tensors)
    return torch_pytree.tree_map(lambda value: _proxy_like(value, differentiable), result)


def _proxy_like(value: Any, differentiable: bool) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    dtype = dtypes.to_dtype(value.dtype)
    return TensorProxy(shape=tuple(value.shape), device=devices.to_device(value.device), dtype=dtype,
                       requires_grad=differentiable and dtypes.is_inexact_dtype(dtype))


def _inexact(value: Any) -> bool:
    return isinstance(value, TensorProxy) and dtypes.is_inexact_dtype(value.dtype)


#: the op a vmap call inside a discover() compilation becomes: torch's vmap on the real tensors
functorch_vmap = pythonex.register_operator("functorch_vmap", meta=_meta, fn=_run)


# -- gradients: torch.func.vjp of the same vmapped function, at run time --------------------------------


def _floating_outputs(result: Any) -> list:
    return [o for o in torch_pytree.tree_leaves(result) if isinstance(o, torch.Tensor) and o.is_floating_point()]


def _backward(call: VmapCall, wanted: tuple[bool, ...], *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The gradients of the wanted inputs: ``torch.func.vjp`` of the vmapped function (which runs its forward
    again) applied to the cotangents of its floating outputs."""
    tensors, cotangents = list(values[: len(wanted)]), values[len(wanted):]
    chosen = [i for i, want in enumerate(wanted) if want]

    def forward(*differentiated: torch.Tensor) -> tuple[torch.Tensor, ...]:
        inputs = list(tensors)
        for i, value in zip(chosen, differentiated):
            inputs[i] = value
        return tuple(_floating_outputs(call.on(tuple(inputs))))

    _, pullback = torch.func.vjp(forward, *[tensors[i] for i in chosen])
    return tuple(pullback(tuple(cotangents)))


def _backward_meta(call: VmapCall, wanted: tuple[bool, ...], *values: TensorProxy) -> tuple[TensorProxy, ...]:
    return tuple(TensorProxy(like=t, requires_grad=False) for t, want in zip(values, wanted) if want)


functorch_vmap_backward = pythonex.register_operator(
    "functorch_vmap_backward", meta=_backward_meta, fn=_backward
)


def _grad_rule(call: VmapCall, *tensors: TensorProxy) -> Any:
    """``functorch_vmap``, then ``functorch_vmap_backward`` for the cotangents of its floating outputs."""
    result = functorch_vmap(call, *tensors)
    outputs = [o for o in torch_pytree.tree_leaves(result) if _inexact(o)]
    wanted = tuple(_inexact(t) for t in tensors)
    if not outputs or not any(wanted):
        return result
    cotangents = [prims.get_grad(o) for o in outputs]
    grads = iter(functorch_vmap_backward(call, wanted, *tensors, *cotangents))
    for tensor, want in zip(tensors, wanted):
        if want:
            prims.put_grad(tensor, next(grads))
    return result


register_grad(functorch_vmap.id, _grad_rule)


def _substituted(value: Any, swap: Callable[[TensorProxy], Any], memo: dict[int, Any]) -> Any:
    """``value`` with every tensor proxy it holds replaced by ``swap(proxy)``: through closure cells,
    defaults, ``functools.partial``, bound methods, :class:`Vmapped` and tuples, lists and dicts. What
    holds no proxy is returned itself; what does is copied (cells too), never changed."""
    key = id(value)
    if key in memo:
        return memo[key]
    if isinstance(value, TensorProxy):
        return swap(value)
    if isinstance(value, NumberProxy):
        return value.value
    result = value
    memo[key] = value  # a cycle back to ``value`` while it is being copied sees the original
    if isinstance(value, Vmapped):
        fn = _substituted(value.fn, swap, memo)
        if fn is not value.fn:
            result = Vmapped(fn, value.in_dims, value.out_dims, value.randomness, chunk_size=value.chunk_size)
    elif isinstance(value, types.FunctionType):
        result = _function_substituted(value, swap, memo)
    elif isinstance(value, types.MethodType):
        func, owner = _substituted(value.__func__, swap, memo), _substituted(value.__self__, swap, memo)
        if func is not value.__func__ or owner is not value.__self__:
            result = types.MethodType(func, owner)
    elif isinstance(value, functools.partial):
        parts = [_substituted(p, swap, memo) for p in (value.func, value.args, value.keywords)]
        if any(new is not old for new, old in zip(parts, (value.func, value.args, value.keywords))):
            result = functools.partial(parts[0], *parts[1], **parts[2])
    elif type(value) in (tuple, list):
        items = [_substituted(item, swap, memo) for item in value]
        if any(new is not old for new, old in zip(items, value)):
            result = type(value)(items)
    elif type(value) is dict:
        items = {k: _substituted(v, swap, memo) for k, v in value.items()}
        if any(items[k] is not v for k, v in value.items()):
            result = items
    memo[key] = result
    return result


def _function_substituted(fn: types.FunctionType, swap: Callable[[TensorProxy], Any], memo: dict[int, Any]) -> Any:
    cells = fn.__closure__ or ()
    contents = [_substituted(_cell_contents(cell), swap, memo) for cell in cells]
    defaults = _substituted(fn.__defaults__, swap, memo)
    kwdefaults = _substituted(fn.__kwdefaults__, swap, memo)
    if (all(new is _cell_contents(cell) for new, cell in zip(contents, cells))
            and defaults is fn.__defaults__ and kwdefaults is fn.__kwdefaults__):
        return fn
    closure = tuple(cell if new is _cell_contents(cell) else types.CellType(new) for new, cell in zip(contents, cells))
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, defaults, closure or None)
    copy.__kwdefaults__, copy.__qualname__ = kwdefaults, fn.__qualname__
    copy.__dict__.update(fn.__dict__)
    return copy


_EMPTY = object()


def _cell_contents(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell (a name assigned later in the enclosing function)
        return _EMPTY


# -- lookasides ----------------------------------------------------------------------------------------


_modes_at_start = threading.local()


def _modes_entered_inside() -> tuple:
    """The TorchFunctionModes the jitted function entered (thunder enters them for real while it
    interprets a ``with`` block), innermost last."""
    stack = torch.overrides._get_current_function_mode_stack()
    return tuple(stack[getattr(_modes_at_start, "depth", 0):])


def vmap_lookaside(interpret: Callable[..., Any], active: Callable[[], bool]) -> Callable[[Any], Callable[..., Any]]:
    """``torch.vmap(...)`` returns a :class:`Vmapped` in discover() compilations; elsewhere thunder
    interprets it as before."""
    unlooked = _unlooked(torch.vmap)

    def make(_no_lookaside: Any) -> Callable[..., Any]:
        def lookaside(*args: Any, **kwargs: Any) -> Any:
            if not active():
                return interpret(unlooked, *args, **kwargs)
            return interpreter_needs_wrap(Vmapped)(*args, **kwargs)

        return lookaside

    return make


def call_lookaside(interpret: Callable[..., Any], active: Callable[[], bool]) -> Callable[[Any], Callable[..., Any]]:
    """Calling a :class:`Vmapped` in jitted code records ``functorch_vmap``, or refuses the call, with the
    user's line, when tensor subclass values would go through it."""
    unlooked = _unlooked(Vmapped.__call__)

    def record(vmapped: Vmapped, *args: Any, **kwargs: Any) -> Any:
        call = VmapCall(vmapped, args, kwargs, _modes_entered_inside(), user_location())
        subclasses = [p.name for p in call.inputs if type(p) is not TensorProxy]
        if subclasses:
            raise NotImplementedError(
                f"`torch.vmap` of {call!r}{call.location}: {', '.join(subclasses)} are tensor subclass values, which "
                "thunderplug does not run through torch.vmap. Apply torch.vmap outside the jitted function."
            )
        return functorch_vmap(call, *call.inputs)

    recorded = interpreter_needs_wrap(record)

    def make(_no_lookaside: Any) -> Callable[..., Any]:
        def lookaside(*args: Any, **kwargs: Any) -> Any:
            if not active():
                return interpret(unlooked, *args, **kwargs)
            try:
                return recorded(*args, **kwargs)
            except NotImplementedError as error:
                return do_raise(error)

        return lookaside

    return make


def refusal(
    name: str, interpret: Callable[..., Any], active: Callable[[], bool]
) -> Callable[[Any], Callable[..., Any]]:
    """A lookaside for the transform ``name``: outside discover() compilations thunder interprets it as before."""
    unlooked = _unlooked(TRANSFORMS[name])

    def make(_no_lookaside: Any) -> Callable[..., Any]:
        def lookaside(*args: Any, **kwargs: Any) -> Any:
            if not active():
                return interpret(unlooked, *args, **kwargs)
            return do_raise(NotImplementedError(
                f"`{name}` is called inside a function compiled by thunder.jit{user_location()}: thunderplug runs "
                "torch.vmap as one op, but no other functorch transform (they run the function on functional tensor "
                "wrappers, which thunder's proxies are not). Apply the transform outside the jitted function, or "
                "write the computation without it (torch.autograd)."
            ))

        return lookaside

    return make


def _unlooked(transform: Callable[..., Any]) -> Callable[..., Any]:
    """The same code as another function object, which has no lookaside: thunder interprets it as before."""
    unlooked = types.FunctionType(transform.__code__, transform.__globals__, transform.__name__,
                                  transform.__defaults__, transform.__closure__)
    unlooked.__kwdefaults__ = transform.__kwdefaults__
    return unlooked


# -- failures --------------------------------------------------------------------------------------------


def levels_left_on_failure(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """The interpretation of a jitted function, leaving every functorch level and TorchFunctionMode it
    entered if it fails (and noting the modes entered before it, which are not the function's)."""

    def replacement(*args: Any, **kwargs: Any) -> Any:
        if not active():
            return original(*args, **kwargs)
        depth, modes = _depth(), torch._C._len_torch_function_stack()
        outer = getattr(_modes_at_start, "depth", None)
        _modes_at_start.depth = modes
        try:
            return original(*args, **kwargs)
        except BaseException:
            leave_levels_above(depth)
            while torch._C._len_torch_function_stack() > modes:
                torch._C._pop_torch_function_stack()
            raise
        finally:
            _modes_at_start.depth = outer

    return replacement


def leave_levels_above(depth: int = 0) -> int:
    """Leave the functorch levels entered above ``depth`` (stock thunder leaves one entered when it fails
    inside ``torch.vmap``; eager code run next then fails); returns how many were left."""
    left = 0
    while _depth() > depth:
        _leave_innermost_level()
        left += 1
    return left


def _depth() -> int:
    level = torch._C._functorch.maybe_current_level()
    return 0 if level is None else int(level)


def _leave_innermost_level() -> None:
    functorch = torch._C._functorch
    kind = functorch.peek_interpreter_stack().key()
    leave = {
        functorch.TransformType.Vmap: functorch._vmap_decrement_nesting,
        functorch.TransformType.Grad: functorch._grad_decrement_nesting,
        functorch.TransformType.Jvp: functorch._jvp_decrement_nesting,
        functorch.TransformType.Functionalize: functorch._func_decrement_nesting,
    }[kind]
    leave()


# -- torch.func.functional_call ----------------------------------------------------------------------------

#: the functional_call entry points: torch.func's and the older torch.nn.utils.stateless one
FUNCTIONAL_CALLS: dict[str, Callable[..., Any]] = {
    "torch.func.functional_call": torch.func.functional_call,
    "torch.nn.utils.stateless.functional_call": torch.nn.utils.stateless.functional_call,
}


def functional_call_break(name: str, interpret: Callable[..., Any], active: Callable[[], bool]) -> Callable:
    """A lookaside for ``name`` (of :data:`FUNCTIONAL_CALLS`). ``functional_call(module, params, args)`` swaps the
    module's parameters for ``params`` in place for the call (keyed by the tensors themselves, which thunder's
    proxies cannot be: ``TypeError: unhashable type: 'TensorProxy'``) and back after it, a change of the module a
    thunder trace cannot record. In discover() compilations it is a :class:`DataDependentShapeError` naming the
    line, on which the compilation graph-breaks (``wiring.graph_breaks``): Dynamo, which traces functional_call,
    captures the call in its graphs, which thunder.jit compiles."""
    unlooked = _unlooked(FUNCTIONAL_CALLS[name])

    def refuse(*args: Any, **kwargs: Any) -> Any:
        location = user_location()
        raise DataDependentShapeError(
            f"`{name}`{location}: it swaps the module's parameters in place for the call, which a thunder 0.2.6 trace "
            "cannot record. Call the module's functional form (its ops on the given tensors) instead.",
            op=f"`{name}`", location=location,
            why="swaps the module's parameters for the call, which a thunder 0.2.6 trace cannot record",
            advice="For one trace, call the module's functional form (its ops on the given tensors).",
        )  # fmt: skip

    refusal = interpreter_needs_wrap(refuse)

    def make(_no_lookaside: Any) -> Callable[..., Any]:
        def lookaside(*args: Any, **kwargs: Any) -> Any:
            if not active():
                return interpret(unlooked, *args, **kwargs)
            return refusal(*args, **kwargs)

        return lookaside

    return make
