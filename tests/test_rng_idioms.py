"""Issue 42: in-place random ops and the samplers thunder 0.2.6 lacks, under discover(), as in eager.

``Tensor.bernoulli_`` (stochastic depth: ``x.new_empty(n, 1).bernoulli_(keep)``, torchvision's
``ops.stochastic_depth`` and ``StochasticDepth``, Swin and EfficientNet blocks), ``normal_``/``uniform_``/
``exponential_``/``random_``/``geometric_``/``log_normal_``/``cauchy_`` on a fresh tensor and on a buffer,
``torch.bernoulli`` and ``torch.randperm``: each program trains 3 AdamW steps, outputs, losses, gradients,
parameters, buffers and torch's CPU generator state bit-identical to eager, in train and eval mode
(``thunderplug_aten_ops.random_ops``: the torch function itself at its place in the trace). Before: ``AttributeError:
Unknown attribute bernoulli_`` (likewise ``normal_``, ``uniform_``, ...), ``torch.randperm ... not yet supported``,
and ``exponential_`` drawing other numbers than eager's (thunder's ``-log(uniform)``), silently.

An explicit ``generator=`` (made in forward, a module attribute, an argument; thunder refuses ``torch.randn(...,
generator=g)`` & co.: a trace cannot hold a generator object) breaks the graph at the call, which Dynamo runs with
the user's generator: eager's numbers and generator states. ``torch.bernoulli`` of probabilities requiring grad gets
eager's zero gradient. Refused by name and line: an in-place sampler applied to a tensor computed from one that
requires grad (eager gives it a zero gradient, which thunder's autodiff drops) and ``bernoulli`` with a number ``p``
of one (eager's backward raises); a leaf requiring grad gets eager's in-place error.
"""

from __future__ import annotations

import os

import pytest
import thunder
import torch
import torchvision
from torch import nn
from train_like_eager import train_like_eager

import thunderplug


class _Apply(nn.Module):
    """A linear layer, then ``fn`` of its output."""

    def __init__(self, fn, features: int = 8):
        super().__init__()
        self.fn = fn
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return self.fn(self.linear(x))


