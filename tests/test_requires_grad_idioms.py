"""``t.requires_grad`` of a tensor the jitted program computed answers as in eager (issue 42, silent before under
discover() and stock thunder: thunder sets the flag on inputs only, so every computed tensor said False).

Each program trains 3 AdamW steps under discover() against eager, bit for bit (``train_like_eager``): a branch on
``h.requires_grad``, a tensor hook registered behind it (the graph breaks at the hook, whose records equal eager's),
a part under ``torch.no_grad()``, a frozen layer, and reads on ``argmax``/``detach``/factory results.
"""

from __future__ import annotations

import copy

import pytest
import thunder
import torch
from torch import nn
from train_like_eager import assert_exact, random_inputs, train_like_eager

import thunderplug


class _Branch(nn.Module):
    """``h * 2 if h.requires_grad else h * 3`` on the output of a linear layer (optionally frozen, or computed
    under ``no_grad``), then a second layer."""

    def __init__(self, *, frozen: bool = False, no_grad: bool = False):
        super().__init__()
        self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 3)
        self.a.requires_grad_(not frozen)
        self.no_grad = no_grad

    def forward(self, x):
        if self.no_grad:
            with torch.no_grad():
                h = torch.relu(self.a(x))
        else:
            h = torch.relu(self.a(x))
        h = h * 2 if h.requires_grad else h * 3
        return self.b(h), torch.tensor(float(h.requires_grad))


@pytest.mark.parametrize("frozen, no_grad", [(False, False), (True, False), (False, True)],
                         ids=["trained", "frozen layer", "under no_grad"])
def test_branch_on_requires_grad_takes_eagers_branch(frozen, no_grad):
    """Fails on main for the trained layer (the else branch: losses differ)."""
    train_like_eager(_Branch(frozen=frozen, no_grad=no_grad), random_inputs(4, 6))


def _reads(h: torch.Tensor, w: torch.Tensor) -> list[bool]:
    """``requires_grad`` of what a program computes from ``h`` (derived from a parameter) and ``w``."""
    z = torch.zeros(4, 8)
    z.add_(h)  # an in-place update with a tensor requiring grad: z requires grad after it
    with torch.no_grad():
        n = h * 2
        with torch.enable_grad():
            e = h * 2
    values = [h, h.detach(), h.argmax(1), h > 0, h.long(), torch.zeros_like(h), h.new_zeros(3),
              torch.zeros(2).type_as(h), n, e, z, h.sign(), w * 2, torch.where(h > 0, h, 0.0), h.double()]
    return [v.requires_grad for v in values]


class _Reads(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x, w):
        h = self.a(x)
        flags = torch.tensor([float(f) for f in _reads(h, w)])
        return self.b(h), flags


def test_requires_grad_of_computed_tensors_is_eagers():
    """argmax, comparisons, integer casts, detach, zeros_like/new_zeros/type_as and no_grad results False, the
    rest True, the in-place update True after it (on main all False but the input's). The flags are an output."""
    inputs = [(x, torch.randn(8)) for (x,) in random_inputs(4, 6)]
    model = _Reads()
    expected = _reads(model.a(inputs[0][0]), inputs[0][1])
    assert expected == [True, False, False, False, False, False, False, False, False, True, True, True, False,
                        True, True]
    train_like_eager(model, inputs)


