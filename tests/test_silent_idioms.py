"""Issue 42's silently wrong idioms under discover(): each trains 3 AdamW steps as in eager (losses, gradients,
parameters, buffers and torch's generator bit for bit), or breaks the graph / raises by name and line.

Random ops: dropout in every form and SDPA with ``dropout_p`` draw eager's numbers under grad and their backward
reuses the forward's mask (``thunderplug_aten_ops.random_ops``); stock thunder draws others.
"""

from __future__ import annotations

import copy

import pytest
import thunder
import torch
import torch.nn.functional as F
from thunder.core.transform_common import Transform
from torch import nn
from train_like_eager import assert_exact, train_like_eager

import thunderplug


class _Apply(nn.Module):
    """A linear layer, then ``fn`` of its output (and of the other inputs)."""

    def __init__(self, fn, features: int = 8):
        super().__init__()
        self.fn = fn
        self.linear = nn.Linear(features, features)

    def forward(self, x, *rest):
        return self.fn(self.linear(x), *rest)


def _attention(h):
    q = h.reshape(1, 2, 3, 4)
    return F.scaled_dot_product_attention(q, q.sin(), q.cos(), dropout_p=0.3)


def _attention_mask(h, mask):
    q = h.reshape(1, 2, 6, 2)
    return F.scaled_dot_product_attention(q, q.sin(), q.cos(), attn_mask=mask, dropout_p=0.2, scale=0.7)


RANDOM_PROGRAMS = {
    "F.dropout": (lambda h: F.dropout(h, 0.5, training=True), (4, 8)),
    "nn.Dropout": (nn.Sequential(nn.Dropout(0.3), nn.GELU(), nn.Dropout(0.1)), (4, 8)),
    "two dropouts and torch.rand between": (
        lambda h: F.dropout(h, 0.5) * torch.rand(h.shape) + F.dropout(h.tanh(), 0.2) + torch.randn_like(h), (4, 8)),
    "F.dropout1d": (lambda h: F.dropout1d(h.reshape(2, 2, 8), 0.5), (4, 8)),
    "F.dropout2d": (lambda h: F.dropout2d(h.reshape(2, 2, 2, 4), 0.5), (4, 8)),
    "F.dropout3d": (lambda h: F.dropout3d(h.reshape(1, 2, 2, 2, 4), 0.5), (4, 8)),
    "nn.Dropout2d": (lambda h: nn.Dropout2d(0.4)(h.reshape(2, 4, 2, 2)), (4, 8)),
    "F.alpha_dropout": (lambda h: F.alpha_dropout(h, 0.4, training=True), (4, 8)),
    "nn.AlphaDropout": (lambda h: nn.AlphaDropout(0.4)(h), (4, 8)),
    "F.feature_alpha_dropout": (lambda h: F.feature_alpha_dropout(h.reshape(2, 2, 2, 4), 0.4, training=True), (4, 8)),
    "F.rrelu training": (lambda h: F.rrelu(h, training=True), (4, 8)),
    "F.gumbel_softmax": (lambda h: F.gumbel_softmax(h, tau=0.5), (4, 8)),
    "bfloat16 dropout": (lambda h: F.dropout(h.bfloat16(), 0.5).float(), (4, 8)),
    "SDPA dropout_p": (_attention, (3, 8)),
    "SDPA dropout_p, float mask, scale": (_attention_mask, (3, 8)),
    "SDPA dropout_p q=k=v": (lambda h: F.scaled_dot_product_attention(*(h.reshape(1, 2, 6, 2),) * 3, dropout_p=0.5),
                             (3, 8)),
}


def _random_program(name: str) -> tuple[nn.Module, list[tuple]]:
    fn, shape = RANDOM_PROGRAMS[name]
    torch.manual_seed(0)
    model = _Apply(fn, shape[-1]) if not isinstance(fn, nn.Module) else nn.Sequential(nn.Linear(8, 8), fn)
    inputs = [(torch.randn(shape),) for _ in range(3)]
    if "mask" in name:
        inputs = [(x, torch.randn(6, 6)) for (x,) in inputs]
    return model, inputs


@pytest.mark.parametrize("name", list(RANDOM_PROGRAMS))
def test_random_ops_draw_eagers_numbers(name):
    """The same mask as eager's for the same seed, the backward through the forward's mask, the generator left where
    eager leaves it (silently different before: thunder's ``uniform`` for dropout under grad, a second draw in the
    backward of the automatic registrations)."""
    model, inputs = _random_program(name)
    train_like_eager(model, inputs, check_rng=True)


@pytest.mark.parametrize("name", ["F.dropout", "F.dropout2d", "SDPA dropout_p"])
def test_stock_thunder_draws_other_numbers(name):
    """What the tests above guard against: stock thunder's losses or gradients differ from eager's."""
    model, inputs = _random_program(name)
    with pytest.raises(AssertionError):
        train_like_eager(model, inputs, stock=True, check_rng=True)


def test_random_ops_without_grad_and_in_eval():
    """No grad: the torch function itself; eval mode: no random numbers at all (thunder's, as before)."""
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Dropout2d(0.5))
    jitted = thunder.jit(model, executors=thunderplug.discover())
    x = torch.randn(2, 8, 4, 8)
    for train in (True, False):
        model.train(train)
        with torch.no_grad():
            torch.manual_seed(3)
            expected, state = model(x), torch.get_rng_state()
            torch.manual_seed(3)
            assert_exact(jitted(x), expected)
            assert torch.equal(torch.get_rng_state(), state)


