"""torchao float8 training (convert_to_float8_training) under thunder.jit(executors=discover())."""

import copy

import pytest
import thunder
import torch

import thunderplug

float8 = pytest.importorskip("torchao.float8")

RECIPES = {
    "tensorwise": lambda: float8.Float8LinearConfig.from_recipe_name("tensorwise"),
    "tensorwise-emulated": lambda: float8.Float8LinearConfig(emulate=True),
}


def mlp(bias: bool) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(32, 64, bias=bias), torch.nn.GELU(), torch.nn.Linear(64, 16, bias=bias))


@pytest.mark.parametrize(
    "path",
    [
        pytest.param([], id="float8-plugin"),  # torchao's autograd.Function traced whole (the claim)
        pytest.param(["float8"], id="generic"),  # thunder interprets torchao; subclass ops unrolled
    ],
)
@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_five_sgd_steps_match_eager(recipe, bias, path):
    torch.manual_seed(0)
    model = mlp(bias)
    eager = float8.convert_to_float8_training(copy.deepcopy(model), config=RECIPES[recipe]())
    compiled = thunder.jit(
        float8.convert_to_float8_training(copy.deepcopy(model), config=RECIPES[recipe]()),
        executors=thunderplug.discover(exclude=path),
    )
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, compiled)]
    for _ in range(5):
        x, target = torch.randn(16, 32), torch.randn(16, 16)
        losses = []
        for module, optimizer in zip((eager, compiled), optimizers):
            loss = torch.nn.functional.mse_loss(module(x), target)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-4)
    for p, q in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(q, p, atol=1e-4, rtol=1e-4)


def test_rowwise_under_discover_as_in_eager():
    """torch 2.9.1's CPU _scaled_mm supports only per-tensor scales, so eager fails and discover()
    must fail the same way; torch 2.12 supports rowwise scales on the CPU, and then discover()'s
    forward and backward must equal eager's."""
    config = float8.Float8LinearConfig.from_recipe_name("rowwise")
    torch.manual_seed(0)
    model = float8.convert_to_float8_training(mlp(True), config=config)
    compiled_model = copy.deepcopy(model)
    x = torch.randn(16, 32)
    try:
        expected = model(x)
    except RuntimeError as error:
        assert "per-tensor scaling" in str(error)
        with pytest.raises(RuntimeError, match="per-tensor scaling"):
            thunder.jit(compiled_model, executors=thunderplug.discover())(x)
        return
    actual = thunder.jit(compiled_model, executors=thunderplug.discover())(x)
    torch.testing.assert_close(actual, expected, atol=0, rtol=0)
    expected.sum().backward()
    actual.sum().backward()
    for (name, p), q in zip(model.named_parameters(), compiled_model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=0, rtol=0, msg=name)


def test_float8_plugin_traces_torchaos_function_whole():
    compiled = thunder.jit(float8.convert_to_float8_training(mlp(True)), executors=thunderplug.discover())
    compiled(torch.randn(16, 32)).sum().backward()
    initial = str(thunder.last_traces(compiled)[0])
    assert initial.count("matmul_with_hp_or_float8_args.apply(") == 2
    assert "torch.ops.aten._scaled_mm.default" in initial
    # grad_weight for both layers and grad_input for the second (the input needs no gradient),
    # each by the float8 plugin's CPU kernel or by ATen's
    assert str(thunder.last_backward_traces(compiled)[-1]).count("_scaled_mm_default(") == 3


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_eval_mode_and_no_grad_inference_match_eager(bias):
    torch.manual_seed(0)
    model = float8.convert_to_float8_training(mlp(bias)).eval()
    compiled = thunder.jit(model, executors=thunderplug.discover())
    x = torch.randn(16, 32)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    torch.testing.assert_close(compiled(x), model(x))  # eval mode with grad enabled: plain output
