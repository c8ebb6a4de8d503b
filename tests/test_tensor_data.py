"""``tensor.data`` in jitted code, as in eager (``thunderplug.eager.tensor_data``): reading it is ``detach()``, an
in-place update through it changes the tensor without autograd seeing it. Under ``discover()`` outputs,
``requires_grad``, the parameters and buffers after each of three calls (the later ones cached) and every gradient
(``None`` included) are eager's, bit for bit; where the update cannot be exact it is refused, naming ``.data``, the
op and the line. Stock thunder fails on every one (``AttributeError: Unknown attribute data``)."""

from __future__ import annotations

import copy

import pytest
import thunder
import torch

import thunderplug


class Model(torch.nn.Module):
    def __init__(self, forward):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.gain = torch.nn.Parameter(torch.randn(7, generator=generator))
        self.w = torch.nn.Parameter(torch.randn(7, generator=generator))
        self.register_buffer("b", torch.randn(7, generator=generator))
        self.body = forward

    def forward(self, x):
        return self.body(self, x)


def _update_then_use(m, x):
    m.gain.data.mul_(0.9)
    return x * m.gain


def _clamp_then_two_uses(m, x):
    m.w.data.clamp_(-0.5, 0.5)
    return (x * m.w).sin() * m.w + m.gain


def _through_a_kept_data(m, x):
    d = m.gain.data
    d.mul_(0.9)
    return x * d + x * m.gain


def _copy_from_another_parameter(m, x):
    m.gain.data.copy_(m.w * 2)
    return x * m.gain + m.w


def _zero(m, x):
    m.gain.data.zero_()
    return x * m.gain + x * m.w


def _add_data_of_another(m, x):
    m.gain.data.add_(m.w.data * 0.1)
    return x * m.gain


def _two_updates(m, x):
    m.gain.data.mul_(0.9)
    m.gain.data.add_(0.5)
    m.w.data.sub_(m.gain.data)
    return x * m.gain * m.w


def _buffer(m, x):
    m.b.data.mul_(0.5)
    return x * m.b + m.gain


def _setitem(m, x):
    m.gain.data[0] = 1.0
    return x * m.gain


def _intermediate(m, x):
    h = x * m.gain
    h.data.mul_(2.0)
    return h * 3


def _read(m, x):
    return x * m.w.data + m.gain


def _read_only(m, x):
    return m.w.data * 2


#: name -> forward(module, x)
PROGRAMS = {
    "update_then_use": _update_then_use,
    "clamp_then_two_uses": _clamp_then_two_uses,
    "through_a_kept_data": _through_a_kept_data,
    "copy_from_another_parameter": _copy_from_another_parameter,
    "zero": _zero,
    "add_data_of_another": _add_data_of_another,
    "two_updates": _two_updates,
    "buffer": _buffer,
    "setitem": _setitem,
    "intermediate": _intermediate,
    "read": _read,
    "read_only": _read_only,
}


@pytest.fixture(scope="module")
def plug():
    return thunderplug.discover(quiet=True)


def _calls(model, call, n: int = 3):
    """Outputs, ``requires_grad``, state after the call and gradients of (x, gain, w), call after call."""
    results = []
    for i in range(n):
        x = torch.randn(3, 7, generator=torch.Generator().manual_seed(10 + i)).requires_grad_()
        out = call(x)
        grads = None
        if out.requires_grad:
            cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(20 + i))
            grads = torch.autograd.grad(out, [x, model.gain, model.w], cotangent, allow_unused=True)
        state = [t.detach().clone() for t in (model.gain, model.w, model.b)]
        results.append((out.detach(), out.requires_grad, state, grads))
    return results


def _same(actual, expected) -> None:
    for (out, rg, state, grads), (e_out, e_rg, e_state, e_grads) in zip(actual, expected, strict=True):
        assert torch.equal(out, e_out) and rg == e_rg
        assert all(torch.equal(a, e) for a, e in zip(state, e_state, strict=True))
        assert (grads is None) == (e_grads is None)
        for grad, expected_grad in zip(grads or (), e_grads or (), strict=True):
            assert (grad is None) == (expected_grad is None)
            assert grad is None or torch.equal(grad, expected_grad)


@pytest.mark.parametrize("name", PROGRAMS)
def test_data_as_eager(name, plug):
    eager = Model(PROGRAMS[name])
    compiled = copy.deepcopy(eager)
    jitted = thunder.jit(compiled, executors=plug)
    _same(_calls(compiled, jitted), _calls(eager, eager))
    with torch.no_grad():
        _same(_calls(compiled, jitted, 1), _calls(eager, eager, 1))
    stock = copy.deepcopy(eager)
    with pytest.raises(AttributeError, match="Unknown attribute data"):
        thunder.jit(stock)(torch.randn(3, 7))


def test_training_with_data_reads_and_updates_as_eager(plug):
    """Three AdamW steps with weight decay: a parameter read only through ``.data`` keeps ``grad`` None (thunder's
    zeros would decay and move it), the ``.data`` update lands in every step."""

    def body(m, x):
        m.gain.data.clamp_(-1.0, 1.0)
        return ((x * m.gain).tanh() * m.w.data).sum()

    def train(model, step):
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1)
        losses = []
        for i in range(3):
            optimizer.zero_grad()
            loss = step(torch.randn(3, 7, generator=torch.Generator().manual_seed(i)))
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        return losses, [p.detach().clone() for p in model.parameters()], model.w.grad

    eager = Model(body)
    compiled = copy.deepcopy(eager)
    expected, actual = train(eager, eager), train(compiled, thunder.jit(compiled, executors=plug))
    assert all(torch.equal(a, e) for a, e in zip(actual[0], expected[0], strict=True))
    assert all(torch.equal(a, e) for a, e in zip(actual[1], expected[1], strict=True))
    assert expected[2] is None and actual[2] is None


def _after_a_read(m, x):
    y = x * m.gain
    m.gain.data.mul_(0.9)
    return y * m.gain


def _through_a_view(m, x):
    m.gain.data[0:3].mul_(0.9)
    return x * m.gain


@pytest.mark.parametrize(
    ("body", "why"), [(_after_a_read, "after an op read the tensor"), (_through_a_view, "through a view of it")]
)
def test_updates_that_cannot_be_exact_are_refused(body, why, plug):
    """Eager's backward reads the values an op saved before the update, updated (thunder's reads the values before
    it); an update through a view of ``.data``: refused with ``.data``, the op and the line, the module unchanged."""
    model = Model(body)
    before = model.gain.detach().clone()
    line = body.__code__.co_firstlineno + (2 if body is _after_a_read else 1)
    expected = rf"mul_ updates a tensor's `.data` in place {why}.*test_tensor_data.py:{line}\)"
    with pytest.raises(NotImplementedError, match=expected):
        thunder.jit(model, executors=plug)(torch.randn(3, 7, requires_grad=True))
    assert torch.equal(model.gain, before)
