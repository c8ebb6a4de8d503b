"""The float8 plugin's mm rule: equal to the same rule in eager PyTorch, forward and backward."""

import pytest
import thunder
import torch

import thunderplug

pytest.importorskip("torchao.float8")
from torchao.float8.float8_training_tensor import GemmInputRole, LinearMMConfig, hp_tensor_and_scale_to_float8  # noqa: E402

from thunderplug.commands.explain import explain  # noqa: E402
from thunderplug_float8.rules import EagerFloat8MM  # noqa: E402


def to_float8(hp, role):
    scale = torch.finfo(torch.float8_e4m3fn).max / hp.detach().abs().max()
    return hp_tensor_and_scale_to_float8(hp, scale, torch.float8_e4m3fn, LinearMMConfig(), role)


def program(x, w, mm=torch.mm):
    return (mm(to_float8(x, GemmInputRole.INPUT), to_float8(w, GemmInputRole.WEIGHT).t()) * 0.5).sum()


def inputs():
    torch.manual_seed(1)
    return torch.randn(32, 64, requires_grad=True), torch.randn(16, 64, requires_grad=True)


def test_float8_mm_rule_matches_eager_rule_fwd_and_bwd():
    x, w = inputs()
    jitted = thunder.jit(program, executors=thunderplug.discover())
    loss = jitted(x, w)
    loss.backward()
    ref_x, ref_w = inputs()
    reference = program(ref_x, ref_w, mm=EagerFloat8MM.apply)
    reference.backward()
    torch.testing.assert_close(loss, reference)
    torch.testing.assert_close(x.grad, ref_x.grad)
    torch.testing.assert_close(w.grad, ref_w.grad)
    claimed = {row.op: row.executor for row in explain(jitted) if row.stage == "before autodiff"}
    assert claimed["Float8TrainingTensor.torch.mm"] == "float8"
    backward = str(thunder.last_backward_traces(jitted)[-1])
    assert backward.count("_scaled_mm_default(") == 2  # grad_input and grad_weight


def test_plugin_reports_its_claim_executor():
    status = {s.name: s for s in thunderplug.report()}["float8"]
    assert status.executors == ["float8"]


def test_float8_training_with_cpu_fusion_keeps_fp8_out_of_inductor(monkeypatch):
    """torch 2.9.1's inductor crashes (SIGSEGV) on CPU float8 backward kernels: with the CPU
    fallback fuser on, the fp8 work stays outside its regions and training matches eager."""
    import copy

    from torchao.float8 import convert_to_float8_training

    from thunderplug import PluginHost

    touches_float8 = pytest.importorskip("thunderplug_nvfuser.cpu_fallback").touches_float8

    monkeypatch.setenv("THUNDERPLUG_CPU_FUSION", "1")
    executors = thunderplug.discover(host=PluginHost(environ={"THUNDERPLUG_CPU_FUSION": "1"}))
    assert "torchcompile_no_fp8" in [ex.name for ex in executors]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    eager = convert_to_float8_training(copy.deepcopy(model))
    compiled = thunder.jit(convert_to_float8_training(copy.deepcopy(model)), executors=executors)
    for _ in range(2):
        x, target = torch.randn(16, 32), torch.randn(16, 16)
        losses = []
        for module in (eager, compiled):
            loss = torch.nn.functional.mse_loss(module(x), target)
            loss.backward()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-4)
    for p, q in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-4)
    for trace in (thunder.last_traces(compiled)[-1], thunder.last_backward_traces(compiled)[-1]):
        fusions = [b for b in trace.bound_symbols if b.sym.is_fusion]
        assert fusions and not any(touches_float8(b) for b in fusions)


def test_explain_a_float8_mlp():
    from torchao.float8 import convert_to_float8_training

    from thunderplug.commands.explain import explain

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    jitted = thunder.jit(convert_to_float8_training(model), executors=thunderplug.discover())
    jitted(torch.randn(16, 32)).sum().backward()
    rows = explain(jitted)
    program = [(r.op, r.executor) for r in rows if r.stage == "before autodiff"]
    assert program == [("matmul_with_hp_or_float8_args.apply", "float8 (the Function's own backward)")] * 2
    scaled_mm = [r for r in rows if "scaled_mm" in r.op]
    assert {r.trace for r in scaled_mm} == {"forward", "backward"}
    assert {r.executor for r in scaled_mm} == {"float8"}  # on CPU, the plugin's _scaled_mm kernel
