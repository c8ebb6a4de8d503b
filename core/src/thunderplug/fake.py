"""FakeTensor stand-ins for thunder proxies: how the core reads metadata from torch instead of guessing."""

from __future__ import annotations

import threading
from typing import Any

import torch
from thunder.core import devices, dtypes
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


def fake_like(proxy: TensorProxy) -> torch.Tensor:
    """A FakeTensor with the proxy's shape, dtype and device (thunder proxies carry no strides)."""
    shape = tuple(int(s) for s in proxy.shape)
    with fake_mode():
        return torch.empty_strided(
            shape,
            contiguous_strides(shape),
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
