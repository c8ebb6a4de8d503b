"""Ops that eager and torch.compile differentiate and stock thunder 0.2.6 refuses (docs/known-issues.md, once
KI-1 to KI-4, KI-6 and the trace-time refusals: ``%``, ``x.max(1).values``, ``f(*reversed(range(n)))``): under
``discover()`` each runs, its value and every input gradient equal to eager's, bit for bit, on random inputs;
plain ``thunder.jit`` still fails on each (so these tests cannot pass without thunderplug's rules)."""

from __future__ import annotations

import pytest
import thunder
import torch

import thunderplug


def _inputs(*shapes: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator).requires_grad_() for shape in shapes]


_CONSTANT = torch.randn(5, 7, generator=torch.Generator().manual_seed(3))

#: name -> (function, input shapes); every input requires grad
PROGRAMS = {
    "flip": (lambda x: x.flip(0), [(5, 7)]),
    "flip_dims": (lambda x: torch.flip(x, (0, 2)) * x, [(3, 4, 5)]),
    "flip_0dim": (lambda s: s.flip(0) * 2, [()]),
    "lerp_scalar": (lambda x, y: torch.lerp(x, y, 0.3), [(5, 7), (5, 7)]),
    "lerp_tensor": (lambda x, y, w: torch.lerp(x, y, w.sigmoid()), [(5, 7), (5, 7), (5, 7)]),
    "lerp_broadcast": (lambda x, y, w: torch.lerp(x, y, w.sigmoid()), [(5, 7), (1, 7), (5, 1)]),
    "lerp_method": (lambda x, y: x.lerp(y, 0.75).exp(), [(5, 7), (5, 7)]),
    "remainder": (lambda x, y: torch.remainder(x, y.abs() + 0.5), [(5, 7), (5, 7)]),
    "remainder_broadcast": (lambda x, y: torch.remainder(x * 3, y.abs() + 0.5), [(5, 7), (7,)]),
    "remainder_scalar": (lambda x: torch.remainder(x * 3, 0.7), [(5, 7)]),
    "round_method": (lambda x: x.round() * x, [(5, 7)]),
    "round": (lambda x: torch.round(x * 3), [(5, 7)]),
    "trunc": (lambda x: torch.trunc(x * 3) * x, [(5, 7)]),
    "trunc_0dim": (lambda s: s.trunc() + s, [()]),
    "div_trunc": (lambda x, y: torch.div(x * 3, y.abs() + 0.5, rounding_mode="trunc") * x, [(5, 7), (7,)]),
    "div_trunc_scalar": (lambda x: (x * 3).div(0.7, rounding_mode="trunc") + x, [(5, 7)]),
    "hstack": (lambda x, y: torch.hstack([x, y * 2]).exp(), [(5, 7), (5, 3)]),
    "vstack_1d": (lambda x, y: torch.vstack((x, y)).exp(), [(7,), (5, 7)]),
    "dstack": (lambda x, y: torch.dstack([x, y]).sum(2), [(5, 7), (5, 7)]),
    "column_stack": (lambda x, y: torch.column_stack([x, y]).exp(), [(5,), (5, 2)]),
    "row_stack": (lambda x, y: torch.row_stack([x, y]).cos(), [(7,), (7,)]),
    "zeta_q": (lambda q: torch.special.zeta(_CONSTANT.abs() + 2, q.abs() + 1), [(5, 7)]),
    "zeta_number_first": (lambda q: torch.special.zeta(2.5, q.abs() + 1), [(5, 7)]),
    "squeeze_0dim": (lambda s: s.squeeze(-1) * s.squeeze(0), [()]),
    "squeeze_0dim_tuple": (lambda s: s.squeeze((0,)).exp(), [()]),
    "transpose_0dim": (lambda s: s.transpose(0, -1) * 3, [()]),
    "logsumexp_0dim": (lambda s: torch.logsumexp(s, -1) + torch.logsumexp(s * 2, 0), [()]),
    "logsumexp_0dim_keepdim": (lambda s: torch.logsumexp(s, -1, keepdim=True), [()]),
}


def _mod_in_place(x, y):
    t = x * 3
    t %= y.abs() + 0.5
    return t


def _mod_in_place_scalar(x):
    t = x * 3
    t %= -0.7
    return t * x


