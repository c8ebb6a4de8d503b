"""Tensor-subclass values in thunder traces, and the boundary ops that build and take them apart.

A :class:`SubclassTensorProxy` is a tensor proxy with the outer metadata of a traceable wrapper
subclass (``__tensor_flatten__`` / ``__tensor_unflatten__``), its flatten context, and one proxy
per inner tensor. Creating one records nothing; reading an inner tensor (``x._data``) records a
``subclass_flatten``. Traces print its type as ``Float8TrainingTensor[cpu f32[16, 32]]``.

The boundary ops run on thunder's python executor, only where a real subclass object is needed
at run time (inputs that require grad, outputs, cotangents).
"""

from __future__ import annotations

import inspect
import types
from typing import Any

import torch
from thunder.core import devices, dtypes
from thunder.core.prims import OpTags
from thunder.core.proxies import TensorProxy
from thunder.executors.pythonex import ex as pythonex
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from thunderplug.tracing.fake import fake_like, fake_mode, memory_order_of, set_memory_order, tensor_memory_order

SUBCLASS_OP_PREFIX = "thunderplug.subclass."


def subclass_op_id(display: str) -> str:
    """The symbol id of the subclass op shown as ``display`` (the one place ids are built)."""
    return SUBCLASS_OP_PREFIX + display


def is_subclass_op(symbol: Any) -> bool:
    """Whether ``symbol`` is a subclass op, which the core executor's fusion pass unrolls."""
    return isinstance(symbol.id, str) and symbol.id.startswith(SUBCLASS_OP_PREFIX)


class SubclassLayout:
    """How to rebuild one subclass value from its inner tensors: the ``__tensor_unflatten__`` arguments.

    Deliberately not a dataclass: thunder prints dataclasses field by field into generated code,
    while other objects are passed to it by reference.
    """

    __slots__ = ("cls", "attrs", "ctx", "outer_size", "outer_stride")

    def __init__(self, cls: type, attrs: tuple[str, ...], ctx: Any, outer_size: tuple, outer_stride: tuple):
        self.cls, self.attrs, self.ctx = cls, attrs, ctx
        self.outer_size, self.outer_stride = outer_size, outer_stride

    def unflatten(self, inner: dict[str, Any]) -> torch.Tensor:
        return self.cls.__tensor_unflatten__(inner, self.ctx, self.outer_size, self.outer_stride)

    def __repr__(self) -> str:
        return f"{self.cls.__name__}Layout(ctx={self.ctx!r})"

    def same_as(self, other: SubclassLayout) -> bool:
        """Whether a value of layout ``other`` can stand for one of this layout as it is: the same
        type and inner tensors, and, for a subclass that converts between contexts
        (``__coerce_same_metadata_as_tangent__``, e.g. DTensor's placements), the same context."""
        if self.cls is not other.cls or self.attrs != other.attrs:
            return False
        return self.ctx == other.ctx or not hasattr(self.cls, "__coerce_same_metadata_as_tangent__")

    def places_like(self, other: SubclassLayout) -> bool:
        """Whether a value of layout ``other`` is placed as one of this layout: for a DTensor, the
        same mesh and placements (what its sharding propagation decides by, unlike its flatten
        context's strides and ``requires_grad``); for other types, :meth:`same_as`."""
        if is_dtensor(self.cls) and self.cls is other.cls:
            mine, theirs = self.ctx[0], other.ctx[0]
            return mine.mesh == theirs.mesh and tuple(mine.placements) == tuple(theirs.placements)
        return self.same_as(other)

    @staticmethod
    def of(tensor: torch.Tensor) -> SubclassLayout:
        attrs, ctx = tensor.__tensor_flatten__()
        return SubclassLayout(type(tensor), tuple(attrs), ctx, tuple(tensor.shape), tuple(tensor.stride()))


def is_dtensor(cls: type) -> bool:
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return issubclass(cls, DTensor)


