"""The CUDA fusion path without nvFuser (``torchcompile_cuda``), checked on CPU.

The plan is computed here exactly as on a CUDA machine, with two stand-ins: the regions accept CPU
tensors (``device_type="cpu"``) and are compiled with ``aot_eager`` (their ATen graph run as it is, ATen's
own kernels) instead of inductor, so the regions' code runs without inductor's CPU float8 kernels
(which crash in torch 2.9.1). On CPU the float8 plugin's CPU ``_scaled_mm`` keeps the matmuls out of
the regions; on CUDA they are ``aten`` ops and join them.
"""

from __future__ import annotations

import collections
import copy
import importlib.util
import pathlib
import re
import sys

import pytest
import thunder
import torch
import torch.nn.functional as F
from torchao.float8 import convert_to_float8_training

import thunderplug
from thunderplug import PluginHost, Status
from thunderplug_nvfuser import cuda_regions, hooks

GPT_MODEL = pathlib.Path(__file__).resolve().parents[3] / "benchmarks" / "gpt_model.py"
BOOKKEEPING = {"python_del", "python_return", "unpack_trivial", "unpack_sequence", "clear_mutable_collection"}


def _gpt_module():
    spec = importlib.util.spec_from_file_location("gpt_model_for_cuda_regions", GPT_MODEL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def _executors_with_cpu_regions(host: PluginHost | None = None) -> list:
    """discover()'s list with the CUDA regions executor where it goes on a CUDA machine (after the
    eager kernels, before ``aten``), accepting CPU tensors."""
    executors = thunderplug.discover(host=host)
    names = [executor.name for executor in executors]
    executors.insert(names.index("aten"), cuda_regions.CudaRegionExecutor(backend="aot_eager", device_type="cpu"))
    return executors


def _plan(jitted, *args) -> tuple:
    entry, _, _ = thunder.compile_data(jitted)._get_computation_and_inputs(*args)
    return entry.computation_traces[-1], entry.backward_traces[-1]


def _outside_regions(trace) -> collections.Counter:
    return collections.Counter(
        bsym.sym.name for bsym in trace.bound_symbols if not bsym.sym.is_fusion and bsym.sym.name not in BOOKKEEPING
    )


def _regions(trace) -> list:
    return [bsym for bsym in trace.bound_symbols if bsym.sym.is_fusion and bsym.sym.executor.name == cuda_regions.NAME]


def _float8_casts(bsyms) -> int:
    float8 = {thunder.dtypes.float8_e4m3fn, thunder.dtypes.float8_e5m2}
    return sum(
        1
        for bsym in bsyms
        for out in bsym.flat_proxy_outs
        if isinstance(out, thunder.core.proxies.TensorProxy) and thunder.dtypes.to_dtype(out.dtype) in float8
    )


@pytest.fixture(scope="module")
def float8_gpt():
    """A bf16 GPT block converted to float8, its eager twin, one batch, and the regions plan."""
    gpt = _gpt_module()
    torch.manual_seed(0)
    config = gpt.GPTConfig(layers=1, d_model=64, heads=2, seq=16, batch=2, vocab=128)
    base = gpt.GPT(config).to(torch.bfloat16)
    eager = convert_to_float8_training(copy.deepcopy(base))
    jitted = thunder.jit(convert_to_float8_training(copy.deepcopy(base)), executors=_executors_with_cpu_regions())
    tokens = torch.randint(0, config.vocab, (config.batch, config.seq))
    targets = torch.randint(0, config.vocab, (config.batch, config.seq))
    return eager, jitted, tokens, targets, _plan(jitted, tokens, targets)


def test_float8_block_runs_as_regions_between_its_matmuls(float8_gpt):
    *_, (forward, backward) = float8_gpt
    for trace in (forward, backward):
        outside = _outside_regions(trace)
        assert set(outside) == {"float8__scaled_mm_default"}, outside  # amax, scales, casts, transposes: fused
        assert 1 <= len(_regions(trace)) <= outside["float8__scaled_mm_default"] + 1
    # the float8 casts themselves are inside the regions (7 matmuls: 14 operands forward)
    assert _float8_casts(sub for region in _regions(forward) for sub in region.subsymbols) >= 14
    assert _float8_casts(bsym for bsym in forward.bound_symbols if not bsym.sym.is_fusion) == 0


def _assert_eager_steps(eager, jitted, *args, steps: int = 1) -> None:
    """Each step's loss and every parameter's gradient bit-identical to eager's."""
    for _ in range(steps):
        for model in (eager, jitted):
            model.zero_grad()
        expected, actual = eager(*args), jitted(*args)
        expected.backward()
        actual.backward()
        assert torch.equal(actual, expected)
        for (name, p), (_, q) in zip(jitted.named_parameters(), eager.named_parameters(), strict=True):
            assert torch.equal(p.grad, q.grad), name


def test_float8_regions_give_eager_losses_and_gradients(float8_gpt):
    eager, jitted, tokens, targets, _ = float8_gpt
    _assert_eager_steps(eager, jitted, tokens, targets, steps=2)


def test_with_scaled_mm_as_an_aten_op_as_on_cuda_a_float8_block_is_one_region_each_way(monkeypatch):
    """On CUDA the float8 plugin's CPU ``_scaled_mm`` declines, ``aten`` owns the matmuls and they join the
    regions: the whole forward and the whole backward of a float8 GPT block are one region each."""
    from thunderplug_float8 import cpu_scaled_mm

    monkeypatch.setattr(cpu_scaled_mm, "scaled_mm_checker", lambda *args, **kwargs: False)
    host = PluginHost(environ={})  # a new host registers the claims again, with the checker above
    gpt = _gpt_module()
    torch.manual_seed(0)
    config = gpt.GPTConfig(layers=1, d_model=32, heads=2, seq=16, batch=2, vocab=64)
    base = gpt.GPT(config).to(torch.bfloat16)
    eager = convert_to_float8_training(copy.deepcopy(base))
    jitted = thunder.jit(convert_to_float8_training(copy.deepcopy(base)), executors=_executors_with_cpu_regions(host))
    tokens = torch.randint(0, config.vocab, (config.batch, config.seq))
    forward, backward = _plan(jitted, tokens, tokens)
    for trace in (forward, backward):
        assert not _outside_regions(trace) and len(_regions(trace)) == 1
    _assert_eager_steps(eager, jitted, tokens, tokens)


def test_fp32_programs_stay_op_by_op():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    jitted = thunder.jit(model, executors=_executors_with_cpu_regions())
    x = torch.randn(3, 8, requires_grad=True)
    forward, backward = _plan(jitted, x)
    assert not _regions(forward) and not _regions(backward)
    jitted(x).sum().backward()
    expected = x.grad.clone()
    x.grad = None
    model(x).sum().backward()
    assert torch.equal(x.grad, expected)


def test_random_ops_stay_outside_regions():
    def f(x):
        return F.dropout(x * 2, p=0.5) + 1

    jitted = thunder.jit(f, executors=_executors_with_cpu_regions())
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    torch.manual_seed(1)
    actual = jitted(x)
    torch.manual_seed(1)
    assert torch.equal(actual, f(x))
    final = thunder.last_traces(jitted)[-1]
    random = [b for b in final.bound_symbols if cuda_regions.why_not_fused(b, "cpu") == "draws random numbers"]
    assert random
    fused = [b for region in _regions(final) for b in region.subsymbols]
    assert fused and all(cuda_regions.why_not_fused(b, "cpu") is None for b in fused)


def test_cpu_tensors_are_not_fused_by_the_cuda_executor():
    executors = thunderplug.discover()
    executors.insert([e.name for e in executors].index("aten"), cuda_regions.build_executor())
    jitted = thunder.jit(lambda x: (x * 2).sin(), executors=executors)
    x = torch.randn(4, dtype=torch.bfloat16)
    assert torch.equal(jitted(x), (x * 2).sin())
    assert not _regions(thunder.last_traces(jitted)[-1])


def test_on_cuda_without_nvfuser_the_regions_executor_is_on_by_default(monkeypatch):
    if hooks.nvfuser_unavailable_reason() is None:
        pytest.skip("nvFuser is available: it fuses instead")
    monkeypatch.setattr(hooks, "cuda_unavailable_reason", lambda: None)  # a CUDA machine without nvFuser
    report = {s.name: s for s in PluginHost(environ={}).report()}["nvfuser"]
    assert report.status is Status.ACTIVE
    assert report.executors == ["torchcompile_cuda"]
    assert "torchcompile_cuda" in report.unavailable_executors["torchcompile_no_fp8"]
    names = [ex.name for ex in thunderplug.discover(host=PluginHost(environ={"THUNDERPLUG_CPU_FUSION": "1"}))]
    assert names.index("eager_kernels") < names.index("torchcompile_cuda") < names.index("aten")
    assert "torchcompile_no_fp8" not in names
    assert "torchcompile_cuda" not in [ex.name for ex in thunderplug.discover(exclude=["torchcompile_cuda"])]


def test_on_cpu_the_regions_executor_says_why_not():
    reason = hooks.cuda_regions_unavailable_reason()
    if reason is None:
        pytest.skip("CUDA without nvFuser: the executor runs here")
    assert "CUDA" in reason or "nvFuser" in reason


@pytest.mark.requires_cuda
def test_float8_training_on_cuda_fuses_with_inductor():
    if hooks.cuda_regions_unavailable_reason():
        pytest.skip(hooks.cuda_regions_unavailable_reason())
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    base = base.to("cuda", torch.bfloat16)
    eager = convert_to_float8_training(copy.deepcopy(base))
    jitted = thunder.jit(convert_to_float8_training(copy.deepcopy(base)), executors=thunderplug.discover())
    x = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
    expected, actual = eager(x).float().square().mean(), jitted(x).float().square().mean()
    expected.backward()
    actual.backward()
    torch.testing.assert_close(actual, expected, rtol=2e-2, atol=1e-3)
    for p, q in zip(jitted.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad.float(), q.grad.float(), rtol=5e-2, atol=1e-2)
    forward, backward = thunder.last_traces(jitted)[-1], thunder.last_backward_traces(jitted)[-1]
    assert _regions(forward) and _regions(backward)
    assert _float8_casts(b for b in forward.bound_symbols if not b.sym.is_fusion) == 0


def test_a_region_the_backend_refuses_runs_op_by_op_with_a_warning():
    def refusing_backend(graph_module, example_inputs):
        raise RuntimeError("no kernel for this region")

    executors = thunderplug.discover()
    regions = cuda_regions.CudaRegionExecutor(backend=refusing_backend, device_type="cpu")
    executors.insert([e.name for e in executors].index("aten"), regions)
    jitted = thunder.jit(lambda x: (x * 2).sin() + x, executors=executors)
    x = torch.randn(8, dtype=torch.bfloat16)
    with pytest.warns(RuntimeWarning, match="torchcompile_cuda runs a region op by op"):
        assert torch.equal(jitted(x), (x * 2).sin() + x)
    assert _regions(thunder.last_traces(jitted)[-1])
    assert torch.equal(jitted(x), (x * 2).sin() + x)  # the plain ops from then on, no second warning


def _dynamo_calls(function, *args):
    """``function(*args)`` and the Python functions it called of Dynamo's frame evaluation and guards and of
    AOTAutograd's runtime wrappers (inductor's compiled program itself reads Dynamo's metrics context)."""
    calls = []

    def profile(frame, event, arg):
        watched = r"torch/_dynamo/(eval_frame|guards|convert_frame)\.py|torch/_functorch/(_aot_autograd/|aot_autograd)"
        if event == "call" and re.search(watched, frame.f_code.co_filename):
            calls.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        result = function(*args)
    finally:
        sys.setprofile(None)
    return result, calls


def test_a_region_is_compiled_once_by_inductor_and_called_without_dynamo(monkeypatch):
    """A region's ATen graph goes to inductor's ``compile_fx_inner`` once and later calls run the compiled
    program directly: no Dynamo frame, no guards, no AOTAutograd wrapper (per-call overhead that cost ~9.5 ms a
    step of the benchmark GPT). A new layout of the inputs (a transposed tensor) compiles once more. The
    values are torch.compile(inductor)'s own, bit for bit."""
    compile_fx_inner = cuda_regions.compile_fx_inner
    compiled = []

    def counting(graph, example_inputs, **kwargs):
        compiled.append(graph)
        return compile_fx_inner(graph, example_inputs, **kwargs)

    monkeypatch.setattr(cuda_regions, "compile_fx_inner", counting)

    def f(x):
        return (x * 2).sin() + x

    executors = thunderplug.discover()
    executors.insert([e.name for e in executors].index("aten"), cuda_regions.CudaRegionExecutor(device_type="cpu"))
    jitted = thunder.jit(f, executors=executors)
    reference = torch.compile(f, backend="inductor", fullgraph=True)
    torch.manual_seed(0)
    xs = [torch.randn(8, 4, dtype=torch.bfloat16) for _ in range(3)]
    expected = [reference(x) for x in xs]
    for x, y in zip(xs, expected, strict=True):
        torch.testing.assert_close(jitted(x), y, rtol=0, atol=0)
    assert len(compiled) == 1 and _regions(thunder.last_traces(jitted)[-1])
    actual, calls = _dynamo_calls(jitted, xs[0])
    assert calls == [] and torch.equal(actual, expected[0])
    _, reference_calls = _dynamo_calls(reference, xs[0])
    assert reference_calls  # the check sees torch.compile's own calls
    transposed = torch.randn(4, 8, dtype=torch.bfloat16).t()
    torch.testing.assert_close(jitted(transposed), reference(transposed), rtol=0, atol=0)
    torch.testing.assert_close(jitted(transposed), f(transposed), rtol=0, atol=0.02)  # eager: one bf16 step
    assert len(compiled) == 2


def test_a_trained_block_compiles_each_region_once_without_dynamo():
    """A bf16 GPT block under the regions executor (``aot_eager``: the ATen graph as it is), three forward
    and backward calls: one compilation per region (forward and backward), no Dynamo or AOTAutograd call after
    the first, and output and gradients bit-identical to eager."""
    gpt = _gpt_module()
    config = gpt.GPTConfig(layers=1, d_model=32, heads=2, seq=16, batch=2, vocab=64)
    torch.manual_seed(0)
    block = gpt.Block(config).to(torch.bfloat16)
    jitted = thunder.jit(copy.deepcopy(block), executors=_executors_with_cpu_regions())
    for seed in range(3):
        torch.manual_seed(seed)
        x = torch.randn(config.batch, config.seq, config.d_model, dtype=torch.bfloat16, requires_grad=True)
        x_eager = x.detach().clone().requires_grad_()
        (actual, forward_calls), expected = _dynamo_calls(jitted, x), block(x_eager)
        _, backward_calls = _dynamo_calls(actual.float().square().sum().backward)
        expected.float().square().sum().backward()
        if seed:  # after the first call, which compiles
            assert forward_calls == backward_calls == []
        assert torch.equal(actual, expected) and torch.equal(x.grad, x_eager.grad)
        for (name, p), (_, q) in zip(jitted.named_parameters(), block.named_parameters(), strict=True):
            assert torch.equal(p.grad, q.grad), name
            p.grad = q.grad = None
    forward, backward = thunder.last_traces(jitted)[-1], thunder.last_backward_traces(jitted)[-1]
    regions = _regions(forward) + _regions(backward)
    assert len(regions) == 2
    for region in regions:
        (program,) = region._call_ctx.values()
        assert len(program.__wrapped__.__wrapped__.programs) == 1


def test_a_region_whose_number_input_changes_every_call_stops_compiling_at_the_limit():
    """Each new value of a number input is a new layout compiled; after ``RECOMPILE_LIMIT`` of them the region
    runs op by op, with one warning, and its values stay right."""
    region = cuda_regions.CompiledRegion(lambda x, n: [x * n], "aot_eager")
    x = torch.randn(4)
    for n in range(cuda_regions.RECOMPILE_LIMIT):
        assert torch.equal(region(x, n)[0], x * n)
    with pytest.warns(RuntimeWarning, match="layouts of its inputs compiled already"):
        assert torch.equal(region(x, 100)[0], x * 100)
    assert torch.equal(region(x, 0)[0], x * 0) and len(region.programs) == cuda_regions.RECOMPILE_LIMIT


def test_fp32_regions_opt_in_fuses_fp32_within_the_stated_tolerance_of_eager():
    """``fuse_fp32=True`` (``THUNDERPLUG_CUDA_FUSE_FP32=1``): an fp32 GPT block's forward and backward are
    regions, compiled here by inductor on CPU; output and every gradient within ``FP32_TOLERANCE`` of eager
    (measured: at most 5.7e-6 off, on values up to 17), over two calls of the cached program."""
    gpt = _gpt_module()
    config = gpt.GPTConfig(layers=1, d_model=32, heads=2, seq=16, batch=2, vocab=64)
    torch.manual_seed(0)
    block = gpt.Block(config)
    executors = thunderplug.discover()
    regions = cuda_regions.CudaRegionExecutor(backend="inductor", device_type="cpu", fuse_fp32=True)
    executors.insert([e.name for e in executors].index("aten"), regions)
    jitted = thunder.jit(copy.deepcopy(block), executors=executors)
    for seed in (1, 2):
        torch.manual_seed(seed)
        x = torch.randn(config.batch, config.seq, config.d_model, requires_grad=True)
        x_eager = x.detach().clone().requires_grad_()
        grad = torch.randn_like(x)
        actual, expected = jitted(x), block(x_eager)
        actual.backward(grad)
        expected.backward(grad)
        torch.testing.assert_close(actual, expected, **cuda_regions.FP32_TOLERANCE)
        torch.testing.assert_close(x.grad, x_eager.grad, **cuda_regions.FP32_TOLERANCE)
        for (name, p), (_, q) in zip(jitted.named_parameters(), block.named_parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, **cuda_regions.FP32_TOLERANCE, msg=name)
            p.grad = q.grad = None
    forward, backward = thunder.last_traces(jitted)[-1], thunder.last_backward_traces(jitted)[-1]
    assert len(_regions(forward)) == 1 and len(_regions(backward)) == 1
    assert not {"eager_linear", "eager_sdpa_flash_cpu"} & set(_outside_regions(forward))


@pytest.mark.parametrize("value, fuse_fp32", [(None, False), ("0", False), ("1", True)])
def test_the_fp32_opt_in_is_read_from_the_environment(monkeypatch, value, fuse_fp32):
    if value is None:
        monkeypatch.delenv(hooks.CUDA_FUSE_FP32, raising=False)
    else:
        monkeypatch.setenv(hooks.CUDA_FUSE_FP32, value)
    assert hooks._cuda_regions_executor().fuse_fp32 is fuse_fp32