class _StochasticDepth(nn.Module):
    """timm's drop_path: a residual block kept per sample with ``bernoulli_``, only in training."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        self.p = p
        self.block = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))

    def forward(self, x):
        if not self.training:
            return x + self.block(x)
        keep = 1 - self.p
        mask = x.new_empty(x.shape[0], 1).bernoulli_(keep)
        return x + self.block(x) * mask / keep


class _NoiseBuffer(nn.Module):
    """A buffer refilled in place every call: ``normal_`` of the whole buffer, ``uniform_`` of a view of it."""

    def __init__(self, view: bool):
        super().__init__()
        self.view = view
        self.linear = nn.Linear(8, 8)
        self.register_buffer("noise", torch.zeros(4, 8))

    def forward(self, x):
        if self.view:
            self.noise[:, :4].uniform_(-1, 1)
        else:
            self.noise.normal_(0, 0.1)
        return self.linear(x) * (1 + self.noise)


PROGRAMS = {
    "new_empty.bernoulli_ stochastic depth": lambda: _StochasticDepth(),
    "torchvision stochastic_depth row": lambda: _Apply(lambda h: torchvision.ops.stochastic_depth(h, 0.5, "row",
                                                                                                  True)),
    "torchvision stochastic_depth batch": lambda: _Apply(lambda h: torchvision.ops.stochastic_depth(h, 0.5, "batch",
                                                                                                    True)),
    "torchvision StochasticDepth module": lambda: nn.Sequential(nn.Linear(8, 8), torchvision.ops.StochasticDepth(0.4,
                                                                                                              "row")),
    "torch.empty(...).bernoulli_": lambda: _Apply(lambda h: h * torch.empty([4, 1], dtype=h.dtype).bernoulli_(0.7)),
    "bernoulli_ with tensor p": lambda: _Apply(lambda h: h * torch.empty_like(h).bernoulli_(h.detach().sigmoid())),
    "bool bernoulli_": lambda: _Apply(lambda h: h * torch.empty(h.shape, dtype=torch.bool).bernoulli_(0.5)),
    "bfloat16 bernoulli_": lambda: _Apply(lambda h: h * torch.empty(h.shape, dtype=torch.bfloat16).bernoulli_(0.1)),
    "torch.bernoulli bfloat16": lambda: _Apply(
        lambda h: h * torch.bernoulli(torch.full(h.shape, 0.1, dtype=torch.bfloat16))),
    "Tensor.bernoulli": lambda: _Apply(lambda h: h * h.detach().sigmoid().bernoulli()),
    # eager's zero gradient through the probabilities: the result requires grad, the layer gets zeros (AdamW decays)
    "torch.bernoulli of probabilities requiring grad": lambda: _Apply(lambda h: torch.bernoulli(h.sigmoid()) * h),
    "Tensor.bernoulli only": lambda: _Apply(lambda h: h.sigmoid().bernoulli()),
    "normal_": lambda: _Apply(lambda h: h + torch.empty_like(h).normal_(0, 2)),
    "uniform_": lambda: _Apply(lambda h: h * torch.empty_like(h).uniform_(-1, 1)),
    "exponential_": lambda: _Apply(lambda h: h * torch.empty_like(h).exponential_(2.0)),
    "random_ int64": lambda: _Apply(lambda h: h * torch.empty(h.shape, dtype=torch.int64).random_(0, 10)),
    "geometric_": lambda: _Apply(lambda h: h * torch.empty_like(h).geometric_(0.3)),
    "log_normal_": lambda: _Apply(lambda h: h * torch.empty_like(h).log_normal_()),
    "cauchy_": lambda: _Apply(lambda h: h * torch.empty_like(h).cauchy_()),
    "randperm indexing": lambda: _Apply(lambda h: h[torch.randperm(h.shape[0])][:3]),
    "randperm int32": lambda: _Apply(lambda h: h * torch.randperm(8, dtype=torch.int32)),
    "normal_ of a buffer": lambda: _NoiseBuffer(view=False),
    "uniform_ of a buffer's view": lambda: _NoiseBuffer(view=True),
    "samplers and dropout interleaved": lambda: _Apply(
        lambda h: nn.functional.dropout(h, 0.3) * torch.empty_like(h).bernoulli_(0.5) + torch.randn_like(h)
        + h[torch.randperm(4)] * torch.empty(1).uniform_()),
}


def _inputs() -> list[tuple]:
    return [(torch.randn(4, 8),) for _ in range(3)]


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_random_ops_draw_eagers_numbers(name, train):
    """3 AdamW steps against eager, the generator state after each equal to eager's."""
    torch.manual_seed(0)
    model = PROGRAMS[name]().train(train)
    train_like_eager(model, _inputs(), check_rng=True)


@pytest.mark.parametrize("name", ["new_empty.bernoulli_ stochastic depth", "normal_", "uniform_ of a buffer's view",
                                  "randperm indexing", "exponential_"])
def test_stock_thunder_fails_or_differs(name):
    """What the tests above guard against: stock thunder (whose compilations the patch leaves alone) raises
    (``Unknown attribute bernoulli_``, ``torch.randperm ... not yet supported``) or draws other numbers."""
    torch.manual_seed(0)
    with pytest.raises((AttributeError, NotImplementedError, AssertionError)):
        train_like_eager(PROGRAMS[name](), _inputs(), stock=True, check_rng=True)


class _GeneratorInside(nn.Module):
    """A generator made and seeded in forward (the same numbers every call)."""

    def __init__(self, fn):
        super().__init__()
        self.fn, self.linear = fn, nn.Linear(8, 8)

    def forward(self, x):
        return self.fn(self.linear(x), torch.Generator().manual_seed(5))


class _GeneratorAttribute(nn.Module):
    """A generator kept by the module (its state advancing from call to call)."""

    def __init__(self, fn):
        super().__init__()
        self.fn, self.linear, self.generator = fn, nn.Linear(8, 8), torch.Generator().manual_seed(5)

    def forward(self, x):
        return self.fn(self.linear(x), self.generator)


