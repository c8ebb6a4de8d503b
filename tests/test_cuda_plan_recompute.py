"""The CUDA plan's backward recomputes no matmul and no attention (issue 43), checked on CPU.

The CUDA plan is ``discover()`` with ``torchcompile_cuda`` (plugins/nvfuser ``cuda_regions``) where it sits on
a CUDA machine without nvFuser; here its regions accept CPU tensors and are compiled with ``aot_eager``
(the plan, which thunder's rematerialization decides, does not depend on the backend). Before the recompute
policy, each GPT block's forward region returned only the block's output and its backward region recomputed
5 of the 6 linears and the SDPA forward (float8: 17 ``_scaled_mm`` in the backward, 5 of them recomputed
forward ones). Checked here, on a bf16 block and a float8 block with ``_scaled_mm`` an ``aten`` op (as on
CUDA): the compute-bound ops of each trace (forward: 6 linears, 1 SDPA; backward: 12 gradient matmuls, 1 SDPA
backward, nothing of the forward's), the bytes saved for backward (no more than torch.compile's min-cut
partitioner saves, ``aot_eager``), and the values: outputs, losses and gradients bit-identical to eager.
"""

from __future__ import annotations

import collections
import copy
import re

import benchmark_scripts
import pytest
import thunder
import torch

import thunderplug
from thunderplug import PluginHost

pytest.importorskip("torchao.float8")

from thunderplug_nvfuser import cuda_regions  # noqa: E402

gpt_model = benchmark_scripts.load("gpt_model")
CONFIG = gpt_model.GPTConfig(layers=2, d_model=32, heads=2, seq=16, batch=2, vocab=64)

#: the names of compute-bound ops in these traces: eager's linear and SDPA kernels, thunder's matmul,
#: ATen's ``_scaled_mm`` (the bias gradient ``eager_linear_bias_backward`` is a sum, not a matmul)
_COMPUTE_BOUND = re.compile(r"^(eager_linear|matmul|linear|aten__scaled_mm_default|eager_sdpa\w*)$")


pytestmark = pytest.mark.usefixtures("no_onednn")


@pytest.fixture
def scaled_mm_as_aten(monkeypatch):
    """``_scaled_mm`` as an ``aten`` op, as on CUDA: the float8 plugin's CPU kernel declines, and a new host
    registers the claims again with that checker."""
    from thunderplug_float8 import cpu_scaled_mm

    monkeypatch.setattr(cpu_scaled_mm, "scaled_mm_checker", lambda *args, **kwargs: False)
    return PluginHost(environ={})


def _cuda_plan(host: PluginHost | None = None) -> list:
    """discover()'s executors with the CUDA regions executor where a CUDA machine has it, on CPU tensors."""
    executors = thunderplug.discover(host=host, quiet=True)
    names = [executor.name for executor in executors]
    executors.insert(names.index("aten"), cuda_regions.CudaRegionExecutor(backend="aot_eager", device_type="cpu"))
    return executors


