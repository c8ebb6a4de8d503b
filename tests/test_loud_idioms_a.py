"""Issue 42's loud idioms, part A, under discover(): each trains 3 AdamW steps as in eager (losses, outputs'
``requires_grad``, every gradient, parameter and buffer after each step, bit for bit), where stock thunder fails.

Checkpointing: ``torch.utils.checkpoint.checkpoint`` with ``use_reentrant=True`` (and omitted: eager's default) is
traced as thunder's checkpoint (patch "checkpoint lookaside"), and HF's ``gradient_checkpointing_enable()``.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import thunder
import torch
import torch.utils.checkpoint
from torch import nn
from torch.utils._pytree import tree_flatten

import thunderplug

SEED = 4321


def _exact(a, b, tolerance: dict | None = None) -> None:
    assert (a is None) == (b is None), f"gradient {a} where eager's is {b}"
    if a is not None:
        torch.testing.assert_close(a, b, **(tolerance or {"rtol": 0, "atol": 0}))


def _loss(output) -> torch.Tensor:
    tensors = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    return sum(t.float().square().mean() for t in tensors)


def _train(model: nn.Module, inputs: list[tuple], *, flatten=lambda out: out, stock: bool = False,
           tolerance: dict | None = None) -> None:
    """3 AdamW steps of ``model`` eager and jitted from the same seed: losses, which outputs require grad, every
    gradient, parameter and buffer, bit for bit."""
    eager, jitted_model = model, copy.deepcopy(model)
    jitted = thunder.jit(jitted_model) if stock else thunder.jit(jitted_model, executors=thunderplug.discover())
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1) for m in (eager, jitted_model)]
    for step, args in enumerate(inputs):
        results = []
        for run, optimizer in zip((eager, jitted), optimizers):
            torch.manual_seed(SEED + step)
            output = flatten(run(*args))
            loss = _loss(output)
            loss.backward()
            flags = [t.requires_grad for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)]
            results.append((loss.detach(), flags, type(output)))
            optimizer.step()
        (loss_e, flags_e, type_e), (loss_j, flags_j, type_j) = results
        assert type_j is type_e
        assert flags_j == flags_e
        _exact(loss_j, loss_e, tolerance)
        for p_e, p_j in zip(eager.parameters(), jitted_model.parameters()):
            _exact(p_j.grad, p_e.grad, tolerance)
            _exact(p_j, p_e, tolerance)
        for b_e, b_j in zip(eager.buffers(), jitted_model.buffers()):
            _exact(b_j, b_e, tolerance)
        for optimizer in optimizers:
            optimizer.zero_grad()


def _inputs(*shape: int, requires_grad: bool = False, steps: int = 3) -> list[tuple]:
    generator = torch.Generator().manual_seed(7)
    return [(torch.randn(*shape, generator=generator, requires_grad=requires_grad),) for _ in range(steps)]


class _Checkpointed(nn.Module):
    """A linear layer and a checkpointed MLP on its output (``through_input``) or on the raw input."""

    def __init__(self, checkpoint_kwargs: dict, through_input: bool = True):
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
        self.kwargs, self.through_input = checkpoint_kwargs, through_input

    def forward(self, x):
        h = self.first(x)
        inner = h if self.through_input else x
        return h + torch.utils.checkpoint.checkpoint(self.mlp, inner, **self.kwargs)


CHECKPOINTS = {
    "reentrant": {"use_reentrant": True},
    "non-reentrant": {"use_reentrant": False},
    "omitted": {},
    "reentrant-no-rng": {"use_reentrant": True, "preserve_rng_state": False},
}


@pytest.mark.parametrize("kwargs", CHECKPOINTS.values(), ids=CHECKPOINTS.keys())
def test_checkpoint_trains_as_eager(kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _train(_Checkpointed(kwargs), _inputs(4, 8))


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint_of_inputs_not_requiring_grad_as_eager(reentrant):
    """Reentrant checkpointing of a function whose tensor arguments require no grad gives nothing inside a gradient
    (eager's output requires no grad); non-reentrant differentiates the parameters inside."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _train(_Checkpointed({"use_reentrant": reentrant}, through_input=False), _inputs(4, 8))


def test_checkpoint_reentrant_fails_in_stock_thunder():
    with pytest.raises(TypeError, match="exceptions must derive from BaseException"):
        _train(_Checkpointed({"use_reentrant": True}), _inputs(4, 8, steps=1), stock=True)


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.config.use_cache = False
    return model


#: the tiny Llama's embedding gradient is 5.8e-10 (relative 2.2e-5) off eager under discover() with or without
#: checkpointing (the same drift without it; not this idiom's), which AdamW's normalisation makes 1.8e-6 in a
#: parameter after 3 steps: checkpointing adds none, checked bit for bit below
HF_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def _jitted_llama_grads(checkpointing: bool, ids: torch.Tensor) -> list[torch.Tensor]:
    model = _tiny_llama()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.train()
    thunder.jit(model, executors=thunderplug.discover())(ids).logits.square().mean().backward()
    return [p.grad for p in model.parameters()]


@pytest.mark.parametrize("reentrant", [True, False, None], ids=["reentrant", "non-reentrant", "default"])
def test_hf_gradient_checkpointing_trains_as_eager(reentrant):
    model = _tiny_llama()
    kwargs = None if reentrant is None else {"gradient_checkpointing_kwargs": {"use_reentrant": reentrant}}
    model.gradient_checkpointing_enable(**(kwargs or {}))
    model.train()
    generator = torch.Generator().manual_seed(3)
    ids = [(torch.randint(0, 64, (2, 12), generator=generator),) for _ in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _train(model, ids, flatten=lambda out: out.logits, tolerance=HF_TOLERANCE)


def test_hf_gradient_checkpointing_changes_no_gradient_under_discover():
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for with_, without in zip(_jitted_llama_grads(True, ids), _jitted_llama_grads(False, ids)):
            _exact(with_, without)


class _Scaled(torch.autograd.Function):
    """``a * scale * power + shift[0] (+ 1 if flag) + b``, with non-tensor arguments, ``ctx`` attributes,
    ``needs_input_grad`` read in a ``once_differentiable`` backward (one output: thunder's lookaside takes no more;
    ``ctx.mark_non_differentiable`` is still thunder's AttributeError)."""

    @staticmethod
    def forward(ctx, a, b, power: int, scale: float, flag: bool, nothing, shift: tuple):
        assert nothing is None
        ctx.save_for_backward(a)
        ctx.power, ctx.scale = power, scale
        out = a * scale * power + shift[0] + (1.0 if flag else 0.0) + b
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        grad_a = grad * ctx.scale * ctx.power + 0 * a if ctx.needs_input_grad[0] else None
        grad_b = grad if ctx.needs_input_grad[1] else None
        assert not any(ctx.needs_input_grad[2:])
        return grad_a, grad_b, None, None, None, None, None


class _UsesFunction(nn.Module):
    def __init__(self, b_requires_grad: bool):
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.b_requires_grad = b_requires_grad

    def forward(self, x):
        b = self.linear(x) if self.b_requires_grad else x * 2
        return _Scaled.apply(self.linear(x), b, 3, 0.5, True, None, (0.25, 2)).tanh()


@pytest.mark.parametrize("b_requires_grad", [True, False])
def test_autograd_function_with_non_tensor_arguments_and_needs_input_grad_as_eager(b_requires_grad):
    _train(_UsesFunction(b_requires_grad), _inputs(4, 8))


def test_autograd_function_needs_input_grad_fails_in_stock_thunder():
    with pytest.raises(AttributeError, match="needs_input_grad"):
        _train(_UsesFunction(True), _inputs(4, 8, steps=1), stock=True)