# -- module backward hooks: the graph breaks at the hooked module (thunder ran the module without them) ------


class _Two(nn.Module):
    def __init__(self, register=None):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.register = register

    def forward(self, x):
        handle = self.register(self) if self.register is not None else None
        out = self.b(self.a(x).tanh())  # the line the refusal names
        if handle is not None:
            handle.remove()
        return out


def _pre_hook(module, grad_output):
    return (grad_output[0] * 3,)


def _full_hook(module, grad_input, grad_output):
    return (None if grad_input[0] is None else grad_input[0] * 3,)


HOOKED = {
    "full_backward_pre_hook before jit": lambda m: m.b.register_full_backward_pre_hook(_pre_hook),
    "full_backward_hook before jit": lambda m: m.a.register_full_backward_hook(_full_hook),
}


INSIDE_FORWARD = {
    "full_backward_pre_hook inside forward": lambda m: setattr(
        m, "register", lambda self: self.b.register_full_backward_pre_hook(_pre_hook)),
    "full_backward_hook inside forward": lambda m: setattr(
        m, "register", lambda self: self.b.register_full_backward_hook(_full_hook)),
}


@pytest.mark.parametrize("name", list(INSIDE_FORWARD))
def test_module_backward_hooks_registered_inside_forward_run_as_in_eager(name):
    """Registered inside the forward: the registration breaks the graph (tensor_api's break), so the refusal does
    not meet them; the hooks run as in eager."""
    torch.manual_seed(0)
    model = _Two()
    INSIDE_FORWARD[name](model)
    with pytest.warns(thunderplug.ThunderplugWarning):
        train_like_eager(model, [(torch.randn(3, 4),) for _ in range(3)], check_rng=True)


@pytest.mark.parametrize("name", list(HOOKED))
def test_module_backward_hooks_registered_before_jit_run_as_in_eager(name):
    """The hooked module's call breaks the graph, named by module and line; Dynamo runs it eagerly, so the hooks
    change the gradients as in eager (before: refused by name; stock thunder skips them)."""
    torch.manual_seed(0)
    model = _Two()
    HOOKED[name](model)
    expected = r"Linear with backward hooks at .*test_silent_idioms.py:\d+"
    with pytest.warns(thunderplug.ThunderplugWarning, match=expected):
        train_like_eager(model, [(torch.randn(3, 4, requires_grad=True),) for _ in range(3)], check_rng=True)


def test_module_backward_hooks_are_refused_by_name_where_the_graph_cannot_break():
    """Under a thunder transform the graph cannot break: the break's reason is the error."""
    torch.manual_seed(0)
    model = _Two()
    model.b.register_full_backward_pre_hook(_pre_hook)
    jitted = thunder.jit(model, executors=thunderplug.discover(), transforms=[Transform()])
    with pytest.raises(NotImplementedError, match=r"Linear has backward hooks .* called at .*test_silent_idioms"):
        jitted(torch.randn(3, 4, requires_grad=True))


def test_stock_thunder_ignores_a_backward_pre_hook():
    """What the refusal replaces: stock thunder's gradients silently skip the hook (the pre-hook triples them)."""
    torch.manual_seed(0)
    model = _Two()
    model.b.register_full_backward_pre_hook(_pre_hook)
    jitted = thunder.jit(copy.deepcopy(model))
    x = torch.randn(3, 4)
    model(x).sum().backward()
    jitted(x).sum().backward()
    assert not torch.allclose(jitted._model.b.weight.grad, model.b.weight.grad)
    torch.testing.assert_close(jitted._model.b.weight.grad * 3, model.b.weight.grad)  # the hook's factor, rounded


def test_modules_without_backward_hooks_unchanged():
    torch.manual_seed(0)
    model = _Two()
    train_like_eager(model, [(torch.randn(3, 4),) for _ in range(3)], check_rng=True)


# -- Meta's reference Llama RoPE (torch.polar, view_as_complex, a complex product) -------------------------------


class _MetaRope(nn.Module):
    """A query projection rotated as Meta's reference Llama does (``apply_rotary_emb``)."""

    def __init__(self):
        super().__init__()
        self.wq = nn.Linear(16, 16)
        freqs = 1.0 / (10000 ** (torch.arange(0, 4, 2).float() / 4))
        self.register_buffer("freqs", torch.outer(torch.arange(5).float(), freqs).reshape(5, 1, 2))

    def forward(self, x):
        xq = self.wq(x).reshape(2, 5, 4, 4)
        freqs_cis = torch.polar(torch.ones_like(self.freqs), self.freqs)
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        return torch.view_as_real(xq_ * freqs_cis).flatten(3).type_as(xq)


def test_meta_llama_rope_matches_eager():
    """thunder's gradient of a complex product multiplied by the other operand, not its conjugate (9.5 off eager's
    before 9db9601; ``thunderplug_aten_ops.complex_ops`` gives eager's)."""
    torch.manual_seed(0)
    train_like_eager(_MetaRope(), [(torch.randn(2, 5, 16),) for _ in range(3)], check_rng=True)


def test_stock_thunder_meta_llama_rope_gradients_differ():
    torch.manual_seed(0)
    with pytest.raises(AssertionError):
        train_like_eager(_MetaRope(), [(torch.randn(2, 5, 16),) for _ in range(3)], stock=True, check_rng=True)
