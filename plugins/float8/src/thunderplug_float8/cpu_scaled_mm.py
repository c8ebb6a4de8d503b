"""A faster CPU kernel for ``aten._scaled_mm`` with tensorwise scales, bit-identical to torch's.

Why: without oneDNN's AMX path, torch 2.9 emulates ``_scaled_mm`` on CPU: it copies both operands
contiguous (the second operand of every float8 Linear is column-major, so its float8 data is
transposed in memory first), widens them to float32 with a scalar conversion of about 6 ns per
element, scales them, multiplies and copies the result once more. In a float8 MLP step on CPU
those copies take about half the time, more than the matrix products.

What this kernel does differently, each step exact:
  * e4m3fn bits shifted into float16 bits give the same number times 2**-8, subnormals
    included (float16 has the exponent range to spare), and float16 widens to float32 quickly
    (7 ms instead of 27 for a 4096x1024 weight on this machine's CPU);
    the 2**8 goes into the scale, which stays exact. e5m2 is the upper byte of a float16. NaN
    encodings, which the shift would turn into numbers, are put back as NaN.
  * no copy of the first operand that torch makes and never reads, and no copy of the result
    into a preallocated output.
It keeps the layouts torch multiplies in (the second operand contiguous, the first as it is):
``mm`` of the same values in another layout can round differently (a 4-row product did).

It runs only where torch itself would emulate: CPU float8 operands, one float32 scale each, a
float32/bfloat16/float16 result and no oneDNN AMX route (checked at run time, since
``torch.backends.mkldnn.enabled`` can change between calls); elsewhere it calls torch's op, as it
does on a torch that cannot say whether AMX would run (2.11 and later: the emulation it matches
bit for bit is torch 2.9's and 2.10's).
"""

from __future__ import annotations

from typing import Any

import torch
from thunder.core import devices, dtypes
from thunder.core.proxies import TensorProxy

_FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_RESULTS = (torch.float32, torch.bfloat16, torch.float16)
#: e4m3fn bits moved into float16 bits stand for the value times 2**-8
_E4M3_IN_FLOAT16 = 256.0
#: the magnitude bits of e4m3fn's only NaN encodings (S.1111.111)
_E4M3_NAN = 0x7F
#: float16's sign bit and bits 7..13, as a (negative) int16
_HALF_SIGN_AND_E4M3_BITS = -0x8000 | 0x3F80


def scaled_mm_checker(
    a: Any, b: Any, scale_a: Any, scale_b: Any, bias: Any = None, scale_result: Any = None,
    out_dtype: Any = None, use_fast_accum: bool = False,
) -> str | None:
    for operand in (a, b):
        if not isinstance(operand, TensorProxy) or operand.device.devicetype is not devices.DeviceType.CPU:
            return "needs CPU tensors"
        if dtypes.to_torch_dtype(operand.dtype) not in _FLOAT8 or operand.ndim != 2:
            return "needs 2-D float8_e4m3fn or float8_e5m2 operands"
    for scale in (scale_a, scale_b):
        if not isinstance(scale, TensorProxy) or scale.numel != 1 or scale.dtype is not dtypes.float32:
            return "needs one float32 scale per operand (tensorwise)"
    if scale_result is not None:
        return "needs no result scale"
    if out_dtype is None or dtypes.to_torch_dtype(out_dtype) not in _RESULTS:
        return "needs a float32, bfloat16 or float16 result"
    return None


def scaled_mm(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
    bias: torch.Tensor | None = None, scale_result: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None, use_fast_accum: bool = False,
) -> torch.Tensor:
    if _onednn_would_run(a, b):
        return torch.ops.aten._scaled_mm.default(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)
    # as torch: ``b`` contiguous, ``a`` in its own layout (``mm``'s bits depend on the layouts)
    out = torch.mm(_scaled(*_widened(a), scale_a), _scaled(*_widened(b.contiguous()), scale_b))
    if bias is not None:
        out.add_(bias)
    return out.to(out_dtype)


def _onednn_would_run(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether torch routes this call to oneDNN's AMX kernel instead of its emulation."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return False
    predicate = "_is_amx_tile_supported" if a.dtype == b.dtype else "_is_amx_fp16_supported"
    supported = getattr(torch._C._cpu, predicate, None)
    # torch 2.11 dropped these predicates: its own op then, whatever route it takes there
    return supported is None or bool(supported())


def _widened(x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """``(w, unit)`` with ``w * unit`` equal to ``x.to(torch.float32)``, in ``x``'s layout."""
    if x.dtype == torch.float8_e5m2:
        return (x.view(torch.uint8).to(torch.int16) << 8).view(torch.float16).to(torch.float32), 1.0
    # sign-extended to 16 bits and shifted by 7, the sign lands on bit 15 and the other seven
    # bits on bits 7..13, where float16 keeps its low exponent and mantissa bits
    half_bits = x.view(torch.int8).to(torch.int16) << 7
    half_bits &= _HALF_SIGN_AND_E4M3_BITS
    wide = half_bits.view(torch.float16).to(torch.float32)
    magnitude = x.view(torch.uint8) & 0x7F
    if int(magnitude.max()) == _E4M3_NAN:  # a one-byte pass instead of a mask when there is no NaN
        wide = wide.masked_fill(magnitude == _E4M3_NAN, float("nan"))
    return wide, _E4M3_IN_FLOAT16


def _scaled(wide: torch.Tensor, unit: float, scale: torch.Tensor) -> torch.Tensor:
    """``wide * unit * scale`` rounded once, as torch's ``value * scale``: ``unit`` is a power of
    two, so ``unit * scale`` is exact unless it leaves float32's normal range."""
    value = scale.item()
    product = unit * value
    if torch.tensor(product, dtype=torch.float32).item() == product:
        return wide * product
    return (wide * unit) * value
