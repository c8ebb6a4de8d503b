"""float16/bfloat16 elementwise ops with a Python number or a 0-dim tensor operand under ``discover()``: values and
gradients bit for bit with eager on CPU, with and without grad (``thunderplug_aten_ops.scalar_operands``).

Under grad thunder computed ``x + 0.7`` in float32 (eager's CPU kernel casts 0.7 to the tensor's dtype first),
summed a 0-dim float32 operand's gradient in float32 (eager: ``grad * other`` in the result's dtype, summed, then
cast), and failed on ``torch.lerp(x, y, s32)``; without grad ``0.7 * x`` and ``0.7 / x`` ran other kernels. The
gradients of ``div``, ``atan2`` and ``fmod`` differed with two dimensioned operands too.

The sweep: each op of :data:`OPS` x (float16, bfloat16) x each operand of :data:`OPERANDS` x (without grad, with
grad: ``x`` and ``y`` require grad, and the operands marked so).
"""

from __future__ import annotations

import copy

import pytest
import thunder
import torch

import thunderplug

#: name -> (the function of ``x``, ``y`` (float16/bfloat16 tensors) and the operand ``o``; whether ``o`` may be a
#: number)
OPS = {
    "add": (lambda x, y, o: x + o, True),
    "radd": (lambda x, y, o: o + x, True),
    "add_alpha": (lambda x, y, o: torch.add(x, o, alpha=2), True),
    "add_alpha_float": (lambda x, y, o: torch.add(x, y, alpha=0.7) + o * 0, True),
    "sub": (lambda x, y, o: x - o, True),
    "rsub_operator": (lambda x, y, o: o - x, True),
    "rsub": (lambda x, y, o: torch.rsub(x, o), True),
    "mul": (lambda x, y, o: x * o, True),
    "rmul": (lambda x, y, o: o * x, True),
    "div": (lambda x, y, o: x / o, True),
    "rdiv": (lambda x, y, o: o / x, True),
    "div_trunc": (lambda x, y, o: torch.div(x, o, rounding_mode="trunc"), True),
    "div_floor": (lambda x, y, o: torch.div(x, o, rounding_mode="floor"), True),
    "true_divide": (lambda x, y, o: torch.true_divide(x, o), True),
    "pow": (lambda x, y, o: x.abs() ** o, True),
    "rpow": (lambda x, y, o: o ** x, True),
    "atan2": (lambda x, y, o: torch.atan2(x, o), False),
    "remainder": (lambda x, y, o: torch.remainder(x, o), True),
    "fmod": (lambda x, y, o: torch.fmod(x, o), True),
    "maximum": (lambda x, y, o: torch.maximum(x, o), False),
    "minimum": (lambda x, y, o: torch.minimum(x, o), False),
    "where": (lambda x, y, o: torch.where(x > 0, x, o), True),
    "clamp_min": (lambda x, y, o: torch.clamp(x, min=o), True),
    "clamp_max": (lambda x, y, o: torch.clamp(x, max=o), True),
    "lerp": (lambda x, y, o: torch.lerp(x, y, o), True),
    "addcmul": (lambda x, y, o: torch.addcmul(x, y, o), False),
    "addcmul_value": (lambda x, y, o: torch.addcmul(x, y, y, value=o), True),
    "addcdiv": (lambda x, y, o: torch.addcdiv(x, y, o), False),
    "hypot": (lambda x, y, o: torch.hypot(x, o), False),
    "copysign": (lambda x, y, o: torch.copysign(x, o), True),
    "xlogy": (lambda x, y, o: torch.xlogy(x, o), True),
    "logaddexp": (lambda x, y, o: torch.logaddexp(x, o), False),
}
#: operand -> (a Python number, or (0-dim tensor dtype, None for x's; requires grad))
OPERANDS = {
    "float": 0.7,
    "int": 3,
    "f32": (torch.float32, False),
    "f32_grad": (torch.float32, True),
    "f64": (torch.float64, False),
    "f64_grad": (torch.float64, True),
    "same": (None, False),
    "same_grad": (None, True),
}
#: only a number is a Scalar
NUMBER_ONLY = {"addcmul_value"}


@pytest.fixture(scope="module")
def executors():
    return thunderplug.discover()


def _operand(kind: str, dtype: torch.dtype, grad: bool):
    spec = OPERANDS[kind]
    if not isinstance(spec, tuple):
        return spec
    operand_dtype, requiring = spec
    return torch.tensor(0.7, dtype=operand_dtype or dtype).requires_grad_(grad and requiring)


def _run(fn, x, y, o):
    out = fn(x, y, o)
    inputs = [t for t in (x, y, o) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not (inputs and out.requires_grad):
        return out, ()
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
    return out, torch.autograd.grad(out, inputs, cotangent, allow_unused=True)


def _assert_bitwise(found, expected, what):
    assert (found is None) == (expected is None), what
    if expected is not None:
        assert found.dtype == expected.dtype and found.shape == expected.shape, what
        assert torch.equal(found.nan_to_num(1, 2, 3), expected.nan_to_num(1, 2, 3)), what


def _cases():
    """(op, dtype, operand, grad) for each case eager takes: a number only where ``numbers``, a tensor only outside
    :data:`NUMBER_ONLY`; without grad, the operands requiring grad are those without."""
    for op, (_, numbers) in OPS.items():
        for dtype in (torch.float16, torch.bfloat16):
            for kind, spec in OPERANDS.items():
                is_number = not isinstance(spec, tuple)
                if (is_number and not numbers) or (op in NUMBER_ONLY and not is_number):
                    continue
                for grad in (False, True):
                    if grad or not kind.endswith("_grad"):
                        yield pytest.param(op, dtype, kind, grad,
                                           id=f"{op}-{str(dtype)[6:]}-{kind}-{'grad' if grad else 'no_grad'}")


@pytest.mark.parametrize("op, dtype, kind, grad", list(_cases()))
def test_matches_eager(executors, op, dtype, kind, grad):
    fn, _ = OPS[op]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 33, generator=generator).to(dtype).requires_grad_(grad)
    y = torch.randn(64, 33, generator=generator).to(dtype).requires_grad_(grad)
    o = _operand(kind, dtype, grad)
    expected, expected_grads = _run(fn, x, y, o)
    found, found_grads = _run(thunder.jit(fn, executors=executors), x, y, o)
    _assert_bitwise(found, expected, "value")
    assert len(found_grads) == len(expected_grads)
    for i, (f, e) in enumerate(zip(found_grads, expected_grads)):
        _assert_bitwise(f, e, f"gradient {i}")