#: once docs/known-issues.md's trace-time refusals and KI-6: name -> (function, input shapes)
OPERATOR_PROGRAMS = {
    "mod_operator": (lambda x, y: x % (y.abs() + 0.5), [(5, 7), (5, 7)]),
    "mod_operator_negative_divisor": (lambda x, y: (x * 3) % -(y.abs() + 0.5), [(5, 7), (7,)]),
    "mod_operator_scalar": (lambda x: (x * 3) % 2, [(5, 7)]),
    "mod_operator_in_place": (_mod_in_place, [(5, 7), (5, 7)]),
    "mod_operator_in_place_scalar": (_mod_in_place_scalar, [(5, 7)]),
    "max_dim_values": (lambda x: x.max(1, keepdim=True).values * 2 + x.max(dim=0).values, [(5, 7)]),
    "max_dim_indices": (lambda x: x.gather(1, torch.max(x, 1).indices.unsqueeze(1)) * x.min(1).values, [(5, 7)]),
    "sort_values": (lambda x: x.sort(1, descending=True).values.cumsum(1), [(5, 7)]),
    "sort_indices": (lambda x: x.gather(0, torch.sort(x, 0).indices) * x, [(5, 7)]),
    "topk_values": (lambda x: x.topk(3, dim=1).values.exp(), [(5, 7)]),
    "median_dim": (lambda x: torch.median(x, 1, keepdim=True).values * torch.median(x, 0).indices, [(5, 7)]),
    "kthvalue": (lambda x: torch.kthvalue(x, 2, 1).values.sin(), [(5, 7)]),
    "cummax": (lambda x: torch.cummax(x, 1).values * torch.cummin(x, 0).values, [(5, 7)]),
    "permute_reversed_range": (lambda x: x.permute(*reversed(range(x.ndim))) * 2, [(2, 3, 4)]),
    "permute_iterator": (lambda x: x.permute(*iter([1, 0, 2])).exp(), [(2, 3, 4)]),
    "lerp_0dim_start": (lambda s, y: torch.lerp(s, y, 0.3), [(), (5, 7)]),
    "lerp_0dim_start_tensor_weight": (lambda s, y, w: torch.lerp(s, y, w.sigmoid()), [(), (5, 7), (5, 7)]),
    "lerp_smaller_start_method": (lambda s, y, w: s.lerp(y, w.sigmoid()).sum(0), [(7,), (5, 1), (5, 7)]),
    "lerp_0dim_start_later_dims": (lambda s, y: torch.lerp(s * 2, y, 0.75).sum(1), [(), (5, 7)]),
}
PROGRAMS.update(OPERATOR_PROGRAMS)


def _run(fn, inputs: list[torch.Tensor], jit=None):
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = (jit(fn) if jit else fn)(*inputs)
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad(out, inputs, cotangent, allow_unused=True)
    return out.detach(), grads


@pytest.fixture(scope="module")
def plug():
    return thunderplug.discover(quiet=True)


@pytest.mark.parametrize("name", PROGRAMS)
def test_value_and_gradients_are_eagers(name, plug):
    fn, shapes = PROGRAMS[name]
    inputs = _inputs(*shapes)
    expected_out, expected_grads = _run(fn, inputs)
    out, grads = _run(fn, inputs, lambda f: thunder.jit(f, executors=plug))
    assert out.shape == expected_out.shape and torch.equal(out, expected_out)
    for grad, expected in zip(grads, expected_grads, strict=True):
        assert (grad is None) == (expected is None)
        assert grad is None or torch.equal(grad, expected)


#: what stock thunder runs already (a 0-dim flip, a 0-dim logsumexp with keepdim)
STOCK_RUNS = ("flip_0dim", "logsumexp_0dim_keepdim")

#: stock thunder's error on each of :data:`OPERATOR_PROGRAMS`, by the start of the program's name
STOCK_ERRORS = {
    "mod_operator_in_place": (RuntimeError, "Inplace operators like __imod__ are not supported"),
    "mod_operator": (TypeError, "'NoneType' object is not callable"),
    "permute": (RuntimeError, "has no len()"),
    "lerp": ((RuntimeError, IndexError), "Failed to find a gradient transform .*prims.lerp|Dimension out of range"),
    "": (AttributeError, "values|indices"),  # torch.return_types' fields
}


@pytest.mark.parametrize("name", [name for name in PROGRAMS if name not in STOCK_RUNS])
def test_stock_thunder_still_refuses(name):
    """What the test above needs thunderplug for: plain ``thunder.jit`` fails on every program."""
    fn, shapes = PROGRAMS[name]
    if name in OPERATOR_PROGRAMS:
        error, match = next(STOCK_ERRORS[start] for start in STOCK_ERRORS if name.startswith(start))
    else:
        error, match = (RuntimeError, IndexError), None
    with pytest.raises(error, match=match):
        _run(fn, _inputs(*shapes), thunder.jit)