class SubclassTensorProxy(TensorProxy):
    """A proxy for a traceable wrapper subclass, carrying the proxies of its inner tensors."""

    def __init__(
        self,
        layout: SubclassLayout | None = None,
        inner: dict[str, TensorProxy] | None = None,
        *,
        outer: torch.Tensor | None = None,
        like: SubclassTensorProxy | None = None,
        **kwargs: Any,
    ):
        """From ``layout``, ``inner`` and ``outer`` (a real or fake instance giving the outer shape,
        dtype and device), or ``like=`` another subclass proxy, which gets fresh inner proxies
        (thunder makes cotangents this way: ``type(x)(like=x)``)."""
        if like is not None:
            super().__init__(like=like, **kwargs)
            self.layout = like.layout
            self.inner = {name: type(p)(like=p) for name, p in like.inner.items()}
            return
        super().__init__(
            shape=tuple(outer.shape),
            device=devices.to_device(outer.device),
            dtype=dtypes.to_dtype(outer.dtype),
            requires_grad=outer.requires_grad,
            **kwargs,
        )
        self.layout = layout
        self.inner = inner

    @property
    def subclass_type(self) -> type:
        return self.layout.cls

    def type_string(self) -> str:
        return f"{self.layout.cls.__name__}[{super().type_string()}]"

    def replace(self, **changes: Any) -> SubclassTensorProxy:
        """A renamed copy (thunder renames cotangents and saved values). Its inner proxies are
        fresh as well: sharing them would make a trace of the copy read the original's inner
        tensors, which the copy's trace never defines."""
        plain = super().replace(**changes)
        result = SubclassTensorProxy.__new__(SubclassTensorProxy)
        result.__dict__.update(plain.__dict__)
        result.layout = self.layout
        result.inner = {name: _renamed(p) for name, p in self.inner.items()}
        return result

    def fake(self) -> torch.Tensor:
        """A FakeTensor instance of the real subclass with this proxy's inner metadata."""
        return self.layout.unflatten({name: to_fake_tensor(p) for name, p in self.inner.items()})

    def __getattr__(self, name: str, /) -> Any:
        # Only reached for names TensorProxy itself does not define.
        inner = self.__dict__.get("inner")
        if inner is not None and name in inner:
            if inner[name].history is not None:  # an input's inner tensor, unpacked by the prologue
                return inner[name]
            return subclass_flatten(self, self.layout)[list(inner).index(name)]
        layout = self.__dict__.get("layout")
        if layout is None:
            return super().__getattr__(name)
        if _defined_by_subclass(layout.cls, name):
            attribute = inspect.getattr_static(layout.cls, name)
            if isinstance(attribute, types.FunctionType):  # a method: run its Python code on this proxy
                return types.MethodType(attribute, self)
        with fake_mode():
            fake = self.fake()
            found = name in vars(fake) or _defined_by_subclass(layout.cls, name)
            value = getattr(fake, name) if found else None
        if found:
            if isinstance(value, torch.Tensor):
                raise AttributeError(
                    f"{layout.cls.__name__}.{name} is a tensor that __tensor_flatten__ does not list; "
                    "thunderplug can only trace inner tensors the subclass flattens"
                )
            return value
        return super().__getattr__(name)


def _renamed(proxy: TensorProxy) -> TensorProxy:
    """A fresh proxy for the same tensor (same metadata and noted memory layout)."""
    renamed = type(proxy)(like=proxy)
    set_memory_order(renamed, memory_order_of(proxy))
    return renamed


def _defined_by_subclass(cls: type, name: str) -> bool:
    """True when ``name`` comes from the subclass itself, not from torch.Tensor."""
    for klass in cls.__mro__:
        if klass is torch.Tensor or klass is torch._C.TensorBase:
            return False
        if name in vars(klass):
            return True
    return False


def to_fake_tensor(proxy: TensorProxy) -> torch.Tensor:
    if isinstance(proxy, SubclassTensorProxy):
        return proxy.fake()
    return fake_like(proxy)


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
    return tuple(_renamed(inner) for inner in value.inner.values())


