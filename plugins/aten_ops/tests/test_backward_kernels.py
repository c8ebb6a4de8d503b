"""The ``eager_backward_kernels`` executor against eager autograd, **bit for bit** (``torch.equal``)
on random inputs: every claimed op forward and backward in float32, the activations in bfloat16,
and a small transformer block trained 3 AdamW steps. Without the executor thunder's own rules
differ by ulps (``test_thunder_alone_differs``), so these tests fail without it.
"""

from __future__ import annotations

import math

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunderplug
from thunderplug_aten_ops import backward_kernels


def _gelu_new(x):
    """GPT-2's GELU (transformers' ``NewGELUActivation``): tanh and pow(x, 3) composed."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


#: name -> function of one (64, 96) input
OPS = {
    "gelu_new": _gelu_new,
    "relu": F.relu,
    "relu6": F.relu6,
    "hardtanh": lambda x: F.hardtanh(x, -0.5, 0.7),
    "threshold": lambda x: F.threshold(x, 0.1, 20.0),
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "elu": F.elu,
    "celu": lambda x: F.celu(x, 0.7),
    "selu": F.selu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "softplus": lambda x: F.softplus(x, 2.0, 3.0),
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "mish": F.mish,
    "logsigmoid": F.logsigmoid,
    "hardshrink": F.hardshrink,
    "softshrink": F.softshrink,
    "tanhshrink": F.tanhshrink,
    "glu": lambda x: F.glu(x, -1),
    "pow3": lambda x: x.pow(3),
    "pow2": lambda x: x**2,
    "pow_half": lambda x: x.abs().pow(0.5),
    "pow_tensor": lambda x: x.abs().pow(x.roll(1, -1)),
    "rsqrt": lambda x: x.abs().rsqrt(),
    "reciprocal": lambda x: x.reciprocal(),
    "abs": torch.abs,
    "maximum": lambda x: torch.maximum(x, x.roll(1, -1)),
    "minimum": lambda x: torch.minimum(x, x.roll(1, 0)),
    "maximum_broadcast": lambda x: torch.maximum(x, x[:1]),
    "clamp": lambda x: x.clamp(-0.5, 0.5),
    "clamp_min": lambda x: x.clamp(min=-0.5),
    "clamp_tensor": lambda x: x.clamp(x.roll(1, -1) - 1, x.roll(2, -1) + 1),
    "amax": lambda x: x.amax(-1),
    "amin_keepdim": lambda x: x.amin(0, keepdim=True),
    "max": torch.max,
    "max_dim": lambda x: x.max(-1)[0],
    "logsumexp": lambda x: torch.logsumexp(x, -1),
    "normalize": lambda x: F.normalize(x, 0.5, 0),
}
#: bfloat16 too (the rest differ in bfloat16 by thunder's other rules, e.g. sqrt/abs: docs/overrides.md)
BF16_OPS = (
    "gelu_new relu relu6 hardtanh threshold leaky_relu elu celu selu tanh sigmoid silu softplus hardswish "
    "hardsigmoid mish logsigmoid hardshrink softshrink glu pow3 pow2 abs maximum minimum clamp clamp_tensor "
    "amax max max_dim logsumexp"
).split()
#: ops whose float32 backward (or forward) thunder's own rules round differently
THUNDER_DIFFERS = ("gelu_new", "tanh", "sigmoid", "silu", "softplus", "pow3", "selu", "mish", "logsumexp")


def _executors(with_executor: bool = True) -> list:
    exclude = [] if with_executor else [backward_kernels.EXECUTOR_NAME]
    return thunderplug.discover(exclude=exclude, quiet=True)


def _outputs_and_grads(fn, x: torch.Tensor, jit=None):
    x = x.detach().clone().requires_grad_()
    out = (jit(fn) if jit else fn)(x)
    cotangent = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
    (grad,) = torch.autograd.grad(out, x, cotangent)
    return out.detach(), grad


def _bit_identical(name: str, dtype: torch.dtype, executors) -> bool:
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(0)).to(dtype)
    expected = _outputs_and_grads(OPS[name], x)
    actual = _outputs_and_grads(OPS[name], x, lambda f: thunder.jit(f, executors=executors))
    return all(torch.equal(a, e) for a, e in zip(actual, expected))


@pytest.fixture(scope="module")
def plug():
    return _executors()


@pytest.mark.parametrize("name", OPS)
def test_float32_bit_identical(name, plug):
    assert _bit_identical(name, torch.float32, plug)


@pytest.mark.parametrize("name", BF16_OPS)
def test_bfloat16_bit_identical(name, plug):
    assert _bit_identical(name, torch.bfloat16, plug)


@pytest.mark.parametrize("name", THUNDER_DIFFERS)
def test_thunder_alone_differs(name):
    """The test above fails without the executor: thunder's rules are eager's to a few ulps only."""
    assert not _bit_identical(name, torch.float32, _executors(with_executor=False))


#: the activations called as ATen overloads (``torch.ops.aten.<op>.default``, what subclass programs and
#: decompositions call): name -> (function of one (64, 96) input, eager's backward kernel in the backward trace).
#: Unregistered, these ran as the core's fallbacks, whose gradients were torch's decompositions of the backward
#: kernels (mish and silu 1.2e-7 off; softplus, celu, selu, log_sigmoid, glu too)
ATEN = torch.ops.aten
ATEN_OPS = {
    "mish": (ATEN.mish.default, "mish"),
    "silu": (ATEN.silu.default, "silu"),
    "hardswish": (ATEN.hardswish.default, "hardswish"),
    "hardsigmoid": (ATEN.hardsigmoid.default, "hardsigmoid"),
    "softplus": (lambda x: ATEN.softplus.default(x, 2.0, 3.0), "softplus"),
    "celu": (lambda x: ATEN.celu.default(x, 0.7), "elu"),
    "selu": (ATEN.selu.default, "elu"),
    "relu6": (ATEN.relu6.default, "hardtanh"),
    "log_sigmoid": (ATEN.log_sigmoid.default, "log_sigmoid"),
    "hardshrink": (ATEN.hardshrink.default, "hardshrink"),
    "softshrink": (lambda x: ATEN.softshrink.default(x, 0.3), "softshrink"),
    "glu": (lambda x: ATEN.glu.default(x, 0), "glu"),
    "threshold": (lambda x: ATEN.threshold.default(x, 0.1, 20.0), "threshold"),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ATEN_OPS)
def test_aten_activations_run_eagers_backward(name, dtype, plug):
    """``torch.ops.aten.mish.default(x)`` differentiates as ``F.mish(x)`` does: eager's backward kernel, bit for
    bit (values spread over [-12, 12], the kinks 0, +-3, 6 and softplus's threshold among them)."""
    fn, backward = ATEN_OPS[name]
    x = 4 * torch.randn(64, 96, generator=torch.Generator().manual_seed(0))
    x[0, :6] = torch.tensor([0.0, 3.0, -3.0, 6.0, 1.5, -0.3])
    x = x.to(dtype)
    jitted = thunder.jit(fn, executors=plug)
    expected = _outputs_and_grads(fn, x)
    actual = _outputs_and_grads(fn, x, lambda f: jitted)
    assert all(torch.equal(a, e) for a, e in zip(actual, expected))
    assert f"eager_{backward}_backward" in {b.sym.name for b in thunder.last_backward_traces(jitted)[-1].bound_symbols}


def test_kernels_in_the_traces(plug):
    """Forward ATen kernel in the forward trace, eager's backward kernel in the backward trace."""
    jitted = thunder.jit(lambda x: torch.tanh(F.relu(x)), executors=plug)
    jitted(torch.randn(4, 4, requires_grad=True)).sum().backward()
    forward = {b.sym.name for b in thunder.last_traces(jitted)[-1].bound_symbols}
    backward = {b.sym.name for b in thunder.last_backward_traces(jitted)[-1].bound_symbols}
    assert {"eager_relu", "eager_tanh"} <= forward
    assert {"eager_threshold_backward", "eager_tanh_backward"} <= backward


#: activations with ``inplace=True``: eager's backward reads the result (relu_, hardtanh_, leaky_relu_, the ELUs)
#: or the input before the update (silu_, hardswish_, ...: autograd's ``original_self``)
INPLACE = {
    "relu_": lambda y: F.relu(y, inplace=True),
    "threshold_": lambda y: F.threshold(y, 0.5, -1.0, inplace=True),
    "relu6_": lambda y: F.relu6(y, inplace=True),
    "hardtanh_": lambda y: F.hardtanh(y, -1.0, 1.0, inplace=True),
    "hardswish_": lambda y: F.hardswish(y, inplace=True),
    "hardsigmoid_": lambda y: F.hardsigmoid(y, inplace=True),
    "silu_": lambda y: F.silu(y, inplace=True),
    "mish_": lambda y: F.mish(y, inplace=True),
    "leaky_relu_": lambda y: F.leaky_relu(y, 0.1, inplace=True),
    "elu_": lambda y: F.elu(y, inplace=True),
    "celu_": lambda y: F.celu(y, 0.7, inplace=True),
    "selu_": lambda y: F.selu(y, inplace=True),
}


def _inplace_run(name: str, jit=None):
    def fn(x, w):
        y = x * w
        return INPLACE[name](y) * 2 + y  # the result, and the input the op updated

    x = 4 * torch.randn(64, generator=torch.Generator().manual_seed(0))
    x[:4] = torch.tensor([0.0, 6.0, -3.0, 3.0])  # on the kinks
    w = torch.ones(64, requires_grad=True)
    out = (jit(fn) if jit else fn)(x, w)
    out.sum().backward()
    return out.detach(), w.grad


@pytest.mark.parametrize("name", INPLACE)
def test_inplace_activations_bit_identical(name, plug):
    """The in-place forms differentiate as eager's do (thunder's decomposition read the input its ``copy_`` had
    overwritten: hardswish_, silu_, mish_, elu_, selu_ gradients wrong by 1 to 13 with stock thunder; relu6_ and
    hardtanh_ under discover() too, when the clamp's rule read the overwritten input: a MobileNetV2's ReLU6)."""
    expected = _inplace_run(name)
    actual = _inplace_run(name, lambda f: thunder.jit(f, executors=plug))
    assert all(torch.equal(a, e) for a, e in zip(actual, expected))


@pytest.mark.parametrize("name", ["hardswish_", "silu_"])
def test_inplace_activations_differ_without_the_executor(name):
    expected = _inplace_run(name)
    actual = _inplace_run(name, lambda f: thunder.jit(f, executors=_executors(with_executor=False)))
    assert not torch.equal(actual[1], expected[1])


def test_declines_what_eager_runs_elsewhere(plug):
    """Integer inputs stay with thunder (and still match eager)."""
    ints = torch.arange(-3, 3)
    jitted = thunder.jit(lambda x: torch.abs(x).pow(2), executors=plug)
    assert torch.equal(jitted(ints), ints.abs().pow(2))


def test_minimum_is_differentiable(plug):
    """thunder 0.2.6 has no rule for prims.minimum (docs/known-issues.md KI-1); eager's is used."""
    x, y = torch.randn(3, 4, requires_grad=True), torch.randn(2, 2, requires_grad=True)
    fn = lambda x, y: torch.minimum(x, y.max())  # noqa: E731
    expected = torch.autograd.grad(fn(x, y).sum(), [x, y])
    actual = torch.autograd.grad(thunder.jit(fn, executors=plug)(x, y).sum(), [x, y])
    assert all(torch.equal(a, e) for a, e in zip(actual, expected))


class Block(torch.nn.Module):
    """A pre-norm transformer block with a SwiGLU MLP, plus tanh/sigmoid/softplus/GELU heads:
    every activation the executor takes, under LayerNorm and SDPA (eager_kernels)."""

    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.gate, self.up = torch.nn.Linear(dim, 2 * dim), torch.nn.Linear(dim, 2 * dim)
        self.down = torch.nn.Linear(2 * dim, dim)
        self.head = torch.nn.Linear(dim, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(attn)
        h = self.norm2(x)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        y = self.head(x)
        mixed = torch.tanh(y) + torch.sigmoid(y) * F.softplus(y) + F.gelu(y, approximate="tanh") + y.pow(3) * 0.1
        return torch.logsumexp(F.relu(mixed), -1).mean() + mixed.amax(-1).mean()


def _train(model: torch.nn.Module, step_fn, inputs) -> list[torch.Tensor]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x in inputs:
        optimizer.zero_grad()
        loss = step_fn(x)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses


def _block_runs(executors):
    torch.manual_seed(0)
    eager = Block()
    compiled = Block()
    compiled.load_state_dict(eager.state_dict())
    inputs = [torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    expected = _train(eager, eager, inputs)
    actual = _train(compiled, thunder.jit(compiled, executors=executors), inputs)
    return (expected, list(eager.parameters())), (actual, list(compiled.parameters()))


def test_block_three_adamw_steps_bit_identical(plug):
    (losses_e, params_e), (losses_t, params_t) = _block_runs(plug)
    assert all(torch.equal(a, e) for a, e in zip(losses_t, losses_e)), (losses_t, losses_e)
    assert all(torch.equal(a, e) for a, e in zip(params_t, params_e))


def test_block_drifts_without_the_executor():
    (_, params_e), (_, params_t) = _block_runs(_executors(with_executor=False))
    assert not all(torch.equal(a, e) for a, e in zip(params_t, params_e))


def test_an_executor_refuses_a_second_operator_of_one_name():
    """thunder keys implementations by the operator's name: a second one silently took over the first's calls."""
    from thunderplug_aten_ops.eager_kernels import UniqueNamesExecutor

    executor = UniqueNamesExecutor("unique_names_test")
    executor.register_operator("op", meta=lambda x: x, fn=torch.neg)
    with pytest.raises(ValueError, match="'unique_names_test' already has an operator named 'op'"):
        executor.register_operator("op", meta=lambda x: x, fn=torch.abs)


@pytest.mark.parametrize("kwargs", [{"scale_factor": 2.0, "mode": "nearest"}, {"size": (6, 5), "mode": "bilinear"}])
def test_thunders_interpolate_symbol_jitted_under_discover_is_eagers(kwargs):
    """As thunder's test_core_vs_torch_consistency_interpolate calls it (TypeError: too many positional arguments
    before: the composite's eager_interpolate ran interpolate_modes' execution of that name)."""
    x = torch.randn(1, 2, 4, 4)
    jitted = thunder.jit(thunder.torch.interpolate, executors=thunderplug.discover(quiet=True))
    torch.testing.assert_close(jitted(x, **kwargs), torch.nn.functional.interpolate(x, **kwargs), rtol=0, atol=0)
