"""Tensor-subclass values in thunder traces.

A :class:`SubclassTensorProxy` is a tensor proxy with the outer metadata of a traceable wrapper
subclass (``__tensor_flatten__`` / ``__tensor_unflatten__``), its flatten context, and one proxy
per inner tensor. It has no side effects on the trace: creating one records nothing, reading an
inner tensor (``x._data``) returns the inner proxy. Traces print its type as
``Float8TrainingTensor[cpu f32[16, 32]]``.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

import torch
from thunder.core import devices, dtypes
from thunder.core.proxies import TensorProxy

from thunderplug.fake import fake_like, fake_mode


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

    @staticmethod
    def of(tensor: torch.Tensor) -> SubclassLayout:
        attrs, ctx = tensor.__tensor_flatten__()
        return SubclassLayout(type(tensor), tuple(attrs), ctx, tuple(tensor.shape), tuple(tensor.stride()))


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
            self.inner = {name: _fresh_like(p) for name, p in like.inner.items()}
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
        plain = super().replace(**changes)
        result = SubclassTensorProxy.__new__(SubclassTensorProxy)
        result.__dict__.update(plain.__dict__)
        result.layout, result.inner = self.layout, self.inner
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
            from thunderplug.subclass_ops import subclass_flatten  # reading it is an op on this value

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


def _fresh_like(proxy: TensorProxy) -> TensorProxy:
    return type(proxy)(like=proxy)


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
