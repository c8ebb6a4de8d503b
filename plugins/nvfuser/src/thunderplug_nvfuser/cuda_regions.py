"""Where CUDA exists but nvFuser does not: runs of claimed low-precision ops as torch.compile regions.

Unlike thunder's ``torchcompile`` executor, this one claims nothing while thunder chooses gradient
rules and operator executors: its ``can_fuse`` answers only for a symbol an executor already owns
(thunder's ``torch``, thunderplug-aten's ``aten`` and its eager kernels). So every op keeps the
gradient rule and the kernel eager's numbers come from (ATen's LayerNorm, SDPA, GELU backward), and
the region's code calls exactly those kernels: inductor then fuses what torch.compile with torchao
fuses around ``_scaled_mm`` (amax, scale, saturated cast, transposed copies), from the same ATen ops.

Which ops join a region, and why:

* every tensor is on CUDA (a CPU scalar or a CPU program stays op by op: torch 2.9.1's CPU inductor
  miscompiles float8, ``cpu_fallback``);
* a region is compiled only if one of its tensors is 16-bit or 8-bit floating point: an fp32 program
  stays op by op and bit-identical to eager, while bf16 and float8 work (its fp32 scales included),
  whose rounding is already coarse, is fused. ``fuse_fp32=True`` (``THUNDERPLUG_CUDA_FUSE_FP32=1``)
  compiles groups with an fp32 tensor too: inductor's fused kernels round and sum in their own order, so
  fp32 values and gradients are then within a stated tolerance of eager's, no longer bit-identical
  (:data:`FP32_TOLERANCE`); float64-only groups stay op by op;
* no random numbers (inductor draws its own stream, so dropout masks would differ from eager's)
  and no in-place writes (thunder orders those itself).

What a backward region recomputes: thunder's rematerialization runs on the joint trace and moves forward
work into the backward region wherever that saves memory; it keeps only the outputs of ops tagged
``MATMUL_OP``, ``REDUCTION_OP`` or ``RANDOM_OP``. The kernels the regions hold (eager's ``linear`` and
SDPA, ATen overloads, ``_scaled_mm``) carry no tag, so a GPT block's backward region recomputed 5 of its 6
linears and the SDPA forward (issue 43). :func:`never_recomputed` names the compute-bound ops (matrix
products, attention, convolutions), which :meth:`CudaRegionExecutor.fuse` tags ``MATMUL_OP``: as in
torch.compile's min-cut partitioner, their outputs (or smaller tensors computed from them) are saved, while
cheap elementwise work may still be recomputed.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from thunder.core import dtypes, prims, utils
from thunder.core.codeutils import SigInfo
from thunder.core.proxies import Proxy, TensorProxy, unvariableify
from thunder.core.pytree import tree_map
from thunder.core.rematerialization import rematerialize
from thunder.core.symbol import BoundSymbol, Symbol, has_tags
from thunder.core.trace import TraceCtx, from_trace, tracectx
from thunder.core.transform_common import dce
from thunder.executors.data_dependent_partition import Node, fuse_bound_symbols
from thunder.executors.passes import update_fusion_call_ctx
from thunder.executors.torch_compile import TorchCompileExecutor
from thunder.executors.torchex import no_autocast
from thunder.executors.utils import Region

from thunderplug.tracing.fake import to_torch_value

NAME = "torchcompile_cuda"

#: executors whose ops a region may run: their implementations are plain calls of torch functions
#: and ATen overloads, which Dynamo traces into one graph
FUSIBLE_OWNERS = frozenset({"torch", "aten", "eager_kernels", "eager_backward_kernels"})

_LOW_PRECISION = frozenset(
    {
        dtypes.bfloat16,
        dtypes.float16,
        dtypes.float8_e4m3fn,
        dtypes.float8_e5m2,
        dtypes.float8_e4m3fnuz,
        dtypes.float8_e5m2fnuz,
    }
)

#: words of an op's name that mean it draws random numbers
_RANDOM_WORDS = frozenset(
    {
        "rand",
        "randn",
        "randint",
        "randperm",
        "dropout",
        "bernoulli",
        "normal",
        "uniform",
        "multinomial",
        "philox",
        "poisson",
        "exponential",
        "geometric",
        "cauchy",
    }
)


#: words of an op's name that mean it is compute-bound: matrix products (``mm``, ``addmm``, ``bmm``,
#: ``matmul``, ``linear``, ``_scaled_mm``, ``_grouped_mm``), attention (SDPA in every form: thunder's,
#: ATen's flash/efficient/cuDNN/CPU kernels, eager's) and convolutions
_COMPUTE_BOUND_WORDS = frozenset(
    {
        "mm",
        "addmm",
        "addbmm",
        "baddbmm",
        "bmm",
        "matmul",
        "linear",
        "bilinear",
        "sdpa",
        "attention",
        "conv",
        "conv1d",
        "conv2d",
        "conv3d",
        "convolution",
    }
)

#: the tag thunder's rematerialization keeps the outputs of (with reductions and random ops)
_KEPT = prims.OpTags.MATMUL_OP


def never_recomputed(bsym: BoundSymbol) -> bool:
    """Whether ``bsym`` is compute-bound, so that a backward region reads its outputs rather than
    recomputing it: thunder's own matmul prims (tagged), or an op whose name says so."""
    if has_tags(bsym, {_KEPT}):
        return True
    return not _COMPUTE_BOUND_WORDS.isdisjoint(re.split(r"[^a-z0-9]+", bsym.sym.name.lower()))


