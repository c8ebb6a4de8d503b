"""nvFuser where CUDA and nvFuser exist; the float8-free torch.compile fuser as the CPU fallback
(the CUDA path without nvFuser: test_cuda_regions.py)."""

import pytest
import thunder
import torch
from torch.testing._internal.two_tensor import TwoTensor

import thunderplug
from thunderplug import PluginHost, Status
from thunderplug_nvfuser import hooks
from thunderplug_nvfuser.cpu_fallback import touches_float8


def test_nvfuser_says_why_it_is_unavailable_here():
    reason = hooks.nvfuser_unavailable_reason()
    if reason is None:
        pytest.skip("CUDA and nvFuser are present")
    assert "CUDA" in reason or "nvfuser" in reason


@pytest.mark.requires_cuda
def test_nvfuser_fuses_the_unrolled_subclass_ops_on_cuda():
    if hooks.nvfuser_unavailable_reason():
        pytest.skip(hooks.nvfuser_unavailable_reason())
    x = TwoTensor(torch.randn(8, 8, device="cuda"), torch.randn(8, 8, device="cuda"))
    jitted = thunder.jit(lambda x: (x * 2).sin(), executors=thunderplug.discover())
    out = jitted(x)
    torch.testing.assert_close(out.a, (x.a * 2).sin())
    assert "nvFusion" in str(thunder.last_traces(jitted)[-1])


def test_one_entry_point_each_executor_says_whether_it_runs_here(monkeypatch):
    if hooks.nvfuser_unavailable_reason() is None:
        pytest.skip("nvFuser is available: no fallback")
    monkeypatch.delenv("THUNDERPLUG_CPU_FUSION", raising=False)
    off = {s.name: s for s in PluginHost(environ={}).report()}["nvfuser"]
    assert off.status is Status.UNAVAILABLE
    assert set(off.unavailable_executors) == {"nvfuser", "torchcompile_cuda", "torchcompile_no_fp8"}
    assert "THUNDERPLUG_CPU_FUSION" in off.unavailable_executors["torchcompile_no_fp8"]
    assert hooks.nvfuser_unavailable_reason() in off.reason

    monkeypatch.setenv("THUNDERPLUG_CPU_FUSION", "yes")
    on = {s.name: s for s in PluginHost(environ={}).report()}["nvfuser"]
    assert (on.status, on.executors, list(on.unavailable_executors)) == (
        Status.ACTIVE,
        ["torchcompile_no_fp8"],
        ["nvfuser", "torchcompile_cuda"],
    )
    names = [ex.name for ex in thunderplug.discover(host=PluginHost(environ={}))]
    assert names.index("torchcompile_no_fp8") < names.index("aten")


def test_cpu_fallback_fuses_subclass_programs_but_never_float8(monkeypatch):
    monkeypatch.setenv("THUNDERPLUG_CPU_FUSION", "1")
    executors = thunderplug.discover(host=PluginHost(environ={"THUNDERPLUG_CPU_FUSION": "1"}))
    x = TwoTensor(torch.randn(3, 4), torch.randn(3, 4))
    jitted = thunder.jit(lambda x: (x * 2 + 1).sin(), executors=executors)
    out = jitted(x)
    torch.testing.assert_close(out.b, (x.b * 2 + 1).sin())
    final = thunder.last_traces(jitted)[-1]
    assert "TorchCompile0" in str(final)
    assert not any(touches_float8(b) for b in final.bound_symbols if b.sym.is_fusion)
