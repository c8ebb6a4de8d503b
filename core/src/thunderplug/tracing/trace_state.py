"""The torch state a graph traced on fakes depends on besides its inputs: autocast, grad mode,
default dtype and device, deterministic mode and the ``torch.backends`` flags.

Process-wide caches of traced graphs, recorded replays and checked metas key on it, so a graph
traced in one state is never reused in another. Autocast and grad mode are read from the
compilation in progress (thunder tracks ``with torch.autocast(...)`` / ``torch.no_grad()`` inside
the jitted function in its compile data, not in torch's own state); the rest is torch's.

Autocast applies to the torch ops the program calls (``F.linear`` on a subclass value casts its
inputs first), never to the ATen ops of a traced graph: thunder runs computation traces under
``no_autocast``, so ATen ops are traced, checked and replayed with autocast off
(:func:`without_autocast`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from thunder.core import dtypes

#: the device types thunder's autocast tracks (``AutocastStack``, ``populate_cache_info``)
_THUNDER_AUTOCAST_DEVICES = ("cpu", "cuda")
_AUTOCAST_DEVICES = tuple(
    d for d in ("cpu", "cuda", "xpu", "mps", "hpu", "mtia", "xla", "ipu", "privateuseone")
    if torch.amp.is_autocast_available(d)
)

#: per device type, the autocast dtype, or ``None`` where autocast is off
AutocastState = tuple[tuple[str, torch.dtype | None], ...]

NO_AUTOCAST: AutocastState = tuple((device, None) for device in _AUTOCAST_DEVICES)


def autocast_state() -> AutocastState:
    """The autocast a torch op called here gets in eager: from thunder's autocast stack in a
    compilation (the caller's autocast and the function's own ``torch.autocast`` blocks), else torch's."""
    from thunder.core.compile_data import get_compile_data

    compile_data = get_compile_data()
    if compile_data is None:
        return tuple(
            (d, torch.get_autocast_dtype(d) if torch.is_autocast_enabled(d) else None) for d in _AUTOCAST_DEVICES
        )
    stack = compile_data.autocast_stack
    state = []
    for device in _AUTOCAST_DEVICES:
        found = stack.get_dtype_for_device_if_enabled(device) if device in _THUNDER_AUTOCAST_DEVICES else None
        state.append((device, None if found is None else dtypes.to_torch_dtype(found)))
    return tuple(state)


@contextlib.contextmanager
def applied_autocast(state: AutocastState) -> Iterator[None]:
    """torch's autocast set to ``state`` for a block (the autocast cache off: fakes must not be cached)."""
    before = [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d, _ in state]
    cache = torch.is_autocast_cache_enabled()
    try:
        torch.set_autocast_cache_enabled(False)
        for device, dtype in state:
            torch.set_autocast_enabled(device, dtype is not None)
            if dtype is not None:
                torch.set_autocast_dtype(device, dtype)
        yield
    finally:
        for device, enabled, dtype in before:
            torch.set_autocast_enabled(device, enabled)
            torch.set_autocast_dtype(device, dtype)
        torch.set_autocast_cache_enabled(cache)


def without_autocast() -> contextlib.AbstractContextManager[None]:
    """Autocast off on every device type: how ATen ops of a trace run (thunder's ``no_autocast``)."""
    return applied_autocast(NO_AUTOCAST)


def grad_enabled() -> bool:
    """Grad mode at this point of the program: the compilation's (``torch.no_grad()`` blocks of the
    jitted function included), else torch's."""
    from thunder.core.compile_data import get_compile_data

    compile_data = get_compile_data()
    return compile_data.is_grad_enabled if compile_data is not None else torch.is_grad_enabled()


def factory_key() -> tuple[Any, ...]:
    """What the output metadata of one ATen op may depend on besides its arguments (with autocast
    off): the default dtype and device, which factory ops without a dtype or device take."""
    return (torch.get_default_dtype(), torch.get_default_device())


def ambient_key() -> tuple[Any, ...]:
    """Everything but autocast that a traced graph or a replay of it may depend on: grad mode,
    :func:`factory_key`, deterministic mode, and the backend flags that select kernels or
    decompositions (matmul precision, TF32, reduced-precision reductions, cuDNN, oneDNN,
    scaled-dot-product-attention backends)."""
    cuda, cudnn = torch.backends.cuda, torch.backends.cudnn
    return (
        grad_enabled(),
        *factory_key(),
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.get_float32_matmul_precision(),
        cuda.matmul.allow_tf32,
        cuda.matmul.allow_fp16_reduced_precision_reduction,
        cuda.matmul.allow_bf16_reduced_precision_reduction,
        cudnn.enabled,
        cudnn.allow_tf32,
        cudnn.deterministic,
        cudnn.benchmark,
        torch.backends.mkldnn.enabled,
        cuda.flash_sdp_enabled(),
        cuda.mem_efficient_sdp_enabled(),
        cuda.math_sdp_enabled(),
        cuda.cudnn_sdp_enabled(),
    )
