"""Tensor subclasses written for the tests: one with ctx metadata, one that is not traceable."""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_map

aten = torch.ops.aten


class ScaledTensor(torch.Tensor):
    """``data * scale`` with the scale in the flatten context (not an inner tensor).

    Some ops stay in the subclass (``mul`` by a number folds into the scale, ``t``/``neg`` keep
    it), others leave it (``add``, ``mm``, ``sin`` return plain tensors), and anything else is
    refused, as a real subclass would.
    """

    @staticmethod
    def __new__(cls, data: torch.Tensor, scale: float):
        return torch.Tensor._make_wrapper_subclass(
            cls,
            data.shape,
            strides=data.stride(),
            dtype=data.dtype,
            device=data.device,
            requires_grad=data.requires_grad,
        )

    def __init__(self, data: torch.Tensor, scale: float):
        self.data_ = data
        self.scale = scale

    def __repr__(self) -> str:
        return f"ScaledTensor({self.data_}, scale={self.scale})"

    def __tensor_flatten__(self):
        return ["data_"], {"scale": self.scale}

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return ScaledTensor(inner["data_"], ctx["scale"])

    def dequantize(self) -> torch.Tensor:
        return self.data_ * self.scale

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.mul.Tensor and isinstance(args[0], ScaledTensor) and isinstance(args[1], (int, float)):
            return ScaledTensor(args[0].data_, args[0].scale * args[1])
        if func in (aten.t.default, aten.neg.default, aten.clone.default, aten.detach.default):
            return ScaledTensor(func(args[0].data_, *args[1:], **kwargs), args[0].scale)
        dequantizing = (aten.add.Tensor, aten.mul.Tensor, aten.mm.default, aten.sin.default, aten.cos.default)
        if func in (*dequantizing, aten.sum.default):
            plain = tree_map(lambda a: a.dequantize() if isinstance(a, ScaledTensor) else a, args)
            return func(*plain, **kwargs)
        raise NotImplementedError(f"ScaledTensor does not support {func}")


class NotTraceable(torch.Tensor):
    """A subclass without __tensor_flatten__: thunderplug must refuse it, not erase it."""


def ambient_code() -> float:
    """A number telling apart the torch states a traced graph must be keyed by (for StateTensor)."""
    return (
        1.0 * torch.are_deterministic_algorithms_enabled()
        + 2.0 * torch.is_grad_enabled()
        + 4.0 * torch.backends.cudnn.benchmark
        + 8.0 * (not torch.backends.mkldnn.enabled)
    )


class StateTensor(torch.Tensor):
    """One inner tensor; ``mul`` also adds :func:`ambient_code` and a ``torch.ones`` of the default
    dtype, so its result depends on deterministic mode, grad mode, backend flags and the default
    dtype, as a dispatch (or a decomposition torch picks) may. Every other op passes through."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, strides=inner.stride(), dtype=inner.dtype, device=inner.device,
            requires_grad=inner.requires_grad,
        )

    def __init__(self, inner: torch.Tensor):
        self.inner = inner

    def __repr__(self) -> str:
        return f"StateTensor({self.inner})"

    def __tensor_flatten__(self):
        return ["inner"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return StateTensor(inner["inner"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        plain = tree_map(lambda a: a.inner if isinstance(a, StateTensor) else a, (args, kwargs or {}))
        out = func(*plain[0], **plain[1])
        if func is aten.mul.Tensor:
            out = out + torch.ones(out.shape, device=out.device) + ambient_code()
        return tree_map(lambda o: StateTensor(o) if isinstance(o, torch.Tensor) else o, out)