#: calls whose eager result is a ``torch.return_types`` structseq, returned from the jitted function as they are
STRUCTSEQ_CALLS = {
    "max": lambda x: x.max(1),
    "min_keepdim": lambda x: torch.min(x, 0, True),
    "unbound_method": lambda x: torch.Tensor.max(x, 1),
    "sort": lambda x: x.sort(dim=0, stable=True),
    "topk": lambda x: torch.topk(x, 2),
    "mode": lambda x: x.mode(1),
    "linalg_qr": lambda x: torch.linalg.qr(x),
    "nested": lambda x: (x.max(1), [x.sort(0)], {"k": x.kthvalue(2)}, x.cummin(0)[0]),
}


def _same(actual, expected) -> None:
    assert type(actual) is type(expected)
    if isinstance(expected, torch.Tensor):
        assert torch.equal(actual, expected) and actual.requires_grad == expected.requires_grad
    elif isinstance(expected, dict):
        assert actual.keys() == expected.keys()
        for key in expected:
            _same(actual[key], expected[key])
    else:
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            _same(a, e)


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("name", STRUCTSEQ_CALLS)
def test_structseq_results_are_eagers(name, grad, plug):
    """``x.max(1)`` returned from the jitted function is eager's ``torch.return_types.max``, fields and values
    eager's (stock thunder returns a plain tuple); the gradient through ``.values`` is eager's."""
    fn = STRUCTSEQ_CALLS[name]
    (x,) = _inputs((4, 4))
    with torch.set_grad_enabled(grad):
        expected = fn(x)
        actual = thunder.jit(fn, executors=plug)(x)
        stock = thunder.jit(fn)(x)
    _same(actual, expected)
    with pytest.raises(AssertionError):  # stock thunder: plain tuples
        _same(stock, expected)
    if grad and name == "max":
        cotangent = torch.randn(4, generator=torch.Generator().manual_seed(2))
        assert torch.equal(torch.autograd.grad(actual.values, x, cotangent)[0],
                           torch.autograd.grad(expected.values, x, cotangent)[0])


def test_remainder_of_a_number_by_a_tensor_runs_and_its_backward_raises_as_eagers(plug):
    """``2 % x`` is eager's ``remainder.Scalar_Tensor``: its values, a result that requires grad, and a backward
    that raises eager's error (eager has no derivative for it); stock thunder fails on ``%``."""
    (x,) = _inputs((5, 7))
    for fn in (lambda x: 2 % x, lambda x: 2.5 % (x * 2)):
        expected = fn(x)
        out = thunder.jit(fn, executors=plug)(x)
        assert torch.equal(out, expected) and out.dtype == expected.dtype and out.requires_grad
        for result in (out, expected):
            with pytest.raises(RuntimeError, match="derivative for aten::remainder is not implemented"):
                result.sum().backward()
        with pytest.raises(TypeError, match="'NoneType' object is not callable"):
            thunder.jit(fn)(x)


def test_remainder_in_place_on_an_input_updates_it_as_eager(plug):
    def fn(x, y):
        x %= y
        return x * 2

    x, y = torch.randn(3, 4), torch.randn(3, 4).abs() + 0.5
    expected_x, actual_x = x.clone(), x.clone()
    expected = fn(expected_x, y)
    assert torch.equal(thunder.jit(fn, executors=plug)(actual_x, y), expected)
    assert torch.equal(actual_x, expected_x)


def test_starred_iterables_are_tuples_as_in_python(plug):
    """``f(*value)`` of any iterable passes its items, as Python does: a generator, a dict (its keys), a set."""
    def fn(x):
        dims = {1: "b", 2: "c", 0: "a"}
        return x.permute(*dims), x.permute(*(d for d in (2, 0, 1))), x.reshape(*{24}), x.flip(*map(int, "02"))

    x = torch.randn(2, 3, 4)
    for actual, expected in zip(thunder.jit(fn, executors=plug)(x), fn(x), strict=True):
        assert torch.equal(actual, expected)