#: ops whose gradients differed in float16/bfloat16 with two dimensioned operands too (and two that did not)
PAIRS = ["div", "rdiv", "true_divide", "div_floor", "atan2", "fmod", "add", "mul"]


@pytest.mark.parametrize("shape", [(64, 33), (1, 33)], ids=["same_shape", "broadcast"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("op", PAIRS)
def test_dimensioned_operands_match_eager(executors, op, dtype, shape):
    """``x / y``'s gradient for ``y``, ``atan2``'s for both, ``fmod``'s for ``other``: eager's, bit for bit."""
    fn, _ = OPS[op]
    generator = torch.Generator().manual_seed(0)
    x, y = (torch.randn(64, 33, generator=generator).to(dtype).requires_grad_() for _ in range(2))
    o = torch.randn(shape, generator=generator).to(dtype).requires_grad_()
    expected, expected_grads = _run(fn, x, y, o)
    found, found_grads = _run(thunder.jit(fn, executors=executors), x, y, o)
    _assert_bitwise(found, expected, "value")
    for i, (f, e) in enumerate(zip(found_grads, expected_grads, strict=True)):
        _assert_bitwise(f, e, f"gradient {i}")


def _jit_trace(fn, executors, *args):
    jfn = thunder.jit(fn, executors=executors)
    out = jfn(*args)
    backward = str(thunder.last_backward_traces(jfn)[-1]) if out.requires_grad else ""
    return out, str(thunder.last_traces(jfn)[-1]), backward


def test_eager_kernels_forward_and_backward(executors):
    """The forward runs eager's kernel, the backward eager's autograd (a 0-dim float32 operand requiring grad)."""
    x = torch.randn(8, 3, dtype=torch.float16, requires_grad=True)
    s = torch.tensor(0.7, requires_grad=True)
    _, forward, backward = _jit_trace(lambda x, s: x * s, executors, x, s)
    assert "eager_mul_scalar_operand(" in forward
    assert "eager_mul_scalar_operand_backward(" in backward


def test_fp32_unchanged(executors):
    """float32 keeps thunder's decomposition (bit-identical to eager already, and fusable)."""
    x = torch.randn(8, 3, requires_grad=True)
    s = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    _, forward, _ = _jit_trace(lambda x, s: (x + 0.7) * s, executors, x, s)
    assert "_scalar_operand(" not in forward


@pytest.mark.parametrize("fn", [lambda x: x * 0.7, lambda x: x / 0.7, lambda x: torch.div(x, 3)],
                         ids=["mul", "div", "div_int"])
def test_number_kept_in_float_stays_thunders(executors, fn):
    """``x * 0.7`` and ``x / 0.7`` under grad keep thunder's float32 computation (eager's CPU kernels keep the
    number in float too: equal, swept above), which fuses."""
    x = torch.randn(8, 3, dtype=torch.bfloat16, requires_grad=True)
    _, forward, backward = _jit_trace(fn, executors, x)
    assert "_scalar_operand(" not in forward and "_scalar_operand_backward(" not in backward


def test_no_grad_forward_stays_thunders(executors):
    """Without grad ``x + 0.7`` stays the torch executor's ``torch.add`` (eager's kernel already)."""
    x = torch.randn(8, 3, dtype=torch.bfloat16)
    _, forward, _ = _jit_trace(lambda x: x + 0.7, executors, x)
    assert "_scalar_operand(" not in forward


@pytest.mark.parametrize("fn, grad", [(lambda x: x + 0.7, True), (lambda x: 0.7 * x, False)],
                         ids=["add_grad", "rmul_no_grad"])
def test_stock_thunder_differs(fn, grad):
    """Two of the cases above differ from eager without discover() (the sweep cannot pass without this module)."""
    x = torch.randn(64, 33, generator=torch.Generator().manual_seed(0)).to(torch.float16).requires_grad_(grad)
    assert not torch.equal(thunder.jit(fn)(x), fn(x))


class _MLP(torch.nn.Module):
    def __init__(self, shift: float):
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 4)
        self.shift = shift

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = self.up(x) + self.shift
            return self.down(torch.relu(h) * 0.3).float().square().mean()


@pytest.mark.parametrize("shift", [1.0, 0.7])
def test_autocast_mlp_trains_as_eager(executors, shift):
    """A tiny MLP under ``torch.autocast("cpu", dtype=torch.bfloat16)`` with ``h + shift``: 3 SGD steps, losses and
    parameters bit for bit."""
    torch.manual_seed(0)
    model = _MLP(shift)
    twin = copy.deepcopy(model)
    compiled = thunder.jit(twin, executors=executors)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin)]
    for _ in range(3):
        x = torch.randn(8, 16)
        losses = []
        for fn, optimizer in zip((model, compiled), optimizers):
            loss = fn(x)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss)
        assert torch.equal(*losses)
        for p, q in zip(model.parameters(), twin.parameters()):
            assert torch.equal(p, q)
