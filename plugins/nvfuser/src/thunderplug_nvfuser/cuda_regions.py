"""Where CUDA exists but nvFuser does not: runs of claimed low-precision ops as regions compiled by inductor.

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
cheap elementwise work may still be recomputed. GELU's output is saved too where a matmul reads it
(:func:`saved_for_backward`).

How a region is compiled (:class:`CompiledRegion`): not through ``torch.compile``, whose Dynamo guards and
AOTAutograd runtime wrappers ran on every call of every region (thunder has already split forward and
backward and runs regions without grad), but once per layout of its inputs: its ATen graph traced by
``make_fx`` on fake tensors, with inductor's decompositions, handed to inductor's ``compile_fx_inner``, and
the compiled program called directly. torch's private names used, all here: ``torch._inductor.compile_fx.
compile_fx_inner``, ``torch._inductor.decomposition.select_decomp_table`` (and ``make_fx`` of
``torch.fx.experimental.proxy_tensor``).
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
from torch._inductor.compile_fx import compile_fx_inner
from torch._inductor.decomposition import select_decomp_table
from torch.fx.experimental.proxy_tensor import make_fx

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

#: words of the names of elementwise ops whose outputs are saved rather than recomputed where a compute-bound
#: op reads them: GELU (an erf per element, in fp32 for bf16) recomputed in the backward cost ~2 ms a step of
#: the benchmark GPT on CPU (issue 43). A bf16 linear after it needs GELU's output for its weight gradient
#: anyway, so saving it adds one tensor per block and stays below torch.compile's saved bytes; under float8 the
#: next matmul reads a float8 cast of it, which is what is saved, and the bf16 output saved as well would
#: exceed torch.compile's (measured on a GPT block: 53760 bytes against the min-cut's 49200)
_SAVED_WORDS = frozenset({"gelu"})

#: the tag thunder's rematerialization keeps the outputs of (with reductions and random ops)
_KEPT = prims.OpTags.MATMUL_OP


def never_recomputed(bsym: BoundSymbol) -> bool:
    """Whether ``bsym`` is compute-bound, so that a backward region reads its outputs rather than
    recomputing it: thunder's own matmul prims (tagged), or an op whose name says so."""
    if has_tags(bsym, {_KEPT}):
        return True
    return not _COMPUTE_BOUND_WORDS.isdisjoint(_words(bsym))


def _words(bsym: BoundSymbol) -> list[str]:
    return re.split(r"[^a-z0-9]+", bsym.sym.name.lower())


def saved_for_backward(bsyms: Sequence[BoundSymbol]) -> list[bool]:
    """For each op of a region, whether its outputs are kept for the backward rather than recomputed there:
    compute-bound ops (:func:`never_recomputed`), and ops named in :data:`_SAVED_WORDS` whose output a
    compute-bound op of the region reads directly."""
    read_by_compute_bound = {
        proxy.name for bsym in bsyms if never_recomputed(bsym) for proxy in bsym.flat_proxy_args
        if isinstance(proxy, Proxy)
    }  # fmt: skip
    return [
        never_recomputed(bsym)
        or (
            not _SAVED_WORDS.isdisjoint(_words(bsym))
            and any(proxy.name in read_by_compute_bound for proxy in bsym.flat_proxy_outs)
        )
        for bsym in bsyms
    ]


def _tagged(bsym: BoundSymbol, saved: bool) -> BoundSymbol:
    """``bsym``, tagged for thunder's rematerialization as an op whose outputs are kept if ``saved``."""
    if not saved or has_tags(bsym, {_KEPT}):
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


#: a region's compiler: ``"inductor"`` (inductor's kernels), ``"aot_eager"`` (the traced ATen graph run as it
#: is: eager's kernels, no codegen), or a function of ``(graph_module, example_inputs)`` returning a callable
Backend = str | Callable[[torch.fx.GraphModule, list[torch.Tensor]], Callable[..., Any]]


def compile_region(
    bsyms: Sequence[BoundSymbol], inputs: Sequence[Proxy], outputs: Sequence[Proxy], backend: Backend
) -> Callable[..., Any]:
    """The region's ops as a Python function (each calls its owner's implementation), compiled by
    :class:`CompiledRegion` and run without grad and autocast as thunder's own regions are."""
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
    return torch.no_grad()(no_autocast(CompiledRegion(plain, backend)))


#: layouts compiled per region before it runs op by op (Dynamo's ``recompile_limit``): a number input that changes
#: every call (a step count) would otherwise compile every call
RECOMPILE_LIMIT = 8


