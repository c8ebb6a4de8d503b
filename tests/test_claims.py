"""The claim protocol: a before-autodiff claim wins over default autodiff in any install order."""

import pytest
import thunder
import torch

import thunderplug

pytest.importorskip("torchao.float8")
import float8_claim_plugin as claim_plugin  # noqa: E402
from torchao.float8.float8_training_tensor import GemmInputRole, LinearMMConfig, hp_tensor_and_scale_to_float8  # noqa: E402


def to_float8(hp, role):
    scale = torch.finfo(torch.float8_e4m3fn).max / hp.detach().abs().max()
    return hp_tensor_and_scale_to_float8(hp, scale, torch.float8_e4m3fn, LinearMMConfig(), role)


def program(a, b, mm=torch.mm):
    return mm(to_float8(a, GemmInputRole.INPUT), to_float8(b, GemmInputRole.WEIGHT).t()).relu().sum()


def eager_reference(a, b):
    return program(a, b, mm=claim_plugin.EagerFloat8MM.apply)


def fresh_inputs():
    torch.manual_seed(0)
    return torch.randn(16, 32, requires_grad=True), torch.randn(8, 32, requires_grad=True)


@pytest.mark.parametrize("executor_name", ["aaa_float8_claim", "zzz_float8_claim"])
def test_before_autodiff_claim_wins_in_any_order(register_plugin, executor_name):
    register_plugin(claim_plugin.plugin(executor_name), executor_name)
    claim_plugin.calls.update(forward=0, backward=0)
    executors = thunderplug.discover(exclude=["float8"])  # the float8 plugin claims the same op
    names = [ex.name for ex in executors]
    assert names.index("thunderplug") < names.index(executor_name) < names.index("aten")

    a, b = fresh_inputs()
    loss = thunder.jit(program, executors=executors)(a, b)
    loss.backward()
    ref_a, ref_b = fresh_inputs()
    reference = eager_reference(ref_a, ref_b)
    reference.backward()

    torch.testing.assert_close(loss, reference)
    torch.testing.assert_close(a.grad, ref_a.grad)
    torch.testing.assert_close(b.grad, ref_b.grad)
    assert claim_plugin.calls["forward"] >= 1 and claim_plugin.calls["backward"] >= 1


def test_without_the_claim_the_generic_path_refuses_like_eager():
    """torchao cannot differentiate a plain mm of two float8 tensors (its mm needs both operands
    float8); without the claim thunderplug reports torchao's own error instead of a wrong number."""
    a, b = fresh_inputs()
    with pytest.raises(Exception, match="Expecting  both Float8TrainingTensor"):
        program(a, b).backward()
    jitted = thunder.jit(program, executors=thunderplug.discover(exclude=["float8"]))
    with pytest.raises(Exception, match="Expecting  both Float8TrainingTensor") as error:
        jitted(*fresh_inputs()).backward()
    message = str(error.value)
    assert "no gradient for Float8TrainingTensor.torch.mm" in message and "test_claims.py" in message


def test_forward_without_grad_is_the_same_with_and_without_the_claim(register_plugin):
    a, b = (t.detach() for t in fresh_inputs())
    plain = thunder.jit(program, executors=thunderplug.discover(exclude=["float8"]))(a, b)
    register_plugin(claim_plugin.plugin("float8_claim"), "float8_claim")
    claimed = thunder.jit(program, executors=thunderplug.discover(exclude=["float8"]))(a, b)
    torch.testing.assert_close(claimed, plain)
    torch.testing.assert_close(plain, program(a, b))


def test_explain_shows_the_claim_and_the_declines(register_plugin):
    from thunderplug.commands.explain import explain, format_rows

    register_plugin(claim_plugin.plugin("float8_claim"), "float8_claim")
    jitted = thunder.jit(program, executors=thunderplug.discover(exclude=["float8"]))
    jitted(*fresh_inputs()).backward()
    rows = explain(jitted)
    mm = next(r for r in rows if r.op == "Float8TrainingTensor.torch.mm")
    assert (mm.executor, mm.stage) == ("float8_claim", "before autodiff")
    assert any(r.trace == "backward" and r.executor == "aten" and "scaled_mm" in r.op for r in rows) is False
    assert "float8_claim" in format_rows(rows)

    odd_k = thunder.jit(program, executors=thunderplug.discover(exclude=["float8"]))
    with torch.no_grad():
        odd_k(torch.randn(16, 24), torch.randn(8, 24))
    row = next(r for r in explain(odd_k) if r.op == "Float8TrainingTensor.torch.mm")
    assert row.executor.startswith("thunderplug")
    assert row.declined == ("float8_claim: K (= 24) not divisible by 16",)


def test_fusion_claims_restrict_what_a_fuser_takes(register_plugin):
    from thunderplug import ExecutorSpec, FusionFilter, Priority, hookimpl

    class TorchCompileFuser:
        @hookimpl
        def register_executors(self, register):
            register(ExecutorSpec("torchcompile", lambda: thunder.get_executor("torchcompile"), Priority.FUSER))

    class NoSinInTorchCompile:
        @hookimpl
        def register_claims(self, register):
            register(
                FusionFilter(
                    executor="no_sin",
                    fuser="torchcompile",
                    checker=lambda bsym: "sin stays out" if "sin" in bsym.sym.name else None,
                )
            )

    def fn(x):
        return (x * 2).sin() + 1

    def fused_ops(jitted):
        fusions = [b for b in thunder.last_traces(jitted)[-1].bound_symbols if b.sym.is_fusion]
        return {sub.sym.name for fusion in fusions for sub in fusion.subsymbols}

    x = torch.randn(4, 4)
    register_plugin(TorchCompileFuser(), "torchcompile_fuser")
    plain = thunder.jit(fn, executors=thunderplug.discover())
    torch.testing.assert_close(plain(x), fn(x))
    assert any("sin" in name for name in fused_ops(plain))

    register_plugin(NoSinInTorchCompile(), "no_sin")
    restricted = thunder.jit(fn, executors=thunderplug.discover())
    torch.testing.assert_close(restricted(x), fn(x))
    assert fused_ops(restricted) and not any("sin" in name for name in fused_ops(restricted))
    assert thunder.get_executor("torchcompile").can_fuse.__self__ is thunder.get_executor("torchcompile")