def _flatten(value: torch.Tensor, layout: SubclassLayout) -> tuple[torch.Tensor, ...]:
    if type(value) is not layout.cls or not layout.same_as(SubclassLayout.of(value)):
        value = _coerce_tangent(value, layout)
    return tuple(getattr(value, name) for name in layout.attrs)


def _coerce_tangent(value: torch.Tensor, layout: SubclassLayout) -> torch.Tensor:
    """A gradient that arrived with another type (or, same type, another context: a DTensor with
    other placements) than the one the backward was traced for."""
    coerce = getattr(value, "__coerce_same_metadata_as_tangent__", None)
    coerced = None
    if coerce is not None:  # torch's protocol: the expected type only when it differs
        coerced = coerce(layout.ctx) if type(value) is layout.cls else coerce(layout.ctx, layout.cls)
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


class InputGuard:
    """What the prologue checks of a subclass input: its type, inner tensor names, flatten context
    (or ``__metadata_guard__``) and every inner tensor's shape, dtype, device and requires_grad,
    recursively. Not a dataclass, for the same reason as :class:`SubclassLayout`."""

    __slots__ = ("layout", "inner")

    def __init__(self, layout: SubclassLayout, inner: dict[str, Any]):
        self.layout, self.inner = layout, inner

    @staticmethod
    def of(tensor: torch.Tensor) -> InputGuard:
        layout = SubclassLayout.of(tensor)
        inner: dict[str, Any] = {}
        for name in layout.attrs:
            value = getattr(tensor, name)
            inner[name] = InputGuard.of(value) if is_traceable_wrapper_subclass(value) else _tensor_metadata(value)
        return InputGuard(layout, inner)

    def __repr__(self) -> str:
        return f"InputGuard({self.layout!r})"


def _tensor_metadata(tensor: torch.Tensor) -> tuple:
    """What the traces of ops on an inner tensor depend on (its memory order too: ``fake_like``)."""
    return (tuple(tensor.shape), tensor.dtype, tensor.device, tensor.requires_grad, tensor_memory_order(tensor))


def _check_subclass(value: Any, guard: InputGuard) -> None:
    layout = guard.layout
    if type(value) is not layout.cls:
        raise TypeError(f"expected {layout.cls.__name__}, got {type(value).__name__}")
    attrs, ctx = value.__tensor_flatten__()
    if tuple(attrs) != layout.attrs:
        raise ValueError(f"{layout.cls.__name__} inner tensors changed: {attrs} != {layout.attrs}")
    metadata_guard = getattr(layout.cls, "__metadata_guard__", None)
    if not (metadata_guard(layout.ctx, ctx) if metadata_guard is not None else ctx == layout.ctx):
        raise ValueError(f"{layout.cls.__name__} flatten context changed: {ctx!r} != {layout.ctx!r}")
    for name, expected in guard.inner.items():
        inner = getattr(value, name)
        if isinstance(expected, InputGuard):
            _check_subclass(inner, expected)
        elif type(inner) is not torch.Tensor and is_traceable_wrapper_subclass(inner):
            raise TypeError(f"{layout.cls.__name__}.{name}: expected a plain tensor, got {type(inner).__name__}")
        elif _tensor_metadata(inner) != expected:
            raise ValueError(f"{layout.cls.__name__}.{name} changed: {_tensor_metadata(inner)} != {expected}")


check_subclass = pythonex.register_operator(
    "check_subclass", meta=lambda value, guard: None, fn=_check_subclass, tags=(OpTags.DONT_DCE,)
)


def _check_not_subclass(value: Any) -> None:
    if type(value) is not torch.Tensor and is_traceable_wrapper_subclass(value):
        raise TypeError(f"expected a plain tensor, got {type(value).__name__}")


check_not_subclass = pythonex.register_operator(
    "check_not_subclass", meta=lambda value: None, fn=_check_not_subclass, tags=(OpTags.DONT_DCE,)
)