class _Hooked(nn.Module):
    """The corpus's hooks/tensor.register_hook-in-forward: hooks registered behind ``if h.requires_grad``."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 3)
        self.record: list[torch.Tensor] = []

    def forward(self, x):
        h = torch.relu(self.a(x))
        if h.requires_grad:
            h.register_hook(lambda g: self.record.append(g.detach().clone()))
            h.register_hook(lambda g: g.clamp(-0.1, 0.1))
        return self.b(h)


@pytest.mark.parametrize("frozen", [False, True], ids=["trained", "frozen first layer"])
def test_hook_behind_requires_grad_is_registered(frozen):
    """Both hooks run in the backward as in eager (main: no record, unclamped gradients); with the first layer
    frozen, ``h`` does not require grad and neither program registers them."""
    torch.manual_seed(0)
    eager = _Hooked()
    eager.a.requires_grad_(not frozen)
    jitted_model = copy.deepcopy(eager)
    with pytest.warns(thunderplug.ThunderplugWarning) if not frozen else _nothing():
        jitted = thunder.jit(jitted_model, executors=thunderplug.discover())
        optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (eager, jitted_model)]
        for (x,) in random_inputs(4, 6):
            for run, optimizer in zip((eager, jitted), optimizers):
                run(x).square().mean().backward()
                optimizer.step()
            for p_e, p_j in zip(eager.parameters(), jitted_model.parameters()):
                assert_exact(p_j.grad, p_e.grad)
                assert_exact(p_j, p_e)
            for optimizer in optimizers:
                optimizer.zero_grad()
    assert len(jitted_model.record) == len(eager.record) == (0 if frozen else 3)
    for a, b in zip(jitted_model.record, eager.record):
        assert_exact(a, b)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_stock_thunder_still_takes_the_else_branch():
    """What the patch changes: stock thunder's read says False."""
    model = _Branch()
    (x,) = random_inputs(4, 6)[0]
    _, flag = thunder.jit(copy.deepcopy(model))(x)
    assert flag.item() == 0.0 and model(x)[1].item() == 1.0


class _Rounded(nn.Module):
    """Outputs reached from the parameters only through ``floor``/``ceil`` (eager: ``requires_grad=True``, a zero
    gradient, so AdamW still decays the layers' weights), and an in-place ``floor_``."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(6, 4), nn.Linear(6, 4), nn.Linear(6, 4)

    def forward(self, x):
        h = self.c(x) * 3
        h.floor_()
        return self.a(x).floor(), torch.ceil(self.b(x) * 2), h, torch.tensor(float(self.a(x).floor().requires_grad))


def test_floor_and_ceil_outputs_require_grad_as_in_eager():
    """On main the outputs said ``requires_grad=False`` and the three layers got no gradient (eager: zeros)."""
    model = _Rounded()
    assert all(t.requires_grad for t in model(torch.randn(2, 6))[:3])
    train_like_eager(model, random_inputs(4, 6))


def _view_flags(w: torch.Tensor, x: torch.Tensor) -> list[bool]:
    with torch.no_grad():
        views = [w.view(-1), w.t(), w[0], w[:, 1:], w[None], w.transpose(0, 1), w.permute(1, 0), w.unsqueeze(0),
                 w.expand(2, 4, 6), w.narrow(0, 0, 1), w.select(0, 1), w.diagonal(), w.split(1)[0], w.chunk(2)[1],
                 w.unbind()[0], w.movedim(0, 1), w.unflatten(1, (2, 3)), w.view_as(w), w.T, x.view(-1),
                 w[torch.tensor([0, 1])], w.detach(), w.clone(), w * 1, w.view(torch.float32)]
    return [v.requires_grad for v in views] + [(views[0] * 2).requires_grad]


class _NoGradViews(nn.Module):
    """Views made under ``torch.no_grad()`` of a parameter: eager's require grad, copies do not; a branch on one."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 4)

    def forward(self, x):
        flags = _view_flags(self.a.weight, x)
        with torch.no_grad():
            v = self.a.weight.t()
        y = self.a(x)
        return (y * 2 if v.requires_grad else y * 3), torch.tensor([float(f) for f in flags])


def test_views_under_no_grad_require_grad_as_in_eager():
    """On main every view read False (the branch took ``y * 3``: losses differ)."""
    model = _NoGradViews()
    expected = _view_flags(model.a.weight, torch.randn(2, 6))
    assert expected == [True] * 19 + [False] * 6 + [True]
    train_like_eager(model, random_inputs(4, 6))


def test_requires_grad_of_a_reshape_under_no_grad_is_refused_by_line():
    """Eager's answer for ``reshape``/``flatten``/``contiguous`` depends on strides thunder does not trace."""

    def f(w):
        with torch.no_grad():
            r = w.t().reshape(-1)
        return w * 2 if r.requires_grad else w * 3

    jitted = thunder.jit(f, executors=thunderplug.discover())
    with pytest.raises(NotImplementedError, match=r"reshape, flatten or contiguous.*test_requires_grad_idioms.py:\d+"):
        jitted(torch.randn(3, 2, requires_grad=True))