def _tagged_never_recomputed(bsym: BoundSymbol) -> BoundSymbol:
    """``bsym``, tagged for thunder's rematerialization as an op whose outputs are kept if it is compute-bound."""
    if not never_recomputed(bsym) or has_tags(bsym, {_KEPT}):
        return bsym
    return bsym.from_bsym(tags=bsym.tags | {_KEPT})


#: how far fp32 regions (``fuse_fp32=True``) may be from eager, for ``torch.testing.assert_close``: inductor
#: reorders and fuses reductions (LayerNorm, softmax, gradient sums) and keeps intermediates in registers
#: instead of rounding them to memory, so results differ by float32 rounding steps; measured on CPU on a GPT
#: block's output and gradients (tests/test_cuda_plan_recompute.py), and asserted there
FP32_TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


def _tensors(bsym: BoundSymbol) -> list[TensorProxy]:
    return [v for v in (*bsym.flat_proxy_args, *bsym.flat_proxy_outs) if isinstance(v, TensorProxy)]


def why_not_fused(bsym: BoundSymbol, device_type: str = "cuda") -> str | None:
    """``None`` when ``bsym`` may join a region, else the reason it runs on its own."""
    owner = bsym.sym.executor
    if owner is None or str(owner.name) not in FUSIBLE_OWNERS:
        return f"run by {getattr(owner, 'name', None)!r}, not by one of {sorted(FUSIBLE_OWNERS)}"
    words = set(bsym.sym.name.lower().split("_"))
    if words & _RANDOM_WORDS:
        return "draws random numbers"
    if bsym.sym.name.endswith("_") or bsym.sym.id == prims.PrimIDs.COPY_:
        return "writes in place"
    tensors = _tensors(bsym)
    if not tensors or any(not isinstance(v, TensorProxy) for v in bsym.flat_proxy_outs):
        return "has an output that is not a tensor"
    if any(t.device.type != device_type for t in tensors):
        return f"has a tensor off {device_type}"
    return None


def is_low_precision(bsyms: Sequence[BoundSymbol], *, fp32: bool = False) -> bool:
    """Whether a group of ops reads or writes a 16-bit or 8-bit floating tensor (or, with ``fp32``, a
    float32 one); else it stays op by op."""
    fused = _LOW_PRECISION | {dtypes.float32} if fp32 else _LOW_PRECISION
    return any(dtypes.to_dtype(t.dtype) in fused for bsym in bsyms for t in _tensors(bsym))


def _with_torch_constants(bsym: BoundSymbol) -> BoundSymbol:
    """``bsym`` with thunder's dtype and device objects as torch's: the implementations convert
    them through dicts keyed by thunder's objects, which Dynamo cannot trace."""
    return bsym.from_bsym(args=tree_map(to_torch_value, bsym.args), kwargs=tree_map(to_torch_value, bsym.kwargs))


