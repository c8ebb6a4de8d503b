"""Issue 42, loud idioms part C: complex numbers under discover() as in eager (values, gradients, 3 AdamW steps).

thunder 0.2.6's gradient rules lack the conjugate of complex derivatives (``mul``, ``matmul``, ``einsum``, ``exp``:
silently wrong gradients; ``real`` has no rule): the aten_ops plugin runs every op with a complex argument as the
torch function with eager's autograd (``thunderplug_aten_ops.complex_ops``). Everything is compared bit for bit.
"""

from __future__ import annotations

import pytest
import thunder
import torch

import thunderplug


class _Spectral(torch.nn.Module):
    """An FNO-like block: rfft2, an einsum of the low modes with complex weights, irfft2, a pointwise linear."""

    def __init__(self, channels: int = 3, modes: int = 3):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(channels, channels, modes, modes, dtype=torch.cfloat) * 0.1)
        self.modes = modes
        self.pointwise = torch.nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.modes
        spectrum = torch.fft.rfft2(x)
        out = torch.zeros_like(spectrum)
        out[:, :, :m, :m] = torch.einsum("bixy,ioxy->boxy", spectrum[:, :, :m, :m], self.weight)
        return torch.fft.irfft2(out, s=x.shape[-2:]) + self.pointwise(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _train(jit) -> tuple[list, list, list]:
    torch.manual_seed(0)
    model = _Spectral()
    x = torch.randn(2, 3, 8, 8)
    run = jit(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, grads = [], []
    for _ in range(3):
        loss = run(x).pow(2).mean()
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in model.parameters()])
        optimizer.step()
        optimizer.zero_grad()
    return losses, grads, [p.detach().clone() for p in model.parameters()]


def _assert_same(a, b) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_fno_block_trains_as_eager():
    eager = _train(lambda m: m)
    ours = _train(lambda m: thunder.jit(m, executors=thunderplug.discover()))
    _assert_same(ours, eager)


def test_fno_block_differs_under_stock_thunder():
    """The reason for the fix: stock thunder's complex weight gradients miss the conjugate."""
    eager = _train(lambda m: m)
    stock = _train(thunder.jit)
    assert not torch.equal(stock[1][0][0], eager[1][0][0])


_X, _Y = torch.randn(3, 4), torch.randn(3, 4)
_C, _D = torch.randn(3, 4, dtype=torch.cfloat), torch.randn(3, 4, dtype=torch.cfloat)


def _inplace(c, d):
    e = c * 2
    e.mul_(d)
    e += 1j
    e[0] = d[1]
    return e


PROGRAMS = {
    "mul": (lambda c, d: c * d, (_C, _D)),
    "einsum": (lambda c, d: torch.einsum("ij,kj->ik", c, d), (_C, _D)),
    "matmul": (lambda c, d: c @ d.transpose(-1, -2), (_C, _D)),
    "exp_log_sqrt": (lambda c: c.exp() + c.log() + c.sqrt(), (_C,)),
    "real_imag": (lambda c: c.real * c.imag, (_C,)),
    "abs_angle": (lambda c: c.abs().pow(2) + c.angle(), (_C,)),
    "real_times_complex": (lambda x, c: x * c, (_X, _C)),
    "number_1j": (lambda x: 1j * x, (_X,)),
    "to_cfloat": (lambda x, c: x.to(torch.cfloat) * c, (_X, _C)),
    "complex_div": (lambda x, y, c: torch.complex(x, y) / c, (_X, _Y, _C)),
    "reshape_index": (lambda c: c.reshape(4, 3)[..., 0] * c.reshape(-1)[:4], (_C,)),
    "rsub_rdiv": (lambda c: 1 - c * c + 1 / (c * c), (_C,)),
    "conj_T": (lambda c: c.conj().T @ c, (_C,)),
    "where": (lambda c: torch.where(c.real > 0, c, 0) * c, (_C,)),
    "stack_cat": (lambda c, d: torch.cat([torch.stack([c, d]).sum(0), d], 1) * c.repeat(1, 2), (_C, _D)),
    "in_place": (_inplace, (_C, _D)),
    "view_as_real_rope": (lambda x, f: torch.view_as_real(
        torch.view_as_complex(x.reshape(3, 2, 2)) * torch.polar(torch.ones_like(f), f)).flatten(1), (_X, _Y[:, :2])),
    "ifft_real": (lambda c: torch.fft.ifft(c * c).real, (_C,)),
}


def _values_and_grads(fn, inputs):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    weights = torch.arange(out.numel()).reshape(out.shape)
    loss = (out.real ** 2 + 3 * out.imag).sum() if out.is_complex() else (out * weights).sum()
    return out.detach(), torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("name", PROGRAMS)
def test_complex_program_matches_eager(name):
    fn, inputs = PROGRAMS[name]
    _assert_same(_values_and_grads(thunder.jit(fn, executors=thunderplug.discover()), inputs),
                 _values_and_grads(fn, inputs))


def test_real_programs_have_no_complex_operators():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    jitted = thunder.jit(model, executors=thunderplug.discover())
    jitted(_X.requires_grad_(False)).sum().backward()
    traces = (thunder.last_traces(jitted)[-1], thunder.last_backward_traces(jitted)[-1])
    assert not any("eager_complex" in str(trace) for trace in traces)


class _MaskedBranch(torch.nn.Module):
    """HF DETR's idiom: a Python branch on a tensor cast to bool (``if mask.any():``, ``bool(t)``)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        if (h > 1.0).any():
            h = h * 2
        if bool(h.sum() < 0):
            return -h
        return h + 1


def _train_branches(jit) -> tuple[list, list]:
    torch.manual_seed(0)
    model = _MaskedBranch()
    run = jit(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for scale in (0.01, 10.0, -10.0, 0.01):  # each call takes other branches
        loss = run(torch.randn(3, 4) * scale).pow(2).mean()
        loss.backward()
        losses.append(loss.detach())
        optimizer.step()
        optimizer.zero_grad()
    return losses, [p.detach().clone() for p in model.parameters()]


def test_branch_on_tensor_cast_to_bool_takes_eagers_branch_on_every_call():
    eager = _train_branches(lambda m: m)
    with pytest.warns(thunderplug.ThunderplugWarning, match="test_loud_idioms_c.py"):
        ours = _train_branches(lambda m: thunder.jit(m, executors=thunderplug.discover()))
    _assert_same(ours, eager)