def _layout(args: Sequence[Any]) -> tuple:
    """What a compiled region is specialized to: each tensor's dtype, device, shape and strides (inductor's
    code assumes them), each other argument's value."""
    return tuple(
        (a.dtype, a.device, a.shape, a.stride()) if isinstance(a, torch.Tensor) else (type(a), a) for a in args
    )


def _trace(function: Callable[..., Any], tensors: list[torch.Tensor], decompositions: dict | None) -> Any:
    """The ATen graph of ``function`` on fake copies of ``tensors`` (no kernel runs)."""
    return make_fx(function, decomposition_table=decompositions, tracing_mode="fake")(*tensors)


def _compile_graph(function: Callable[..., Any], tensors: list[torch.Tensor], backend: Backend) -> Callable:
    """``function`` of ``tensors`` as a callable of a list of tensors, compiled by ``backend``."""
    if backend == "inductor":
        program = compile_fx_inner(_trace(function, tensors, select_decomp_table()), tensors, is_inference=True)
        return program  # inductor's boxed convention: called with the list of inputs
    graph = _trace(function, tensors, None)
    if backend == "aot_eager":
        return lambda inputs: graph(*inputs)
    compiled = backend(graph, tensors)
    return lambda inputs: compiled(*inputs)


class CompiledRegion:
    """A region's function, compiled without Dynamo: on its first call with a layout of inputs
    (:func:`_layout`), its ATen graph is traced with ``make_fx`` on fake tensors and handed to the backend
    (inductor's ``compile_fx_inner``, as torch.compile's inductor does after AOTAutograd); later calls with
    that layout call the compiled program directly. torch.compile around the region instead ran Dynamo's
    guards and AOTAutograd's runtime wrappers on every call, over regions of hundreds of inputs (cProfile of
    the benchmark GPT's step, issue 43's size: 0.27 ms a region call, 8 calls a step). thunder has already
    split forward and backward and runs regions without grad, so neither has anything to add.

    A region that cannot be traced or compiled runs op by op from then on, with a warning naming the error:
    slower, never wrong (an error of the user's program itself is then raised by the plain ops)."""

    def __init__(self, plain: Callable[..., Any], backend: Backend):
        if backend not in ("inductor", "aot_eager") and not callable(backend):
            raise ValueError(f"unknown region backend {backend!r}: 'inductor', 'aot_eager' or a function")
        self.plain = plain
        self.backend = backend
        self.programs: dict[tuple, Callable[[Sequence[Any]], Any]] = {}
        self.refused = False

    def __call__(self, *args: Any) -> Any:
        if self.refused:
            return self.plain(*args)
        key = _layout(args)
        program = self.programs.get(key)
        if program is None:
            program = self._compile(args)
            if program is None:
                return self.plain(*args)
            self.programs[key] = program
        return program(args)

    def _refuse(self, why: str) -> None:
        warnings.warn(f"thunderplug's {NAME} runs a region op by op: {why}", RuntimeWarning, stacklevel=4)
        self.refused = True

    def _compile(self, args: Sequence[Any]) -> Callable[[Sequence[Any]], Any] | None:
        if len(self.programs) >= RECOMPILE_LIMIT:
            self._refuse(f"{RECOMPILE_LIMIT} layouts of its inputs compiled already (RECOMPILE_LIMIT)")
            return None
        positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        constants = [None if isinstance(a, torch.Tensor) else a for a in args]  # keeps no tensor alive
        plain = self.plain

        def on_tensors(*tensors: torch.Tensor) -> list[Any]:
            full = list(constants)
            for position, tensor in zip(positions, tensors, strict=True):
                full[position] = tensor
            return list(plain(*full))

        try:
            compiled = _compile_graph(on_tensors, [args[i] for i in positions], self.backend)
        except Exception as error:  # noqa: BLE001 - any refusal of tracing or the backend: the plain ops instead
            self._refuse(f"it could not be compiled ({type(error).__name__}: {(str(error).splitlines() or [''])[0]})")
            return None
        return lambda call_args: compiled([call_args[i] for i in positions])


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
        backend: Backend = "inductor",
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
        saved = saved_for_backward(region.bound_symbols)
        bsyms = [_tagged(bsym, keep) for bsym, keep in zip(region.bound_symbols, saved, strict=True)]
        compiled = compile_region(bsyms, inputs, outputs, self.backend)
        symbol = Symbol(name, meta=None, is_fusion=True, executor=self)
        return BoundSymbol(symbol, inputs, {}, outputs, bsyms, _call_ctx={name: compiled})


def build_executor(*, fuse_fp32: bool = False) -> CudaRegionExecutor:
    return CudaRegionExecutor(fuse_fp32=fuse_fp32)