def compile_region(
    bsyms: Sequence[BoundSymbol], inputs: Sequence[Proxy], outputs: Sequence[Proxy], backend: str | Callable
) -> Callable[..., Any]:
    """The region's ops as a Python function (each calls its owner's implementation) under
    ``torch.compile(fullgraph=True)``, run without grad and autocast as thunder's own regions are."""
    region = TraceCtx(None)
    region.args = list(inputs)
    region.kwargs = {}
    region.names = {proxy.name for proxy in inputs}
    with tracectx(region):
        for proxy in inputs:
            prims.unpack_trivial(proxy, name=proxy.name)
    region.bound_symbols += [_with_torch_constants(bsym) for bsym in bsyms]
    region.bound_symbols.append(prims.python_return.bind(list(outputs), output=None))
    for bsym in bsyms:
        for proxy in bsym.flat_proxy_outs:
            region.add_name(proxy.name)
    region._siginfo = SigInfo("region")
    region._siginfo.args = [(proxy.name, None) for proxy in inputs]
    plain = region.python_callable(include_decorators=False)
    compiled = torch.compile(plain, backend=backend, fullgraph=True)
    return torch.no_grad()(no_autocast(_plain_if_not_compilable(compiled, plain)))


def _plain_if_not_compilable(compiled: Callable[..., Any], plain: Callable[..., Any]) -> Callable[..., Any]:
    """``compiled``, or the region's ops one by one from the first call Dynamo or its backend
    refuses (with a warning saying which op): a region that cannot be compiled is slower, never wrong."""
    chosen = [compiled]

    def run(*args: Any) -> Any:
        try:
            return chosen[0](*args)
        except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.BackendCompilerFailed) as error:
            if chosen[0] is plain:
                raise
            warnings.warn(
                f"thunderplug's {NAME} runs a region op by op: torch.compile refused it ({str(error).splitlines()[0]})",
                RuntimeWarning,
                stacklevel=2,
            )
            chosen[0] = plain
            return plain(*args)

    return run


class CudaRegionExecutor(TorchCompileExecutor):
    """thunder's torch.compile fusion pass over the ops :func:`why_not_fused` admits.

    ``backend`` and ``device_type`` exist for the CPU tests (``aot_eager`` on CPU tensors runs the
    same regions without inductor's kernels); users get inductor on CUDA. ``fuse_fp32`` fuses fp32
    groups too (the opt-in ``THUNDERPLUG_CUDA_FUSE_FP32=1``), within :data:`FP32_TOLERANCE` of eager.
    """

    def __init__(
        self,
        name: str = NAME,
        *,
        backend: str | Callable = "inductor",
        device_type: str = "cuda",
        fuse_fp32: bool = False,
    ):
        super().__init__(name)
        self.backend = backend
        self.device_type = device_type
        self.fuse_fp32 = fuse_fp32

    def can_fuse(self, bsym: BoundSymbol) -> bool:
        return why_not_fused(bsym, self.device_type) is None

    def can_execute(self, bsym: BoundSymbol) -> bool:
        return False

    def fusion_pass(self, trace: TraceCtx) -> TraceCtx:
        """thunder's torch.compile fusion pass, compiling only the low-precision groups (and fp32 ones
        with ``fuse_fp32``)."""
        producers, consumers = utils.producers_and_consumers(trace)
        groups = fuse_bound_symbols(trace, lambda a, b: all(self._fusible_node(n) for n in (a, b)))
        fused: list[BoundSymbol] = []
        for group in groups:
            if (len(group) == 1 and not self.can_fuse(group[0])) or not is_low_precision(group, fp32=self.fuse_fp32):
                fused.extend(group)
            else:
                fused.append(self.fuse(Region(producers, consumers, group), len(fused)))
        result = from_trace(trace)
        result.bound_symbols = fused
        return update_fusion_call_ctx(dce(rematerialize(result)))

    def _fusible_node(self, node: Node) -> bool:
        return len(node.group_bsyms) > 1 or self.can_fuse(node.group_bsyms[0])

    def fuse(self, region: Region, fusion_counter: int) -> BoundSymbol:
        inputs = [unvariableify(x) for x in region.inputs]
        outputs = [unvariableify(x) for x in region.outputs]
        name = f"CudaRegion{fusion_counter}"
        bsyms = [_tagged_never_recomputed(bsym) for bsym in region.bound_symbols]
        compiled = compile_region(bsyms, inputs, outputs, self.backend)
        symbol = Symbol(name, meta=None, is_fusion=True, executor=self)
        return BoundSymbol(symbol, inputs, {}, outputs, bsyms, _call_ctx={name: compiled})


def build_executor(*, fuse_fp32: bool = False) -> CudaRegionExecutor:
    return CudaRegionExecutor(fuse_fp32=fuse_fp32)
