"""Issue 42, loud idioms part D: user autograd.Functions calling ``ctx.mark_non_differentiable`` or returning
several outputs, ``torch.func.functional_call``, ``torch.distributions``, torchvision's focal and GIoU losses and
``Tensor.tolist()`` in forward, each trained 3 AdamW steps under discover() against eager, bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from train_like_eager import train_like_eager


def _batches(*shape: int) -> list[tuple[torch.Tensor]]:
    return [(torch.randn(*shape),) for _ in range(3)]


class _SortWithIndices(torch.autograd.Function):
    """Two outputs: the sorted values (differentiable) and their indices, marked non-differentiable."""

    @staticmethod
    def forward(ctx, x):
        values, indices = x.sort(-1)
        ctx.mark_non_differentiable(indices)
        ctx.save_for_backward(indices)
        return values, indices

    @staticmethod
    def backward(ctx, grad_values, grad_indices):
        (indices,) = ctx.saved_tensors
        return torch.zeros_like(grad_values).scatter(-1, indices, grad_values)


class _SplitScale(torch.autograd.Function):
    """Two differentiable outputs, a scale as a non-tensor argument, both outputs' gradients used."""

    @staticmethod
    def forward(ctx, x, w, scale: float):
        ctx.save_for_backward(x, w)
        ctx.scale = scale
        return x * w * scale, (x + w).tanh()

    @staticmethod
    def backward(ctx, ga, gb):
        x, w = ctx.saved_tensors
        t = (x + w).tanh()
        common = gb * (1 - t * t)
        return ga * w * ctx.scale + common, (ga * x * ctx.scale + common).sum(0), None


class _Clamp(torch.autograd.Function):
    """One output marked non-differentiable: it does not require grad and carries no gradient (eager never calls
    this backward; if it were used, the gradients would be 1000 times others)."""

    @staticmethod
    def forward(ctx, x):
        out = x.clamp(-0.5, 0.5)
        ctx.mark_non_differentiable(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad * 1000


class _FunctionsModel(nn.Module):
    def __init__(self, which: str):
        super().__init__()
        self.which = which
        self.lin = nn.Linear(6, 6)
        self.w = nn.Parameter(torch.rand(6) + 0.5)

    def forward(self, x):
        h = self.lin(x)
        if self.which == "sort":
            values, indices = _SortWithIndices.apply(h)
            return values * self.w, indices
        if self.which == "two_outputs":
            a, b = _SplitScale.apply(h, self.w, 0.5)
            return a * b + a, b
        if self.which == "only_b":
            _, b = _SplitScale.apply(h, self.w, 2.0)
            return b
        clamped = _Clamp.apply(h)
        return h * clamped, clamped


@pytest.mark.parametrize("which", ["sort", "two_outputs", "only_b", "non_differentiable_output"])
def test_autograd_function_variants_train_as_eager(which):
    torch.manual_seed(0)
    train_like_eager(_FunctionsModel(which), _batches(4, 6))


class _MetaLearner(nn.Module):
    """An inner module run with its parameters scaled through functional_call (a MAML-style inner step)."""

    def __init__(self, call):
        super().__init__()
        self.call = call
        self.inner = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
        self.scale = nn.Parameter(torch.tensor(0.9))

    def forward(self, x):
        params = {name: p * self.scale for name, p in self.inner.named_parameters()}
        return self.call(self.inner, params, (x,)) + self.inner(x)


@pytest.mark.parametrize("call", [torch.func.functional_call, torch.nn.utils.stateless.functional_call],
                         ids=["torch.func", "stateless"])
def test_functional_call_trains_as_eager(call):
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="functional_call"):
        train_like_eager(_MetaLearner(call), _batches(4, 6))


class _Distributions(nn.Module):
    """A VAE-like step (Normal.rsample, kl_divergence), Normal.log_prob/entropy and a Categorical policy loss."""

    def __init__(self, which: str):
        super().__init__()
        self.which = which
        self.enc = nn.Linear(6, 8)
        self.dec = nn.Linear(4, 6)

    def forward(self, x):
        from torch.distributions import Categorical, Normal, kl_divergence

        mean, log_scale = self.enc(x).chunk(2, -1)
        if self.which == "vae":
            posterior = Normal(mean, log_scale.exp())
            kl = kl_divergence(posterior, Normal(torch.zeros_like(mean), torch.ones_like(mean))).sum(-1)
            return ((self.dec(posterior.rsample()) - x) ** 2).sum(-1).mean() + kl.mean()
        if self.which == "normal":
            dist = Normal(mean, log_scale.exp())
            return -dist.log_prob(x[:, :4]).mean() + dist.entropy().mean()
        dist = Categorical(logits=self.enc(x))
        actions = torch.arange(x.shape[0]) % 8
        return -(dist.log_prob(actions) * x[:, 0]).mean() - 0.01 * dist.entropy().mean()


