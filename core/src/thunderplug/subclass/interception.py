"""The replacements ``wiring.patches`` installs into thunder for tensor subclasses.

Each factory takes thunder's original and returns the replacement, which defers to the original
unless the compilation in progress uses ``discover()``'s executors (the ``thunderplug`` core
executor is in its list): plain ``thunder.jit`` behaves exactly as without thunderplug.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from thunder import clang
from thunder.core import dtypes, prims, proxies
from thunder.core.interpreter import ProvenanceRecord, PseudoInst, interpreter_needs_wrap, unwrap, wrap, wrap_const
from thunder.core.jit_ext import get_jit_ctx
from thunder.core.proxies import TensorProxy, tensorproxy
from thunder.core.symbol import Symbol
from thunder.core.trace import get_tracectx, tracectx
from torch.utils._python_dispatch import is_traceable_wrapper_subclass, is_traceable_wrapper_subclass_type

from thunderplug.caching.recompiles import note_subclass_input
from thunderplug.eager.tensor_api import as_data_dependent, eager_arguments
from thunderplug.eager.tensor_to import returns_input_unchanged
from thunderplug.subclass.autodiff import tangent_layout
from thunderplug.subclass.dispatch import construct, dispatch, has_subclass_proxy, passes_through
from thunderplug.subclass.executor import active_core_executor
from thunderplug.subclass.inplace import bind_aliasing_prim, decompose_in_place, is_in_place
from thunderplug.subclass.plan import SubclassOutput
from thunderplug.subclass.symbols import unrolled_op_symbol
from thunderplug.subclass.unroll import SubclassDispatchError, traced
from thunderplug.subclass.values import (
    InputGuard,
    SubclassLayout,
    SubclassTensorProxy,
    check_not_subclass,
    check_subclass,
    subclass_unflatten,
)
from thunderplug.tracing.aten import user_location
from thunderplug.tracing.fake import set_memory_order, tensor_memory_order
from thunderplug.tracing.trace_state import AutocastState, autocast_state


class UntraceableSubclassError(TypeError):
    """A torch.Tensor subclass without ``__tensor_flatten__``/``__tensor_unflatten__`` reached thunder."""


# -- inputs --------------------------------------------------------------------------------------


def proxify(original: Callable[..., Any]) -> Callable[..., Any]:
    """thunder creates input proxies through ``proxies.proxy()``, whose one hook is its call of
    ``proxify_dtensor``: a traceable subclass input becomes a :class:`SubclassTensorProxy` guarded
    by ``check_subclass``; a plain tensor gets a guard that it is not a subclass (else plain and
    subclass calls would share a cache entry)."""

    def replacement(x: Any, name: str | None = None, history: Any = None) -> Any:
        if not isinstance(x, torch.Tensor) or history is None or active_core_executor() is None:
            return original(x, name, history)
        if is_traceable_wrapper_subclass(x):  # DTensor too: the generic path, not thunder's DTensorProxy
            _refuse_dynamic_shape(x)
            return _subclass_input(x, name, history)
        result = original(x, name, history)
        if result is not None:
            return result
        if type(x) is not torch.Tensor and not isinstance(x, torch.nn.Parameter):
            raise UntraceableSubclassError(
                f"{type(x).__qualname__} is a torch.Tensor subclass without __tensor_flatten__/__tensor_unflatten__"
                f"{user_location()}; thunderplug cannot see through it. Make it a traceable wrapper subclass, or pass "
                "a plain tensor (e.g. x.as_subclass(torch.Tensor))."
            )
        proxy = proxies.tensorproxy(x, name=name, history=history)  # (read at the call: the dynamic sizes' patch)
        get_jit_ctx().add_constraint((check_not_subclass, proxy))
        return proxy

    return replacement


def _refuse_dynamic_shape(x: torch.Tensor) -> None:
    """thunder traces static shapes: a subclass whose size is symbolic (a jagged NestedTensor's
    nested int ``j1``) is refused by name, instead of failing later on an unexpected SymInt. An input, or one
    the function builds (``nested_tensor_from_jagged(values, offsets)``: proxied here too, at the user's line)."""
    if any(not isinstance(size, int) for size in x.shape):
        raise UntraceableSubclassError(
            f"{type(x).__qualname__} with a dynamic (nested int) dimension, shape {tuple(x.shape)}{user_location()}: "
            "thunder 0.2.6 traces static shapes only, so jagged NestedTensors are not supported, as inputs or made "
            "inside the function (docs/subclasses.md); pass its padded form (x.to_padded_tensor(0.0)), or keep the "
            "nested tensor outside the jitted function"
        )


def _subclass_input(x: torch.Tensor, name: str | None, history: Any) -> SubclassTensorProxy:
    """A subclass input, guarded in the prologue (type, flatten context, inner metadata).

    A frozen value that is not a Parameter has its inner tensors unpacked by the prologue
    (``t = x._data``) and is rebuilt at the top of the computation, where ops fold that away:
    nothing subclass-typed exists at run time. An input that requires grad is passed whole
    (autograd must see the subclass object, so that its subclass gradient reaches it), and so is
    a frozen ``nn.Parameter`` (what ``torchao.quantization.quantize_`` makes): thunder cannot
    unpack attributes of module parameters. Ops flatten whole inputs where they need them.
    """
    jit_ctx = get_jit_ctx()
    unpack = not x.requires_grad and not isinstance(x, torch.nn.Parameter)
    proxy = _subclass_proxy(x, name, history if unpack else None)
    proxy.history = history
    note_subclass_input(proxy.name, type(x), proxy.layout.ctx, history)
    jit_ctx.add_constraint((check_subclass, proxy, InputGuard.of(x)))
    if unpack:
        for inner in _plain_inner(proxy):
            jit_ctx.add_constraint((clang.check_tensor_shape_and_metadata, inner))
        get_tracectx().scopes[-1].append(subclass_unflatten.bind(proxy.layout, *proxy.inner.values(), output=proxy))
    return proxy


def _subclass_proxy(x: torch.Tensor, name: str | None, history: Any) -> SubclassTensorProxy:
    """A proxy for ``x`` with one proxy per inner tensor (recursively); with ``history``, the inner
    proxies remember where they are read from (``LOAD_ATTR``), so the prologue can unpack them."""
    layout = SubclassLayout.of(x)
    inner: dict[str, TensorProxy] = {}
    for attr in layout.attrs:
        value = getattr(x, attr)
        inner_name = f"{name}_{attr.strip('_')}" if name else None
        inner_history = None if history is None else _attribute_history(history, attr)
        if is_traceable_wrapper_subclass(value):
            inner[attr] = _subclass_proxy(value, inner_name, inner_history)
        else:
            inner[attr] = tensorproxy(value, name=inner_name, history=inner_history)
            set_memory_order(inner[attr], tensor_memory_order(value))
    return SubclassTensorProxy(layout, inner, outer=x, name=name, history=history)


def _attribute_history(history: Any, attr: str) -> ProvenanceRecord:
    return ProvenanceRecord(
        PseudoInst.LOAD_ATTR, inputs=[history, ProvenanceRecord(PseudoInst.CONSTANT, inputs=[], value=attr)]
    )


def _plain_inner(proxy: SubclassTensorProxy) -> list[TensorProxy]:
    return [
        leaf
        for inner in proxy.inner.values()
        for leaf in (_plain_inner(inner) if isinstance(inner, SubclassTensorProxy) else [inner])
    ]


# -- ops -------------------------------------------------------------------------------------------


def symbol_call(original: Callable[..., Any]) -> Callable[..., Any]:
    """A symbol called with a subclass proxy records the subclass op symbol instead
    (``TwoTensor.torch.mul``): this one place catches ``torch.mul(x, 2)``, ``x * 2``, ``x.mul(2)``,
    ``torch.ops.aten.mul.Tensor(x, 2)`` and the ops grad rules emit."""

    def replacement(self: Symbol, *args: Any, **kwargs: Any) -> Any:
        if active_core_executor() is not None:
            if returns_input_unchanged(self, args, kwargs):
                return args[0]  # eager's ``x.to(x.dtype) is x``: no copy whose gradients would be summed apart
            if (rewritten := eager_arguments(self, args, kwargs)) is not None:
                args, kwargs = rewritten  # lerp's start broadcast, as eager's kernel does
        if has_subclass_proxy(args, kwargs) and not passes_through(self):
            core = active_core_executor()
            if core is not None and is_in_place(self, args, kwargs):
                return decompose_in_place(self, args, kwargs)
            if core is not None and (bound := bind_aliasing_prim(self, args, kwargs)) is not NotImplemented:
                return bound
            if core is not None:
                subclass_op = dispatch(self, core.aten, args, kwargs)
                if subclass_op is not None:
                    return subclass_op(*args, **kwargs)
        try:
            result = original(self, *args, **kwargs)
        except NotImplementedError as error:  # a result shape that depends on values: the graph breaks there
            if active_core_executor() is not None and (data_dependent := as_data_dependent(self, error)) is not None:
                raise data_dependent from error
            raise
        if self is prims.get_grad and isinstance(result, SubclassTensorProxy):
            result.layout = tangent_layout(args[0])  # the gradient's assumed type, as AOTAutograd guesses it
        return result

    return replacement


def isinstance_lookaside(original: Callable[..., Any]) -> Callable[..., Any]:
    """``isinstance(x, Float8TrainingTensor)`` answers with the real subclass of a subclass proxy."""

    def replacement(obj: Any, cls: Any) -> Any:
        value = unwrap(obj)
        if not isinstance(value, SubclassTensorProxy):
            return original(obj, cls)
        classes = unwrap(cls)
        result = issubclass(value.subclass_type, classes if isinstance(classes, tuple) else (classes,))
        provenance = ProvenanceRecord(
            PseudoInst.LOOKASIDE, inputs=[wrap_const(isinstance).provenance, obj.provenance, cls.provenance]
        )
        return wrap(result, provenance=provenance)

    return replacement


def type_call(original: Callable[..., Any]) -> Callable[..., Any]:
    """Constructing a traceable subclass inside jitted code becomes ``<Class>.construct`` traced on
    fakes (thunder would interpret ``__new__`` and fail on ``Unknown attribute stride``)."""

    def replacement(wrapped_type: Any, *args: Any, **kwargs: Any) -> Any:
        cls = unwrap(wrapped_type)
        if is_traceable_wrapper_subclass_type(cls) and active_core_executor() is not None:
            values = [unwrap(a) for a in (*args, *kwargs.values())]
            if any(isinstance(v, TensorProxy) for v in values):
                return interpreter_needs_wrap(lambda *a, **k: construct(cls, a, k))(*args, **kwargs)
        return original(wrapped_type, *args, **kwargs)

    return replacement


def function_apply(original: Callable[..., Any]) -> Callable[..., Any]:
    """``SomeFunction.apply`` becomes one op traced on fakes (its forward, and its own backward
    through ``torch.autograd.grad``, both through ``__torch_dispatch__``) when a plugin claimed the
    Function whole (``FunctionClaim``) or tensor subclasses flow through it.

    thunder would interpret the Function's backward at once, for a cotangent guessed to have the
    output's type; eager gives whatever the ops after it produce (often a plain tensor), and
    Python code in the backward (``g.materialize() if isinstance(g, ScaledTensor) else g``) must
    see that. As one op, the backward is traced when autodiff knows the real cotangent, and
    traced again (``executor._retrace_stale``) if it learns a different type later. Functions
    that cannot be traced on fakes keep thunder's interpretation."""

    def replacement(wrapped_cls: Any, *args: Any, **kwargs: Any) -> Any:
        cls = unwrap(wrapped_cls)
        if active_core_executor() is None:
            return original(wrapped_cls, *args, **kwargs)
        display = f"{cls.__name__}.apply"
        values = ([unwrap(a) for a in args], {k: unwrap(v) for k, v in kwargs.items()})
        claimed, replacement = _claimed_whole(cls)
        autocast = autocast_state()
        if not (claimed or _involves_subclasses(display, cls.apply, *values, autocast)):
            return original(wrapped_cls, *args, **kwargs)
        symbol = unrolled_op_symbol(display, replacement or cls.apply, autocast=autocast)
        return interpreter_needs_wrap(lambda *a, **k: symbol(*a, **k))(*args, **kwargs)

    return replacement


def _claimed_whole(cls: type) -> tuple[bool, Callable[..., Any] | None]:
    """Whether a plugin claimed the Function whole, and the replacement it gave for ``apply``."""
    from thunder.core.compile_data import get_compile_data

    name = f"{cls.__module__}.{cls.__qualname__}"
    for executor in get_compile_data().executors_list:
        whole = getattr(executor, "whole_functions", {})
        if name in whole:
            return True, whole[name]
    return False, None


def _involves_subclasses(
    display: str, fn: Callable[..., Any], args: list, kwargs: dict, autocast: AutocastState
) -> bool:
    if has_subclass_proxy(tuple(args), kwargs):
        return True
    if not any(isinstance(v, TensorProxy) for v in (*args, *kwargs.values())):
        return False
    try:
        plans = traced(display, fn, tuple(args), kwargs, autocast).plans
    except SubclassDispatchError:
        return False
    return any(isinstance(plan, SubclassOutput) for plan in plans)


# -- eager semantics of tensor attributes -------------------------------------------------------


def dtype_property(original: Callable[..., Any]) -> Callable[..., Any]:
    """``x.dtype`` inside jitted code is a torch dtype, as in eager: thunder 0.2.6 gives its own
    dtype objects, which compare unequal to torch's (``x.dtype == torch.float32`` is False), and
    breaks library checks such as torchao MX's ``x.dtype in (torch.bfloat16, torch.float)``."""
    as_torch = interpreter_needs_wrap(lambda proxy: dtypes.to_torch_dtype(proxy.dtype))

    def replacement(*args: Any, **kwargs: Any) -> Any:
        if active_core_executor() is None:
            return original(*args, **kwargs)
        return as_torch(*args, **kwargs)

    return replacement


# -- in-place ops --------------------------------------------------------------------------------


def new_alias(original: Callable[..., Any]) -> Callable[..., Any]:
    """thunder's alias updates give every alias of a value an in-place op touched a fresh proxy,
    always a plain ``TensorProxy``: an alias of a subclass value gets a subclass proxy, so that
    later ops on it stay subclass ops."""

    def replacement(alias: Any, trace: Any) -> Any:
        proxy = alias.proxy
        if not isinstance(proxy, SubclassTensorProxy) or active_core_executor() is None:
            return original(alias, trace)
        with tracectx(trace):
            return SubclassTensorProxy(like=proxy, requires_grad=proxy.requires_grad)

    return replacement