@pytest.mark.parametrize("op", ["nextafter", "zeta", "zeta_number_q", "nextafter_second"])
@pytest.mark.parametrize("wanted", ["first", "both"])
def test_not_implemented_derivatives_raise_as_eagers(op, wanted, plug):
    """``torch.nextafter`` and ``torch.special.zeta``'s first argument have no derivative in eager: the forward
    runs and the backward raises eager's ``NotImplementedError`` (stock thunder refused to compile; a number as
    zeta's ``q`` failed under discover() too: ``'float' object has no attribute 'device'``), also where the other
    argument is ``y.detach()``."""
    fn = {
        "nextafter": torch.nextafter,
        "nextafter_second": lambda x, y: torch.nextafter(y.detach(), x),
        "zeta": lambda x, q: torch.special.zeta(x.abs() + 2, q.abs() + 1),
        "zeta_number_q": lambda x, q: torch.special.zeta(x.abs() + 2, 2.0) * q,
    }[op]
    x, y = _inputs((5, 7), (5, 7))
    y.requires_grad_(wanted == "both")
    for call in (fn, thunder.jit(fn, executors=plug)):
        out = call(x, y)
        assert out.requires_grad
        with pytest.raises(NotImplementedError, match=f"the derivative for '{op.split('_')[0]}' is not implemented"):
            out.sum().backward()


#: ops without a derivative in eager applied to ``x.detach()``: eager's backward never reaches their nodes (so the
#: gradient for ``x`` is that of the rest); under discover() the backward raised (thunder differentiated through
#: its ``detach``). name -> function of one (5, 7) input requiring grad
DETACHED_PROGRAMS = {
    "remainder_of_a_number": lambda x: (2 % x.detach()) + x,
    "remainder_of_a_number_times": lambda x: (2.5 % (x.detach() * 2)) * x,
    "nextafter": lambda x: torch.nextafter(x.detach(), x.detach() + 1) + x,
    "zeta_number_q": lambda x: torch.special.zeta(x.detach().abs() + 2, 2.0) + x,
    "zeta_tensor_q": lambda x: torch.special.zeta(x.detach().abs() + 2, x.abs() + 1) * x,
    "aminmax": lambda x: torch.aminmax(x.detach()).max * x,
    "aminmax_dim": lambda x: torch.aminmax(x.detach(), dim=0, keepdim=True).min * x,
}

#: stock thunder's error on each of :data:`DETACHED_PROGRAMS`, by the start of the program's name
DETACHED_STOCK_ERRORS = {
    "remainder": (TypeError, "'NoneType' object is not callable"),
    "nextafter": (RuntimeError, "Failed to find a gradient transform"),
    "zeta_number": (AttributeError, "'float' object has no attribute 'device'"),
    "zeta_tensor": (RuntimeError, "Backward for PrimIDs.ZETA returned 1 value"),
    "aminmax": (AttributeError, "max|min"),  # torch.return_types' fields
}


@pytest.mark.parametrize("name", DETACHED_PROGRAMS)
def test_ops_without_a_derivative_on_detached_inputs_are_eagers(name, plug):
    """Values, gradients (bit for bit) and ``requires_grad`` of the result are eager's, no error (once the gap
    "thunder 0.2.6 differentiates through its detach" of docs/known-issues.md); stock thunder still fails."""
    fn = DETACHED_PROGRAMS[name]
    inputs = _inputs((5, 7))
    expected_out, expected_grads = _run(fn, inputs)
    out, grads = _run(fn, inputs, lambda f: thunder.jit(f, executors=plug))
    assert torch.equal(out, expected_out) and out.dtype == expected_out.dtype
    assert torch.equal(grads[0], expected_grads[0])
    detached_only = {"nextafter": lambda x: torch.nextafter(x.detach(), x.detach() + 1),
                     "aminmax": lambda x: torch.aminmax(x.detach()).max}.get(name)
    if detached_only is not None:
        assert not thunder.jit(detached_only, executors=plug)(inputs[0]).requires_grad
    error, match = next(DETACHED_STOCK_ERRORS[start] for start in DETACHED_STOCK_ERRORS if name.startswith(start))
    with pytest.raises(error, match=match):
        _run(fn, inputs, thunder.jit)


def test_no_gradient_through_detach(plug):
    """``x * w.detach()``: ``w``'s gradient is ``None``, as eager's (thunder differentiated ``detach`` with torch's
    ``vjp``: zeros, which an optimizer with weight decay or momentum applies to ``w``; stock thunder still)."""
    x, w = _inputs((5, 7), (5, 7))
    fn = lambda x, w: (x * w.detach()).sin() + w.detach()  # noqa: E731
    for call, expected in ((thunder.jit(fn, executors=plug), None), (fn, None), (thunder.jit(fn), "zeros")):
        grad_x, grad_w = torch.autograd.grad(call(x, w).sum(), [x, w], allow_unused=True)
        assert torch.equal(grad_x, torch.autograd.grad(fn(x, w).sum(), x)[0])
        assert grad_w is None if expected is None else torch.equal(grad_w, torch.zeros_like(w))