@pytest.fixture
def validating():
    """Eager's default, whatever an earlier ``torch.compile`` of the process left (Dynamo turns it off)."""
    before = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(True)
    yield
    torch.distributions.Distribution.set_default_validate_args(before)


@pytest.mark.parametrize("which", ["vae", "normal", "categorical"])
def test_distributions_train_as_eager(which, validating):
    """rsample draws from the global generator: its state after each step is compared too. The validation is
    a runtime check in the trace, not a graph break (no warning)."""
    import warnings

    from thunderplug.plugin_api.notices import ThunderplugWarning

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ThunderplugWarning)
        train_like_eager(_Distributions(which), _batches(4, 6), check_rng=True)


def _raised(fn, *args) -> str:
    with pytest.raises(ValueError) as info:
        fn(*args)
    return str(info.value)


def _normal_log_prob(loc, scale):
    return torch.distributions.Normal(loc, scale).log_prob(loc)


def _normal_entropy(loc, scale):
    return torch.distributions.Normal(loc, scale, validate_args=True).entropy()


def _categorical_log_prob(logits, action):
    return torch.distributions.Categorical(logits=logits).log_prob(action)


_VALIDATED = [  # (function, valid arguments, invalid arguments)
    (_normal_log_prob, (torch.randn(3), torch.tensor([1.0, 0.5, 2.0])),
     (torch.randn(3), torch.tensor([1.0, -1.0, 2.0]))),
    (_normal_entropy, (torch.zeros(()), torch.tensor(0.5)), (torch.zeros(()), torch.tensor(-0.5))),
    (_normal_log_prob, (torch.randn(3), torch.ones(3)), (torch.tensor([0.0, float("nan"), 1.0]), torch.ones(3))),
    (_categorical_log_prob, (torch.randn(2, 4), torch.tensor([1, 3])), (torch.randn(2, 4), torch.tensor([1, 4]))),
]


@pytest.mark.parametrize("case", range(len(_VALIDATED)), ids=["scale", "scalar-scale", "nan-loc", "action"])
def test_distribution_validation_raises_as_eager(case, validating):
    """Argument (``scale > 0``, ``loc`` not NaN) and sample (an action outside the categories) validation
    checks the real values at every call: valid calls equal eager bit for bit, an invalid one (after a valid one:
    the same trace) raises eager's ValueError with eager's message, followed by the user's line."""
    import thunder

    import thunderplug

    fn, good, bad = _VALIDATED[case]
    jitted = thunder.jit(fn, executors=thunderplug.discover())
    torch.testing.assert_close(jitted(*good), fn(*good), rtol=0, atol=0)
    expected = _raised(fn, *bad)
    message = _raised(jitted, *bad)
    assert message.startswith(expected + "\n(torch.distributions argument validation (at " + __file__), message
    assert thunder.cache_misses(jitted) == 1
    torch.testing.assert_close(jitted(*good), fn(*good), rtol=0, atol=0)


def test_graph_break_keeps_eager_validation():
    """A discover() graph break compiles through ``torch.compile``, whose first use in a process turned
    torch.distributions' validation off everywhere (Dynamo's ``TorchPatcher``): eager's ``Normal(0, -1)`` must
    still raise after it, and so must the distribution in the function Dynamo runs. A fresh process, since that
    patch runs once per process."""
    import subprocess
    import sys
    import textwrap

    program = textwrap.dedent("""
        import torch, thunder, thunderplug

        def fn(x, scale):
            y = x[x > 0]
            return torch.distributions.Normal(y.sum(), scale).log_prob(y)

        jitted = thunder.jit(fn, executors=thunderplug.discover())
        x = torch.randn(8)
        assert torch.equal(jitted(x, torch.tensor(1.0)), fn(x, torch.tensor(1.0)))
        for f in (fn, jitted):
            try:
                f(x, torch.tensor(-1.0))
            except ValueError as error:
                assert "Expected parameter scale" in str(error), error
            else:
                raise AssertionError(f"{f} did not raise")
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", program], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