WITH_GENERATOR = {
    "torch.randn": lambda h, g: h + torch.randn(h.shape, generator=g),
    "torch.rand": lambda h, g: h * torch.rand(4, 8, generator=g),
    "torch.randint": lambda h, g: h * torch.randint(0, 5, h.shape, generator=g),
    "Tensor.bernoulli_": lambda h, g: h * torch.empty_like(h).bernoulli_(0.5, generator=g),
    "Tensor.normal_": lambda h, g: h + torch.empty_like(h).normal_(generator=g),
    "torch.randperm": lambda h, g: h[torch.randperm(4, generator=g)],
    "torch.bernoulli": lambda h, g: h * torch.bernoulli(torch.full_like(h, 0.3), generator=g),
    "torch.multinomial": lambda h, g: h[torch.multinomial(torch.ones(4), 4, generator=g)],
}


@pytest.mark.parametrize("where", [_GeneratorInside, _GeneratorAttribute], ids=["made in forward", "attribute"])
@pytest.mark.parametrize("name", list(WITH_GENERATOR))
def test_explicit_generators_break_the_graph_and_draw_as_eager(name, where):
    """A ``generator=`` cannot be a trace value (thunder: ``generator is not None which is currently unsupported``,
    or the method unknown): the graph breaks at the call, naming it and the line, and Dynamo runs it with the user's
    generator; 3 steps equal eager's, the module's generator advancing as eager's (the outputs of later steps
    would differ otherwise) and torch's default generator untouched as in eager."""
    torch.manual_seed(0)
    with pytest.warns(thunderplug.ThunderplugWarning, match=rf"{name}.*test_rng_idioms.py:\d+"):
        train_like_eager(where(WITH_GENERATOR[name]), _inputs(), check_rng=True)


def test_a_generator_argument_draws_as_eager():
    def noisy(x, generator):
        return x + torch.randn(x.shape, generator=generator) * torch.empty_like(x).uniform_(generator=generator)

    x = torch.randn(3, 4)
    eager_g, jitted_g = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    jitted = thunder.jit(noisy, executors=thunderplug.discover())
    with pytest.warns(thunderplug.ThunderplugWarning):
        for _ in range(2):
            torch.testing.assert_close(jitted(x, jitted_g), noisy(x, eager_g), rtol=0, atol=0)
    assert torch.equal(jitted_g.get_state(), eager_g.get_state())


REFUSED = {
    "bernoulli_ of a tensor requiring grad": (
        lambda h: h.bernoulli_(0.5) + h, r"Tensor.bernoulli_ of a tensor that requires grad \(at .*test_rng_idioms"),
    "Tensor.bernoulli(p) of a tensor requiring grad": (  # eager: 'derivative for aten::bernoulli is not implemented'
        lambda h: h.sigmoid().bernoulli(0.3), r"torch.bernoulli of a tensor that requires grad \(at .*test_rng_idioms"),
    "normal_ of a tensor requiring grad": (
        lambda h: (h * 2).normal_() + h, r"Tensor.normal_ of a tensor that requires grad \(at .*test_rng_idioms"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_what_thunder_cannot_honour_is_refused_by_name(name):
    """No zero gradient through a sampler: a NotImplementedError naming the op and the line, never other values."""
    fn, message = REFUSED[name]
    jitted = thunder.jit(_Apply(fn), executors=thunderplug.discover())
    with pytest.raises(NotImplementedError, match=message):
        jitted(torch.randn(4, 8))


@pytest.mark.parametrize("method", ["normal_", "bernoulli_", "exponential_", "uniform_"])
def test_sampler_on_a_leaf_requiring_grad_raises_eagers_error(method):
    weight = nn.Parameter(torch.randn(3))
    args = (0.5,) if method == "bernoulli_" else ()
    fn = lambda w: getattr(w, method)(*args)  # noqa: E731
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad") as eager:
        fn(weight)
    with pytest.raises(RuntimeError) as jitted:
        thunder.jit(fn, executors=thunderplug.discover())(weight)
    assert str(jitted.value) == str(eager.value)


def test_samplers_under_no_grad_fill_a_parameter_as_eager():
    """Under ``torch.no_grad()`` a parameter may be refilled in place (an init in forward): eager's numbers."""

    def refill(w):
        with torch.no_grad():
            w.normal_(0, 0.02)
            w[0].bernoulli_(0.5)
        return w * 2

    eager_w, jitted_w = nn.Parameter(torch.zeros(3, 4)), nn.Parameter(torch.zeros(3, 4))
    torch.manual_seed(5)
    expected = refill(eager_w)
    state = torch.get_rng_state()
    torch.manual_seed(5)
    found = thunder.jit(refill, executors=thunderplug.discover())(jitted_w)
    torch.testing.assert_close(found, expected, rtol=0, atol=0)
    torch.testing.assert_close(jitted_w, eager_w, rtol=0, atol=0)
    assert torch.equal(torch.get_rng_state(), state)


HEAVY = os.environ.get("THUNDERPLUG_IDIOMS_HEAVY") == "1"
TORCHVISION_MODELS = {
    "swin_t": (lambda: torchvision.models.swin_t(num_classes=4), (1, 3, 32, 32), 1),
    "efficientnet_b0": (lambda: torchvision.models.efficientnet_b0(num_classes=4), (2, 3, 32, 32), 1),
    "swin_t 64px 2 steps": (lambda: torchvision.models.swin_t(num_classes=4), (1, 3, 64, 64), 2),
    "efficientnet_b0 64px 2 steps": (lambda: torchvision.models.efficientnet_b0(num_classes=4), (2, 3, 64, 64), 2),
}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=[] if "steps" not in n or HEAVY else [pytest.mark.skip(reason="THUNDERPLUG_IDIOMS_HEAVY=1")])
    for n in TORCHVISION_MODELS
])
def test_torchvision_models_with_stochastic_depth_train_as_eager(name):
    """torchvision's swin_t and efficientnet_b0 (stochastic depth in every block) with tiny images."""
    build, shape, steps = TORCHVISION_MODELS[name]
    torch.manual_seed(0)
    train_like_eager(build(), [(torch.randn(shape),) for _ in range(steps)], check_rng=True)


