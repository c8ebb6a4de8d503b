"""thunder's own entry points after ``import thunderplug``: ``recipe="thunderplug"`` and ``plugins="thunderplug"``."""

import copy

import pytest
import thunder
import torch
from thunder.recipes import BaseRecipe
from torch.testing._internal.two_tensor import TwoTensor

import thunderplug  # noqa: F401 - registers the recipe and the plugin

float8 = pytest.importorskip("torchao.float8")


def float8_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    return float8.convert_to_float8_training(model)


def assert_same_step(eager: torch.nn.Module, compiled: torch.nn.Module) -> None:
    x = torch.randn(16, 32, device=next(eager.parameters()).device)
    outputs = [module(x) for module in (eager, compiled)]
    torch.testing.assert_close(outputs[1], outputs[0])
    target = torch.randn_like(outputs[0])
    for out in outputs:
        torch.nn.functional.mse_loss(out, target).backward()
    for p, q in zip(eager.parameters(), compiled.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad)


def test_names_are_registered():
    assert "thunderplug" in thunder.recipes.get_recipes()
    assert "thunderplug" in thunder.plugins.get_plugin_names()


def test_recipe_equals_eager_on_a_float8_mlp():
    eager = float8_mlp()
    compiled = thunder.compile(copy.deepcopy(eager), recipe="thunderplug")
    assert_same_step(eager, compiled)
    names = [ex.name for ex in thunder.compile_data(compiled).executors_list]
    assert names.index("thunderplug") < names.index("float8") < names.index("torch")
    assert "matmul_with_hp_or_float8_args.apply(" in str(thunder.last_traces(compiled)[0])


def test_plugin_adds_thunderplug_to_thunders_recipe_on_cpu():
    """thunder's default recipe needs nvFuser (absent on CPU); with its CPU fuser it runs subclass programs."""
    x = TwoTensor(torch.randn(3, 4), torch.randn(3, 4)).requires_grad_()

    def fn(x):
        return (x * 2).sin()

    compiled = thunder.compile(fn, recipe=BaseRecipe(fuser="torch.compile"), plugins="thunderplug")
    out, expected = compiled(x), fn(x)
    assert type(out) is TwoTensor
    torch.testing.assert_close(out.a, expected.a)
    torch.testing.assert_close(out.b, expected.b)
    (grad,) = torch.autograd.grad(out, x, torch.ones_like(expected))
    (expected_grad,) = torch.autograd.grad(expected, x, torch.ones_like(expected))
    torch.testing.assert_close(grad.a, expected_grad.a)
    torch.testing.assert_close(grad.b, expected_grad.b)
    names = [ex.name for ex in thunder.compile_data(compiled).executors_list]
    assert names.index("thunderplug") < names.index("torchcompile")


def test_plugin_with_a_recipe_asking_for_a_missing_nvfuser_leaves_it_out():
    """thunder's default recipe on a CUDA machine without nvFuser (torch 2.10+) asks for it; so does
    ``fuser="nvfuser"`` here, where it is missing too. Alone it fails as in thunder; with thunderplug's
    plugin, whose executors bring this machine's fuser, it runs, as eager."""
    assert thunder.extend.get_executor("nvfuser") is None or pytest.skip("nvFuser is installed")
    with pytest.raises(ValueError, match="NoneType.* is not a valid Executor"):
        thunder.compile(float8_mlp(), recipe=BaseRecipe(fuser="nvfuser"))(torch.randn(16, 32))
    eager = float8_mlp()
    recipe = BaseRecipe(fuser="nvfuser")
    compiled = thunder.compile(copy.deepcopy(eager), recipe=recipe, plugins="thunderplug")
    assert_same_step(eager, compiled)
    assert recipe.executor_names == ["nvfuser"]  # the recipe itself is unchanged
    names = [ex.name for ex in thunder.compile_data(compiled).executors_list]
    assert "nvfuser" not in names and names.index("thunderplug") < names.index("float8")


@pytest.mark.requires_cuda
def test_plugin_with_thunders_default_recipe_on_cuda():
    eager = float8_mlp().cuda()
    compiled = thunder.compile(copy.deepcopy(eager), plugins="thunderplug")
    assert_same_step(eager, compiled)