def _block(float8: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    block = gpt_model.Block(CONFIG).to(torch.bfloat16)
    return gpt_model.to_float8(block) if float8 else block


def _input() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(CONFIG.batch, CONFIG.seq, CONFIG.d_model, dtype=torch.bfloat16, requires_grad=True)


def _compute_bound(trace) -> collections.Counter:
    """The compute-bound ops of a trace, inside its regions and outside them."""
    counts: collections.Counter = collections.Counter()

    def walk(bsyms) -> None:
        for bsym in bsyms:
            if bsym.sym.is_fusion:
                walk(bsym.subsymbols)
            elif _COMPUTE_BOUND.match(bsym.sym.name):
                counts[bsym.sym.name] += 1

    walk(trace.bound_symbols)
    return counts


def _plan(jitted, *args) -> tuple:
    entry, _, _ = thunder.compile_data(jitted)._get_computation_and_inputs(*args)
    return entry.computation_traces[-1], entry.backward_traces[-1]


@pytest.mark.parametrize(
    "float8, forward_ops, backward_ops",
    [
        (False, {"eager_linear": 6, "eager_sdpa_flash_cpu": 1}, {"matmul": 12, "eager_sdpa_flash_cpu_backward": 1}),
        (True, {"aten__scaled_mm_default": 6, "eager_sdpa_flash_cpu": 1},
         {"aten__scaled_mm_default": 12, "eager_sdpa_flash_cpu_backward": 1}),
    ],
    ids=["bf16", "float8"],
)  # fmt: skip
def test_a_block_backward_holds_its_gradient_matmuls_and_one_sdpa_backward(
    float8, forward_ops, backward_ops, scaled_mm_as_aten
):
    jitted = thunder.jit(_block(float8), executors=_cuda_plan(scaled_mm_as_aten))
    forward, backward = _plan(jitted, _input())
    assert [b.sym.executor.name for b in forward.bound_symbols if b.sym.is_fusion] == [cuda_regions.NAME]
    assert _compute_bound(forward) == forward_ops
    assert _compute_bound(backward) == backward_ops  # before: +5 linears (float8: +5 _scaled_mm) and the SDPA


def _storages(tensor: torch.Tensor) -> list:
    if hasattr(tensor, "__tensor_flatten__"):  # a float8 tensor: its inner tensors
        names, _ = tensor.__tensor_flatten__()
        return [s for name in names for s in _storages(getattr(tensor, name))]
    return [tensor.untyped_storage()]


def _saved_bytes(module: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd keeps from one forward for its backward (parameters and
    the input included, as each program saves them or not)."""
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        for storage in _storages(tensor):
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = module(x)
    out.float().sum().backward()
    return sum(saved.values())


@pytest.mark.parametrize("float8", [False, True], ids=["bf16", "float8"])
def test_a_block_saves_no_more_for_backward_than_torch_compile(float8, scaled_mm_as_aten):
    block = _block(float8)
    x = _input()
    jitted = thunder.jit(copy.deepcopy(block), executors=_cuda_plan(scaled_mm_as_aten))
    compiled = torch.compile(copy.deepcopy(block), backend="aot_eager")  # min-cut rematerialization partitioner
    jitted(x), compiled(x)  # compile both first: the measured forwards are the steady state's
    plan, min_cut = _saved_bytes(jitted, x), _saved_bytes(compiled, x)
    print(f"saved for backward: CUDA plan {plan} bytes, aot_eager min-cut {min_cut} bytes")
    assert plan <= min_cut, (plan, min_cut)


def _assert_steps_equal_eager(eager: torch.nn.Module, jitted, tokens, targets, steps: int = 2) -> None:
    """Each step's loss and every parameter's gradient bit-identical to eager's (AdamW between steps)."""
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (eager, jitted)]
    for _ in range(steps):
        expected, actual = eager(tokens, targets), jitted(tokens, targets)
        expected.backward()
        actual.backward()
        assert torch.equal(actual, expected)
        for (name, p), (_, q) in zip(jitted.named_parameters(), eager.named_parameters(), strict=True):
            assert torch.equal(p.grad, q.grad), name
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("float8", [False, True], ids=["bf16", "float8"])
def test_a_gpt_under_the_cuda_plan_trains_as_eager(float8, scaled_mm_as_aten):
    torch.manual_seed(0)
    base = gpt_model.GPT(CONFIG).to(torch.bfloat16)
    if float8:
        base = gpt_model.to_float8(base)
    tokens = torch.randint(0, CONFIG.vocab, (CONFIG.batch, CONFIG.seq))
    targets = torch.randint(0, CONFIG.vocab, (CONFIG.batch, CONFIG.seq))
    jitted = thunder.jit(copy.deepcopy(base), executors=_cuda_plan(scaled_mm_as_aten))
    _assert_steps_equal_eager(base, jitted, tokens, targets)
    forward, backward = _plan(jitted, tokens, targets)
    matmul, grad_matmul = ("aten__scaled_mm_default",) * 2 if float8 else ("eager_linear", "matmul")
    # 6 linears a block and the LM head; the backward computes their 2 gradients each and recomputes none
    assert _compute_bound(forward)[matmul] == 6 * CONFIG.layers + 1
    assert _compute_bound(backward)[grad_matmul] == 2 * (6 * CONFIG.layers + 1)
    assert not {"eager_linear", "eager_sdpa_flash_cpu"} & set(_compute_bound(backward))


def test_never_recomputed_keeps_the_compute_bound_ops_and_leaves_the_cheap_ones():
    """Of a bf16 block's forward region, the linears and the SDPA are kept; LayerNorm, the residual adds and
    the reshapes are left to thunder's rematerialization, which may recompute them."""
    jitted = thunder.jit(_block(False), executors=_cuda_plan())
    forward, _ = _plan(jitted, _input())
    (region,) = (b for b in forward.bound_symbols if b.sym.is_fusion)
    names = [b.sym.name for b in region.subsymbols]
    kept = {b.sym.name for b in region.subsymbols if cuda_regions.never_recomputed(b)}
    assert {"eager_linear", "eager_sdpa_flash_cpu"} <= kept, kept
    assert not {"eager_native_layer_norm", "add"} & kept, kept
    assert {"eager_native_layer_norm", "add"} <= set(names)


@pytest.mark.parametrize("float8, saved", [(False, True), (True, False)], ids=["bf16", "float8"])
def test_gelu_is_saved_where_a_matmul_reads_it_and_recomputed_where_a_float8_cast_does(
    float8, saved, scaled_mm_as_aten
):
    """bf16: the MLP's second linear reads GELU's output, which its weight gradient needs anyway, so the
    output is saved and the backward region runs no GELU forward (it recomputed it before: ~2 ms a step of the
    benchmark GPT). float8: the second matmul reads a float8 cast, which is saved; GELU's bf16 output saved as
    well would exceed torch.compile's saved bytes, so it stays recomputable (and is recomputed)."""
    jitted = thunder.jit(_block(float8), executors=_cuda_plan(scaled_mm_as_aten))
    forward, backward = _plan(jitted, _input())
    (region,) = (b for b in forward.bound_symbols if b.sym.is_fusion)
    (gelu,) = (b for b in region.subsymbols if b.sym.name == "eager_gelu")
    assert cuda_regions.saved_for_backward(region.subsymbols)[region.subsymbols.index(gelu)] is saved
    in_backward = collections.Counter(
        b.sym.name for r in backward.bound_symbols if r.sym.is_fusion for b in r.subsymbols
    )
    assert (in_backward["eager_gelu"] == 0) is saved, in_backward
    assert in_backward["eager_gelu_backward"] == 1