def test_an_unused_draw_still_draws_without_grad():
    """Eager draws where the program says, used or not: the samplers are not removed as dead code (their operators
    are tagged DONT_DCE), so the draws after them are eager's."""

    def unused(h):
        torch.randperm(5)
        torch.empty(3).normal_()
        torch.empty(2).bernoulli_(0.5)
        return h * torch.empty_like(h).uniform_()

    h = torch.randn(3)
    torch.manual_seed(0)
    expected, state = unused(h), torch.get_rng_state()
    torch.manual_seed(0)
    torch.testing.assert_close(thunder.jit(unused, executors=thunderplug.discover())(h), expected, rtol=0, atol=0)
    assert torch.equal(torch.get_rng_state(), state)


class _UnusedDraws(nn.Module):
    """Draws whose results are unused, or only read by the backward, before the dropouts whose masks count: thunder
    dropped ``torch.rand(3)``, ``torch.randn``, ``rand_like``, ``randint``, ``multinomial`` and a discarded dropout as
    dead code (in any grad mode), and moved a discarded dropout under grad (its saved generator state is read by
    the backward only) into the backward, after the later draws."""

    def __init__(self, which: str):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 3)
        self.drop = nn.Dropout(0.4)
        self.which = which

    def forward(self, x):
        h = self.a(x)
        if self.which == "factories":
            torch.rand(3)
            torch.randn(2, 2)
            torch.rand_like(h)
            torch.randint(0, 5, (4,))
            torch.multinomial(torch.ones(5), 2)
        elif self.which == "discarded dropout":
            self.drop(h)
        elif self.which == "discarded F.dropout of an input":
            torch.nn.functional.dropout(x, 0.5)
        return self.b(self.drop(torch.relu(h))), torch.nn.functional.dropout(h, 0.3)


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("which", ["factories", "discarded dropout", "discarded F.dropout of an input"])
def test_unused_draws_keep_eagers_stream(which, train):
    """On main the masks of the later dropouts differed (losses, outputs, gradients) and the generator ended
    elsewhere than eager's."""
    model = _UnusedDraws(which)
    model.train(train)
    train_like_eager(model, _inputs(), check_rng=True)


def test_unused_draws_keep_eagers_stream_under_no_grad():
    model = _UnusedDraws("factories")
    jitted = thunder.jit(model, executors=thunderplug.discover())
    with torch.no_grad():
        for (x,) in _inputs():
            torch.manual_seed(3)
            expected, state = model(x), torch.get_rng_state()
            torch.manual_seed(3)
            for a, b in zip(jitted(x), expected):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
            assert torch.equal(torch.get_rng_state(), state)