#: ``torch.aminmax`` calls (eager: the forward runs, both outputs require grad, the backward raises)
AMINMAX_CALLS = {
    "whole": lambda x: torch.aminmax(x),
    "dim": lambda x: torch.aminmax(x, dim=1),
    "dim_keepdim_method": lambda x: x.aminmax(dim=0, keepdim=True),
}


@pytest.mark.parametrize("name", AMINMAX_CALLS)
def test_aminmax_runs_and_its_backward_raises_as_eagers(name, plug):
    """``torch.aminmax(x)`` with ``x`` requiring grad: eager's ``torch.return_types.aminmax`` (values, and both
    outputs requiring grad), and a backward that raises eager's ``derivative for aten::aminmax is not implemented``
    when a gradient reaches it, beside another path (``(x * 2).sum()``) or through one output only; without grad
    the same values. Under discover() it failed at trace time (thunder's automatic registration asks torch for a
    derivative: ``Exception encountered when doing automatic registration``), as stock thunder still does."""
    fn = AMINMAX_CALLS[name]
    (x,) = _inputs((5, 7))
    jitted = thunder.jit(fn, executors=plug)
    expected, actual = fn(x), jitted(x)
    _same(actual, expected)
    for field in ("max", "min"):
        for result in (fn(x), jitted(x)):
            loss = (x * 2).sum() + getattr(result, field).sum()
            with pytest.raises(RuntimeError, match="derivative for aten::aminmax is not implemented"):
                loss.backward()
    with torch.no_grad():
        _same(jitted(x), fn(x))
    _same(thunder.jit(fn, executors=plug)(x.detach()), fn(x.detach()))
    with pytest.raises(NotImplementedError, match="automatic registration .*derivative for aten::aminmax"):
        thunder.jit(lambda x: torch.aminmax(x)[1] * 2)(x)


def test_traces_run_eagers_kernels(plug):
    jitted = thunder.jit(lambda x, y: torch.remainder(torch.lerp(x.flip(1), y, 0.5), 0.3), executors=plug)
    x, y = _inputs((3, 4), (3, 4))
    jitted(x, y).sum().backward()
    forward = {b.sym.name for b in thunder.last_traces(jitted)[-1].bound_symbols}
    backward = {b.sym.name for b in thunder.last_backward_traces(jitted)[-1].bound_symbols}
    assert {"eager_flip", "eager_lerp_scalar", "eager_remainder_scalar"} <= forward
    assert {"eager_flip", "eager_lerp_scalar_backward"} <= backward


def test_squeeze_of_a_0dim_tensor_keeps_torchs_errors(plug):
    """Only dim 0 and -1 are accepted on a 0-dim tensor, as torch does."""
    s = torch.randn(())
    with pytest.raises(IndexError):
        s.squeeze(1)
    with pytest.raises(Exception):  # noqa: B017 - thunder's own error for a dim out of range
        thunder.jit(lambda s: s.squeeze(1), executors=plug)(s)


def _hypot_of_prod(x):
    v0 = torch.relu(x)
    return torch.hypot(v0, v0.prod())  # hypot's backward is 0/0 where v0 == 0 and the product is 0: inf


#: once KI-5: products with zeros, whose gradients eager computes without dividing by the input
PROD_PROGRAMS = {
    "hypot_of_prod": _hypot_of_prod,
    "prod_one_zero": lambda x: (x * (x > -1.4)).prod() * x,
    "prod_zeros": lambda x: torch.relu(x).prod() + x,
    "prod_dim_zeros": lambda x: torch.relu(x).prod(1, keepdim=True) * x,
    "prod_dim": lambda x: torch.prod(x, 0),
}


@pytest.mark.parametrize("name", PROD_PROGRAMS)
def test_prod_gradient_with_zeros_is_eagers(name, plug):
    """``prod``'s backward is eager's ``prod_backward`` (KI-5): thunder's ``prod * g / x`` is NaN at a zero, and
    everywhere for a non-finite cotangent, where eager's is finite; values and gradients bit for bit, with an
    infinite cotangent in one column."""
    fn = PROD_PROGRAMS[name]
    (x,) = _inputs((3, 4))

    def run(call):
        inputs = x.detach().clone().requires_grad_()
        out = call(inputs)
        cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        cotangent[..., 0] = float("inf")
        return out.detach(), torch.autograd.grad(out, inputs, cotangent)[0]

    expected_out, expected_grad = run(fn)
    out, grad = run(thunder.jit(fn, executors=plug))
    assert torch.equal(out, expected_out)
    assert torch.equal(grad.view(torch.int32), expected_grad.view(torch.int32))  # bits: NaN where eager's are
    if name == "hypot_of_prod":
        assert not expected_grad.isnan().any() and run(thunder.jit(fn))[1].isnan().any()
