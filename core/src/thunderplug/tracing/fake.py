"""FakeTensor stand-ins for thunder proxies: how the core reads metadata from torch instead of guessing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from thunder.core import devices, dtypes, prims
from thunder.core.proxies import NumberProxy, TensorProxy
from thunder.core.pytree import tree_map
from torch._subclasses.fake_tensor import FakeTensorMode

_per_thread = threading.local()


def fake_mode() -> FakeTensorMode:
    """This thread's mode. Fake tensors of different modes cannot be mixed in one op, so each
    thread uses one mode for all its compilations; a mode entered from two threads at once
    corrupts its state ("Attempted to unset FakeTensorMode"), so no two threads share one."""
    mode = getattr(_per_thread, "mode", None)
    if mode is None:
        mode = _per_thread.mode = FakeTensorMode(allow_non_fake_inputs=True)
    return mode


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, running = [], 1
    for size in reversed(shape):
        strides.append(running)
        running *= max(size, 1)
    return tuple(reversed(strides))


# -- memory layouts: thunder proxies carry no strides, so thunderplug notes the ones it knows ----------

#: the attribute of a thunder proxy holding the memory order thunderplug knows for it
_MEMORY_ORDER = "thunderplug_memory_order"


def memory_order(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...] | None:
    """The dims of a dense, non-overlapping tensor from outermost to innermost in memory (a
    transposed matrix: ``(1, 0)``), or ``None`` when the layout is contiguous or not dense (a
    slice with gaps, an expanded dim): those are traced as contiguous."""
    order = tuple(sorted(range(len(shape)), key=lambda dim: -stride[dim]))  # stable: ties keep dim order
    if order == tuple(range(len(shape))):
        return None
    dense = strides_in_order(shape, order)
    if any(size != 1 and actual != expected for size, actual, expected in zip(shape, stride, dense)):
        return None
    return order


def tensor_memory_order(tensor: torch.Tensor) -> tuple[int, ...] | None:
    """``memory_order`` of a real or fake tensor."""
    return memory_order(tuple(tensor.shape), tuple(tensor.stride()))


def set_memory_order(proxy: TensorProxy, order: tuple[int, ...] | None) -> None:
    """Note the layout of the tensor ``proxy`` stands for (``tensor_memory_order`` of a real or fake one)."""
    setattr(proxy, _MEMORY_ORDER, order)


def memory_order_of(proxy: TensorProxy) -> tuple[int, ...] | None:
    """The layout noted for ``proxy``; ``None`` (contiguous) where none was."""
    return getattr(proxy, _MEMORY_ORDER, None)


def note_permuted_layout(bsym: Any) -> None:
    """Note the layout of a permutation's output (``weight.t()``: transposed) when ``bsym`` is one.

    Its input's layout is the noted one, or contiguous: every op that reads the output coerces it
    to the layout it was traced for, so a guess is never wrong, only a copy where it misses. Guessing
    contiguous for ``weight.t()`` made every float8 Linear copy its weight transposed, twice a step.
    """
    permute = _only_permutation(bsym)
    if permute is None:
        return
    source, permutation = permute.args[0], tuple(permute.args[1])
    out = bsym.flat_proxy_outs
    if not isinstance(source, TensorProxy) or len(out) != 1 or not isinstance(out[0], TensorProxy):
        return
    source_order = memory_order_of(source) or tuple(range(len(permutation)))
    order = tuple(permutation.index(dim) for dim in source_order)
    set_memory_order(out[0], None if order == tuple(range(len(order))) else order)


def _only_permutation(bsym: Any) -> Any:
    """The transpose prim ``bsym`` consists of (``x.t()``, ``x.permute(...)``), if that is all it is."""
    if bsym.sym.id is prims.PrimIDs.TRANSPOSE:
        return bsym
    if len(bsym.subsymbols) == 1:
        return _only_permutation(bsym.subsymbols[0])
    return None


def strides_in_order(shape: tuple[int, ...], order: tuple[int, ...] | None) -> tuple[int, ...]:
    """The strides of a dense tensor of ``shape`` whose dims lie in memory in ``order``."""
    if order is None:
        return contiguous_strides(shape)
    dense = contiguous_strides(tuple(shape[dim] for dim in order))
    strides = [0] * len(shape)
    for dim, stride in zip(order, dense):
        strides[dim] = stride
    return tuple(strides)


def fake_like(proxy: TensorProxy) -> torch.Tensor:
    """A FakeTensor with the proxy's shape, dtype, device and noted memory layout (contiguous
    where none was noted: thunder proxies carry no strides)."""
    shape = tuple(int(s) for s in proxy.shape)
    with fake_mode():
        return torch.empty_strided(
            shape,
            strides_in_order(shape, memory_order_of(proxy)),
            dtype=dtypes.to_torch_dtype(proxy.dtype),
            device=devices.to_torch_device(proxy.device),
        )


def to_torch_value(x: Any) -> Any:
    """A thunder dtype or device (what traces hold) as torch's; anything else as it is."""
    if isinstance(x, dtypes.dtype):
        return dtypes.to_torch_dtype(x)
    if isinstance(x, devices.Device):
        return devices.to_torch_device(x)
    return x


def to_fake(tree: Any) -> Any:
    """Replace tensor proxies by FakeTensors and number proxies by their values, recursively."""

    def convert(x: Any) -> Any:
        if isinstance(x, TensorProxy):
            return fake_like(x)
        if isinstance(x, NumberProxy):
            return x.value
        return to_torch_value(x)

    return tree_map(convert, tree)


# -- cache keys: what a traced op's result depends on ------------------------------------------------


def value_key(value: Any) -> Any:
    """How one argument enters a cache key of traced ops: a tensor by its shape, dtype, device and
    requires_grad and noted memory layout, a number or constant by its value (containers frozen).
    Raises ``TypeError`` for what cannot be a key (a real tensor constant, a symbolic size)."""
    if isinstance(value, TensorProxy):
        shape = tuple(frozen(s) for s in value.shape)
        return ("tensor", shape, value.dtype, value.device, value.requires_grad, memory_order_of(value))
    if isinstance(value, NumberProxy):
        return ("number", type(value.value), value.value)
    return ("constant", type(value), frozen(value))


def frozen(value: Any) -> Any:
    """Dicts, lists and tuples as nested tuples (hashable when their items are)."""
    if isinstance(value, dict):
        return ("dict", tuple((k, frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(frozen(v) for v in value))
    if isinstance(value, torch.Tensor):
        raise TypeError("tensors are not metadata")
    if isinstance(getattr(value, "sym", None), torch.SymInt):
        # a tracked size (caching.dynamic_sizes): its value is this call's only, and hashing it would record
        # a specialization; what is computed from it is cached per compilation, where at all
        raise TypeError("a symbolic size is no process-wide key")
    return value


def hashable_or_none(build: Callable[[], Any]) -> Any:
    """``build()`` if it gives a hashable key, else ``None`` (the caller then does not cache)."""
    try:
        key = build()
        hash(key)
    except TypeError:
        return None
    return key
