"""Every hook is documented in docs/hooks.md and exercised by a test; third-party ATen ops."""

import inspect
import math
import re
from pathlib import Path

import pytest
import thunder
import torch
from thunder.core import prims

import thunderplug
from thunderplug import AtenOp, hookimpl
from thunderplug.plugin_api import hookspecs

ROOT = Path(__file__).resolve().parents[1]
HOOKS = [name for name, fn in vars(hookspecs).items() if inspect.isfunction(fn) and hasattr(fn, "thunderplug_spec")]


def test_hookspecs_found():
    assert set(HOOKS) == {"unavailable_reason", "register_executors", "register_aten_ops", "register_claims"}


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_is_documented_with_its_signature(hook):
    parameters = ", ".join(inspect.signature(getattr(hookspecs, hook)).parameters)
    headings = re.findall(r"^## (.+)$", (ROOT / "docs" / "hooks.md").read_text(), flags=re.MULTILINE)
    assert f"`{hook}({parameters})`" in headings


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_has_a_test_implementing_it(hook):
    sources = "\n".join(path.read_text() for path in (ROOT / "tests").rglob("*.py"))
    assert re.search(rf"@hookimpl\s+def {hook}\(", sources), f"no test implements the {hook} hook"


class Rad2Deg:
    """A third-party plugin adding one ATen overload through the hook."""

    @hookimpl
    def register_aten_ops(self, register):
        register(AtenOp(torch.ops.aten.rad2deg.default, lambda a: prims.mul(a, 180.0 / math.pi)))


def test_third_party_plugin_adds_an_aten_symbol(register_plugin):
    register_plugin(Rad2Deg(), "rad2deg")

    def fn(x):
        return torch.ops.aten.rad2deg(x) + torch.ops.aten.rad2deg.default(x)

    x = torch.randn(5, requires_grad=True)
    jitted = thunder.jit(fn, executors=thunderplug.discover())
    torch.testing.assert_close(jitted(x), fn(x))
    torch.testing.assert_close(torch.autograd.grad(jitted(x).sum(), x), torch.autograd.grad(fn(x).sum(), x))
    assert "torch.ops.aten.rad2deg.default" in [b.sym.id for b in thunder.last_traces(jitted)[0].bound_symbols]


def test_decomposition_metadata_is_checked_against_torch(register_plugin):
    class WrongShape:
        @hookimpl
        def register_aten_ops(self, register):
            register(AtenOp(torch.ops.aten.rad2deg.default, lambda a: prims.sum(a, (0,))))

    register_plugin(WrongShape(), "wrong_shape")
    jitted = thunder.jit(lambda x: torch.ops.aten.rad2deg.default(x), executors=thunderplug.discover())
    with pytest.raises(AssertionError, match=r"torch.ops.aten.rad2deg.default: output 0"):
        jitted(torch.randn(2, 3))


def test_same_overload_from_a_second_plugin_skips_only_that_plugin(register_plugin):
    class AddAgain:
        @hookimpl
        def register_aten_ops(self, register):
            register(AtenOp(torch.ops.aten.add.Tensor, lambda a, b, alpha=1: prims.mul(a, b)))

    status = register_plugin(AddAgain(), "add_again")
    assert status.status is thunderplug.Status.CONFLICT
    assert "torch.ops.aten.add.Tensor" in status.reason and "'aten_ops' (thunderplug-aten" in status.reason
    assert "'add_again'" in status.reason
    jitted = thunder.jit(lambda x: torch.ops.aten.add.Tensor(x, x), executors=thunderplug.discover(quiet=True))
    x = torch.randn(3)
    torch.testing.assert_close(jitted(x), x + x)  # aten_ops' add, not the conflicting one
