"""Where nvFuser cannot run: thunder's torch.compile fuser, with float8 tensors kept out of it.

torch 2.9.1's inductor miscompiles float8 on CPU (a 64-byte vector store into a 16-byte tile row
of the backward's transposed fp8 tile, pytorch/pytorch#167451, fixed after 2.9.1): the process
dies with SIGSEGV. Any operation that reads or writes a float8 tensor is therefore left to the
executors after this one (the ``aten`` executor, thunder's ``torch``); everything else fuses.
"""

from __future__ import annotations

from thunder.core import dtypes
from thunder.core.proxies import TensorProxy
from thunder.core.symbol import BoundSymbol
from thunder.executors.torch_compile import TorchCompileExecutor
from thunder.executors.torchex import ex as torch_executor
from thunder.extend import ImplInfo

NAME = "torchcompile_no_fp8"
_FLOAT8 = {dtypes.float8_e4m3fn, dtypes.float8_e5m2, dtypes.float8_e4m3fnuz, dtypes.float8_e5m2fnuz}


def touches_float8(bsym: BoundSymbol) -> bool:
    values = (*bsym.flat_proxy_args, *bsym.flat_proxy_outs)
    if any(isinstance(v, TensorProxy) and dtypes.to_dtype(v.dtype) in _FLOAT8 for v in values):
        return True
    return any(touches_float8(sub) for sub in bsym.subsymbols)


class Float8FreeTorchCompileExecutor(TorchCompileExecutor):
    def can_fuse(self, bsym: BoundSymbol) -> bool:
        return not touches_float8(bsym) and super().can_fuse(bsym)

    def can_execute(self, bsym: BoundSymbol) -> bool:
        return not touches_float8(bsym) and super().can_execute(bsym)


def build_executor() -> Float8FreeTorchCompileExecutor:
    executor = Float8FreeTorchCompileExecutor(NAME)
    executor._implmap = {op: ImplInfo() for op in torch_executor.implmap}
    return executor
