"""AtenKernelClaim: the documented defaults take the op; a claim that can never run says so and why."""

import subprocess
import sys
import textwrap

import pytest
import thunder
import torch

import thunderplug
from thunderplug import AtenKernelClaim, Priority, hookimpl
from thunderplug.commands.cli import main
from thunderplug.commands.explain import explain, unused_kernel_claims
from thunderplug.host.discovery import default_host

calls: list[str] = []


def counted_mm(a, b):
    calls.append("mm")
    return torch.mm(a, b)


def kernel_plugin(executor: str, **priority):
    class KernelPlugin:
        @hookimpl
        def register_claims(self, register):
            register(AtenKernelClaim(executor, torch.ops.aten.mm.default, kernel=counted_mm, **priority))

    return KernelPlugin()


def direct_mm(x, w):
    return torch.ops.aten.mm.default(x, w) + 1


def test_a_kernel_claim_with_the_documented_defaults_takes_its_op(register_plugin):
    register_plugin(kernel_plugin("my_mm"), "my_kernels")
    jitted = thunder.jit(direct_mm, executors=thunderplug.discover())
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    calls.clear()
    torch.testing.assert_close(jitted(x, w), x @ w + 1)
    assert calls == ["mm"]
    assert any(row.executor == "my_mm" for row in explain(jitted))


def test_a_shadowed_kernel_claim_is_reported_when_discovered_listed_and_explained(register_plugin, capsys):
    register_plugin(kernel_plugin("zz_mm", priority=Priority.DIRECT), "shadowed_kernels")
    with pytest.warns(thunderplug.ThunderplugWarning, match="shadowed by executor 'aten'") as warned:
        executors = thunderplug.discover()
    (message,) = [str(w.message) for w in warned if "zz_mm" in str(w.message)]
    assert "torch.ops.aten.mm.default" in message and "set priority=Priority.BEFORE_AUTODIFF" in message

    main(["plugins"])
    listed = capsys.readouterr().out
    assert "shadowed claims (they never run):" in listed
    assert "zz_mm: torch.ops.aten.mm.default: shadowed by executor 'aten' (priority 10)" in listed

    jitted = thunder.jit(direct_mm, executors=executors)
    calls.clear()
    jitted(torch.randn(3, 4), torch.randn(4, 5))
    assert calls == []
    priorities = {spec.name: spec.priority for spec in default_host().executor_specs()}
    (note,) = unused_kernel_claims(jitted, explain(jitted), priorities)
    assert note.startswith("zz_mm: its claim on torch.ops.aten.mm.default never ran: shadowed by executor 'aten'")
    assert "set priority=Priority.BEFORE_AUTODIFF" in note


def test_explain_says_why_a_kernel_claim_did_not_apply(register_plugin):
    register_plugin(kernel_plugin("my_mm"), "my_kernels")
    executors = thunderplug.discover()
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True)

    trained = thunder.jit(direct_mm, executors=executors)
    trained(x, w).sum().backward()
    (note,) = unused_kernel_claims(trained, explain(trained))
    assert "the program calls it directly and computes gradients" in note

    torch_level = thunder.jit(lambda x, w: torch.nn.functional.linear(x, w.t()), executors=executors)
    torch_level(x.detach(), w.detach())
    assert not unused_kernel_claims(torch_level, explain(torch_level))  # the usual case: a plugin's claim on other ops
    (note,) = [n for n in unused_kernel_claims(torch_level, explain(torch_level), absent=True) if "my_mm" in n]
    assert "no torch.ops.aten.mm.default in the traces" in note and "not torch-level calls" in note


def test_explain_prints_the_reasons_for_a_script(tmp_path):
    script = tmp_path / "shadowed.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch, thunder, thunderplug
            from thunderplug import AtenKernelClaim, Priority, hookimpl
            from thunderplug.host.discovery import default_host

            class Plugin:
                @hookimpl
                def register_claims(self, register):
                    register(AtenKernelClaim("zz_mm", torch.ops.aten.mm.default, kernel=torch.mm,
                                             priority=Priority.DIRECT))

            default_host().add_plugin(Plugin(), "shadowed_kernels")
            f = thunder.jit(lambda x: torch.ops.aten.mm.default(x, x), executors=thunderplug.discover(quiet=True))
            f(torch.randn(3, 3))
            """
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "thunderplug", "explain", str(script)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "notes:\n  zz_mm: its claim on torch.ops.aten.mm.default never ran: shadowed by executor 'aten'" in (
        result.stdout
    )
    assert "set priority=Priority.BEFORE_AUTODIFF on the claim to run first" in result.stdout
