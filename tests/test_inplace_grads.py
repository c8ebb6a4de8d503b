"""Parameters, buffers and inputs updated in place inside a jitted function: gradients, values and
losses over several optimizer steps as in eager (thunderplug.eager.inplace_grads). Stock thunder is run
where it is right (buffers, the error eager raises); where it is wrong a test shows it, so the
override is not silently a no-op."""

import copy

import pytest
import thunder
import torch

import thunderplug


class _Model(torch.nn.Module):
    """A linear layer, a gain and a running buffer; ``update`` changes some of them in ``forward``."""

    def __init__(self, update):
        super().__init__()
        self.update = update
        self.lin = torch.nn.Linear(4, 4)
        self.gain = torch.nn.Parameter(torch.rand(4) + 1.0)
        self.register_buffer("running", torch.zeros(4))

    def forward(self, x):
        before = self.update(self, x)
        out = self.lin(x) * self.gain + self.running
        return (out if before is None else out + before).pow(2).mean()


def _scale_gain_without_grad(model, x):
    with torch.no_grad():
        model.gain.mul_(0.9)


def _clamp_weight_without_grad(model, x):
    with torch.no_grad():
        model.lin.weight.clamp_(-0.3, 0.3)


def _set_an_element_without_grad(model, x):
    with torch.no_grad():
        model.gain[0] = 1.0


def _use_then_scale_without_grad(model, x):
    before = model.lin(x) + model.gain  # the gain's gradient from before the update counts too
    with torch.no_grad():
        model.gain.mul_(0.9).add_(0.01)
    return before


def _running_mean_of_detached_input(model, x):
    model.running.mul_(0.9).add_(0.1 * x.detach().mean(0))


def _running_mean_without_grad(model, x):
    with torch.no_grad():
        model.running.mul_(0.9).add_(0.1 * model.lin(x).mean(0))


PARAMETER_UPDATES = [
    _scale_gain_without_grad,
    _clamp_weight_without_grad,
    _set_an_element_without_grad,
    _use_then_scale_without_grad,
]
BUFFER_UPDATES = [_running_mean_of_detached_input, _running_mean_without_grad]


def _train(model, steps=3):
    """Losses, gradients and the state after each of ``steps`` SGD steps."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    history = []
    for step in range(steps):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(step))
        loss = model(x)
        loss.backward()
        grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
        optimizer.step()
        optimizer.zero_grad()
        history.append((loss.detach(), grads, {k: v.clone() for k, v in model.state_dict().items()}))
    return history


def _assert_trains_like_eager(update, executors):
    torch.manual_seed(0)
    model = _Model(update)
    eager, jitted = copy.deepcopy(model), copy.deepcopy(model)
    expected = _train(eager)
    actual = _train(thunder.jit(jitted, executors=executors) if executors else thunder.jit(jitted))
    for (loss, grads, state), (want_loss, want_grads, want_state) in zip(actual, expected):
        torch.testing.assert_close(loss, want_loss)
        assert all(g is not None for g in want_grads)
        for got, want in zip(grads, want_grads):
            torch.testing.assert_close(got, want)
        for key in want_state:
            torch.testing.assert_close(state[key], want_state[key])


@pytest.mark.parametrize("update", PARAMETER_UPDATES, ids=lambda f: f.__name__.strip("_"))
def test_parameters_updated_in_forward_train_as_in_eager(update):
    _assert_trains_like_eager(update, thunderplug.discover(quiet=True))


@pytest.mark.parametrize("update", BUFFER_UPDATES, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("executors", ["stock", "discover"])
def test_buffers_updated_in_forward_train_as_in_eager(update, executors):
    _assert_trains_like_eager(update, thunderplug.discover(quiet=True) if executors == "discover" else None)


def test_stock_thunder_never_trains_a_parameter_updated_without_grad():
    """What ``inplace_grads`` changes: under stock thunder the gain gets no gradient."""
    model = thunder.jit(_Model(_scale_gain_without_grad))
    model(torch.randn(3, 4)).backward()
    assert model.get_parameter("gain").grad is None


def _double_in_place(a):
    a.mul_(2)
    return (a * 3).sin().sum()


def test_an_input_updated_in_place_with_grad_gets_its_gradient():
    """A non-leaf input updated in place with grad enabled: the gradient goes through the update to
    the tensor it was made from (stock thunder returns none: the output does not require grad)."""
    w = torch.randn(4, requires_grad=True)
    w_ref = w.detach().clone().requires_grad_(True)
    expected = _double_in_place(w_ref * 1.5)
    expected.backward()
    actual = thunder.jit(_double_in_place, executors=thunderplug.discover(quiet=True))(w * 1.5)
    torch.testing.assert_close(actual, expected)
    actual.backward()
    torch.testing.assert_close(w.grad, w_ref.grad)
    assert not thunder.jit(_double_in_place)(w * 1.5).requires_grad


@pytest.mark.parametrize("executors", ["stock", "discover"])
def test_a_parameter_updated_with_grad_raises_as_in_eager(executors):
    def update(model, x):
        model.gain.mul_(0.9)

    message = "a leaf Variable that requires grad is being used in an in-place operation"
    with pytest.raises(RuntimeError, match=message):
        _Model(update)(torch.randn(3, 4))
    model = _Model(update)
    jitted = thunder.jit(model, executors=thunderplug.discover(quiet=True)) if executors == "discover" else (
        thunder.jit(model)
    )
    with pytest.raises(RuntimeError, match=message):
        jitted(torch.randn(3, 4))


def test_a_parameter_updated_without_grad_while_grad_is_off_returns_no_grad():
    """Called under ``no_grad``, the update happens and nothing requires grad, as in eager."""
    torch.manual_seed(0)
    model = _Model(_scale_gain_without_grad)
    eager, jitted = copy.deepcopy(model), copy.deepcopy(model)
    x = torch.randn(3, 4)
    with torch.no_grad():
        expected = eager(x)
        actual = thunder.jit(jitted, executors=thunderplug.discover(quiet=True))(x)
    torch.testing.assert_close(actual, expected)
    assert not actual.requires_grad
    torch.testing.assert_close(jitted.gain, eager.gain)


# --- an input overwritten in place that a gradient formula reads (once KI-9) ---------------------------------


def _mul_in_place(x, w):
    x.mul_(w)
    return x.sin()


def _mul_in_place_twice(x, w, w2):
    x.mul_(w)
    x.mul_(w2)
    return x.sin()


def _read_between_updates(x, w, w2):
    x.mul_(w)
    y = x * 2
    x.div_(w2)
    return x.sin() + y


def _result_of_the_update(x, w):
    y = x.mul_(w)
    return y * x


def _other_input_read_after(x, w, b):
    x.mul_(w).add_(b)
    return (x * b).exp()


#: name -> (function, shapes of the inputs after x (each requires grad))
INPUT_UPDATES = {
    "mul_": (_mul_in_place, [(3, 3)]),
    "mul_twice": (_mul_in_place_twice, [(3, 3), (3, 3)]),
    "read_between_updates": (_read_between_updates, [(3, 3), (3, 3)]),
    "result_of_the_update": (_result_of_the_update, [(3, 3)]),
    "broadcast_weight_and_chain": (_other_input_read_after, [(3,), (3, 3)]),
}


def _input_update_case(name: str):
    fn, shapes = INPUT_UPDATES[name]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 3, generator=generator)
    weights = [(torch.randn(shape, generator=generator).abs() + 0.5).requires_grad_() for shape in shapes]
    return fn, x, weights


def _updated_and_grads(fn, x, weights, jit=None):
    x = x.clone()
    out = (jit(fn) if jit else fn)(x, *weights)
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    return out, x, torch.autograd.grad(out, weights, cotangent)


@pytest.mark.parametrize("name", INPUT_UPDATES)
def test_an_input_overwritten_in_place_keeps_the_value_gradients_read(name):
    """``x.mul_(w)`` on a plain input: thunder's ``copy_`` writes the product into ``x``, whose old value
    ``mul``'s gradient for ``w`` reads (stock thunder and discover() read the new one: a wrong gradient,
    silently). The ``copy_`` still updates the caller's tensor; the gradient reads a copy taken before it, as
    eager's ``original_self``. A second update of the same input went into a copy under discover() (the
    caller's tensor kept the first update only, silently); it updates the input again."""
    fn, x, weights = _input_update_case(name)
    expected, expected_x, expected_grads = _updated_and_grads(fn, x, weights)
    executors = thunderplug.discover(quiet=True)
    actual, actual_x, actual_grads = _updated_and_grads(fn, x, weights, lambda f: thunder.jit(f, executors=executors))
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    torch.testing.assert_close(actual_x, expected_x, rtol=0, atol=0)
    for got, want in zip(actual_grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["mul_", "mul_twice", "read_between_updates"])
def test_stock_thunder_reads_the_overwritten_input(name):
    fn, x, weights = _input_update_case(name)
    _, expected_x, expected_grads = _updated_and_grads(fn, x, weights)
    _, actual_x, actual_grads = _updated_and_grads(fn, x, weights, thunder.jit)
    torch.testing.assert_close(actual_x, expected_x)
    assert not all(torch.allclose(got, want) for got, want in zip(actual_grads, expected_grads))


def _update_returned(x, w):
    x.mul_(w)
    return x


def _updates_returned(x, w, w2):
    x.mul_(w)
    x.add_(w2)
    return x, x.sin()


def _update_without_grad_returned(x, w):
    x.mul_(2.0)
    return x, x * w


@pytest.mark.parametrize("fn", [_update_returned, _updates_returned, _update_without_grad_returned])
@pytest.mark.parametrize("x_requires_grad", [False, True], ids=["plain_x", "non_leaf_x"])
def test_an_input_updated_in_place_and_returned_requires_grad_as_in_eager(fn, x_requires_grad):
    """``x.mul_(w); return x``: the output is the caller's ``x``, which requires grad after the update in eager
    (its history rebased onto the update). thunder's autograd Function gave the returned input a new view for its
    gradient edge and returned the caller's tensor without it (``requires_grad=False``; ``backward`` raised
    "element 0 of tensors does not require grad"); the Function now marks it dirty, as eager's in-place op does.
    An input updated without grad (``x.mul_(2.0)`` of a plain ``x``) still does not require grad."""
    generator = torch.Generator().manual_seed(0)
    x0 = torch.randn(3, 3, generator=generator)
    count = fn.__code__.co_argcount - 1
    weights = [(torch.randn(3, 3, generator=generator).abs() + 0.5).requires_grad_() for _ in range(count)]
    source = torch.randn(3, 3, generator=generator).requires_grad_()  # x's history when x requires grad

    def run(f):
        x = x0 * source if x_requires_grad else x0.clone()
        outputs = f(x, *weights)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        differentiable = [(o, i) for i, o in enumerate(outputs) if o.requires_grad]
        wrt = [*weights, source] if x_requires_grad else weights
        cotangents = [torch.randn(o.shape, generator=torch.Generator().manual_seed(i)) for o, i in differentiable]
        grads = torch.autograd.grad([o for o, _ in differentiable], wrt, cotangents, allow_unused=True)
        return outputs, x, [o.requires_grad for o in outputs], [o is x for o in outputs], x.requires_grad, grads

    expected = run(fn)
    actual = run(thunder.jit(fn, executors=thunderplug.discover(quiet=True)))
    for got, want in zip(actual[0], expected[0]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(actual[1], expected[1], rtol=0, atol=0)
    assert actual[2:5] == expected[2:5]
    assert any(expected[2])
    for got, want in zip(actual[5], expected[5]):
        assert (got is None) == (want is None)
        if want is not None:
            torch.testing.assert_close(got, want, rtol=0, atol=0)


# --- an input updated in place through a view of it ---------------------------------------------------------


def _transposed_add(x, w):
    x.t().add_(w)
    return x * 2


def _row_mul(x, w):
    x[0].mul_(w)
    return x.sum()


def _flat_view_add(x, w):
    v = x.view(-1)
    v.add_(w.view(-1))
    return v


def _view_of_a_view(x, w):
    x[0].t().mul_(w)
    return (x * x).sum(0)


def _columns_mul(x, w):
    x[:, 1:].mul_(w)
    return x.cos()


def _unsqueezed_mul(x, w):
    x.unsqueeze(0).mul_(w)
    return x.sin()


def _diagonal_mul(x, w):
    x.diagonal().mul_(w)
    return x.exp()


def _slice_returned(x, w):
    v = x[:, 1:]
    v.mul_(w)
    return v


def _input_returned(x, w):
    x.t().mul_(w)
    return x


def _input_and_view_returned(x, w):
    v = x[0]
    v.mul_(w[0])
    return x, v


def _two_views_updated(x, w):
    x[0].mul_(w)
    x[:, 1].add_(w)
    return x * w


def _augmented_row(x, w):
    x[2] += w
    return x.tanh()


def _setitem_through_a_view(x, w):
    x.t()[1] = w
    return x * 3


def _copy_into_a_row(x, w):
    x[0].copy_(w)
    return x * x


def _narrowed_mul(x, w):
    x.narrow(1, 0, 2).mul_(w[:2])
    return x.sigmoid()


def _whole_then_view(x, w):
    x.mul_(w)
    x.t().mul_(2.0)
    return x + 1


def _view_then_whole(x, w):
    x[0].mul_(w)
    x.mul_(w)
    return x


def _chained_on_a_row(x, w):
    x[0].mul_(w).add_(w)
    return x.sum()


def _view_of_a_computed_tensor(x, w):
    y = x * 1.5
    y.t().add_(w.t())
    return y * 2


def _reshaped_before_a_row_update(x, w):
    y = x.reshape(-1) * 1
    x[0].mul_(w)
    return y * 2 + x.sum()


def _expanded_view_read_after_an_update(x, w):
    e = x[:1].expand(3, 4)
    x[0].mul_(w)
    return e * 2


def _row_cleared_without_grad(x, w):
    x.t().mul_(w.t())
    with torch.no_grad():
        x[0].zero_()
    return x * 2


#: name -> (function, shape of x, shape of w)
VIEW_UPDATES = {
    "t_add_": (_transposed_add, (3, 4), (4, 3)),
    "row_mul_": (_row_mul, (3, 4), (4,)),
    "flat_view_add_": (_flat_view_add, (3, 4), (12,)),
    "view_of_a_view": (_view_of_a_view, (2, 3, 3), (3,)),
    "columns_slice": (_columns_mul, (3, 4), (3,)),
    "unsqueeze": (_unsqueezed_mul, (3, 4), (4,)),
    "diagonal": (_diagonal_mul, (3, 3), (3,)),
    "slice_returned": (_slice_returned, (3, 4), (3,)),
    "input_returned": (_input_returned, (3, 4), (4, 3)),
    "input_and_view_returned": (_input_and_view_returned, (3, 4), (4,)),
    "two_views": (_two_views_updated, (3, 3), (3,)),
    "augmented_row": (_augmented_row, (3, 3), (3,)),
    "setitem_through_a_view": (_setitem_through_a_view, (3, 3), (3,)),
    "copy_into_a_row": (_copy_into_a_row, (3, 3), (3,)),
    "narrow": (_narrowed_mul, (3, 4), (4,)),
    "whole_then_view": (_whole_then_view, (3, 3), (3,)),
    "view_then_whole": (_view_then_whole, (3, 3), (3,)),
    "chained_on_a_row": (_chained_on_a_row, (3, 3), (3,)),
    "view_of_a_computed_tensor": (_view_of_a_computed_tensor, (3, 4), (3, 4)),
    "row_cleared_without_grad": (_row_cleared_without_grad, (3, 3), (3, 3)),
    "reshaped_before_an_update": (_reshaped_before_a_row_update, (3, 4), (4,)),
    "expanded_view_read_after_an_update": (_expanded_view_read_after_an_update, (3, 4), (4,)),
}


def _view_update_run(fn, name: str, x_kind: str):
    """Outputs, the caller's x afterwards, which outputs require grad, and the gradients for w (and for the tensor
    x is computed from, when x is a non-leaf) of ``fn`` on random inputs of the case ``name``."""
    _, x_shape, w_shape = VIEW_UPDATES[name]
    generator = torch.Generator().manual_seed(0)
    x0, w = torch.randn(x_shape, generator=generator), torch.randn(w_shape, generator=generator).requires_grad_()
    source = x0.requires_grad_(x_kind != "plain_x")
    x = source * 1 if x_kind == "non_leaf_x" else source
    outputs = fn(x, w)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    differentiable = [o for o in outputs if o.requires_grad]
    cotangents = [torch.randn(o.shape, generator=generator) for o in differentiable]
    wrt = [w, source] if x_kind == "non_leaf_x" else [w]
    grads = torch.autograd.grad(differentiable, wrt, cotangents, allow_unused=True)
    return [o.detach() for o in outputs], x.detach(), [o.requires_grad for o in outputs], grads


@pytest.mark.parametrize("x_kind", ["plain_x", "non_leaf_x"])
@pytest.mark.parametrize("name", VIEW_UPDATES)
def test_an_input_updated_through_a_view_as_in_eager(name, x_kind):
    """``x.t().add_(w)``: thunder wrote the sum into the view (right values) and renamed ``x`` afterwards, with
    nothing saying the new ``x`` is computed from the sum: ``w`` got no gradient (thunder's backward failed on
    ``assert not args``, stock and discover() alike) and ``x``'s went through the update unchanged. The update is
    computed functionally (an ``index_copy`` into the tensor's value, at the positions the view reads) and written
    back into the input once: outputs, the caller's ``x``, ``requires_grad`` and gradients bit for bit as eager."""
    fn = VIEW_UPDATES[name][0]
    expected = _view_update_run(fn, name, x_kind)
    actual = _view_update_run(thunder.jit(fn, executors=thunderplug.discover(quiet=True)), name, x_kind)
    for got, want in zip(actual[0], expected[0]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(actual[1], expected[1], rtol=0, atol=0)
    assert actual[2] == expected[2]
    for got, want in zip(actual[3], expected[3]):
        assert (got is None) == (want is None)
        if want is not None:
            torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["t_add_", "row_mul_", "view_of_a_view", "input_returned"])
def test_a_leaf_requiring_grad_updated_through_a_view_raises_as_in_eager(name):
    """Eager: "a view of a leaf Variable that requires grad is being used in an in-place operation"; discover():
    the write-back into the leaf raises thunder's "a leaf Variable ..." (stock thunder does not always raise)."""
    fn = VIEW_UPDATES[name][0]
    message = "leaf Variable that requires grad is being used in an in-place operation"
    with pytest.raises(RuntimeError, match=message):
        _view_update_run(fn, name, "leaf_x")
    with pytest.raises(RuntimeError, match=message):
        _view_update_run(thunder.jit(fn, executors=thunderplug.discover(quiet=True)), name, "leaf_x")


@pytest.mark.parametrize("name", ["t_add_", "row_mul_"])
def test_stock_thunder_loses_an_update_through_a_view(name):
    """What ``views_updated_functionally`` changes: stock thunder's backward fails."""
    with pytest.raises(AssertionError):
        _view_update_run(thunder.jit(VIEW_UPDATES[name][0]), name, "plain_x")


def _reshaped_mul(x, w):
    x.reshape(-1).mul_(w)
    return x * 2


def _flattened_mul(x, w):
    x.flatten().mul_(w)
    return x


def _expanded_mul(x, w):
    x[:1].expand(3, 4).mul_(w)
    return x * 2


def _split_mul(x, w):
    _, middle, _ = x.split(1)
    middle.mul_(w)
    return x.sum(1)


def _unbound_mul(x, w):
    x.unbind(0)[1].mul_(w)
    return x


#: name -> (function, shape of w, error eager raises or None, error discover() raises, the op it names)
REFUSED_VIEW_UPDATES = {
    "reshape": (_reshaped_mul, (12,), None, NotImplementedError, "reshape"),
    "flatten": (_flattened_mul, (12,), None, NotImplementedError, "flatten"),
    "expand": (_expanded_mul, (4,), RuntimeError, RuntimeError, "expand"),
    "split": (_split_mul, (4,), RuntimeError, RuntimeError, "split"),
    "unbind": (_unbound_mul, (4,), RuntimeError, RuntimeError, "unbind"),
}


@pytest.mark.parametrize("name", REFUSED_VIEW_UPDATES)
def test_an_update_through_a_view_that_cannot_be_exact_is_refused_by_name(name):
    """reshape and flatten return a view or a copy depending on the strides at run time; eager refuses updates
    through expanded views and views returned with others (split, unbind) when gradients are involved: each is
    refused at compile time, naming the op and the user's line."""
    fn, w_shape, eager_error, error, op = REFUSED_VIEW_UPDATES[name]
    x, w = torch.randn(3, 4), torch.randn(w_shape, requires_grad=True)
    if eager_error is not None:
        with pytest.raises(eager_error):
            fn(x.clone(), w).sum().backward()
    line = fn.__code__.co_firstlineno + 1 + (name == "split")
    with pytest.raises(error, match=rf"mul_ updates in place the result of {op} \(at .*test_inplace_grads.py:{line}\)"):
        thunder.jit(fn, executors=thunderplug.discover(quiet=True))(x.clone(), w)


def _reshaped_then_read_after_an_update(x, w):
    y = x.reshape(-1)
    x[0].mul_(w)
    return y * 2


def test_a_strided_view_read_after_an_update_is_refused_by_name():
    """``x.reshape(-1)`` is ``x`` itself or a copy depending on ``x``'s strides: whether it sees a later update of
    ``x`` cannot be told at compile time."""
    fn = _reshaped_then_read_after_an_update
    where = rf"\(at .*test_inplace_grads.py:{fn.__code__.co_firstlineno + 1}\)"
    jitted = thunder.jit(fn, executors=thunderplug.discover(quiet=True))
    with pytest.raises(NotImplementedError, match=rf"the result of reshape {where} is read"):
        jitted(torch.randn(3, 4), torch.randn(4, requires_grad=True))


def _reshaped_add_of_a_constant(x, w):
    x.reshape(-1).add_(1.0)
    return x * w


def _advanced_index_mul(x, w):
    x[torch.tensor([0, 2])].mul_(w)  # a copy: x is unchanged
    return x * w


@pytest.mark.parametrize("fn", [_reshaped_add_of_a_constant, _advanced_index_mul])
def test_an_update_through_a_view_no_gradient_depends_on_runs_as_before(fn):
    """Nothing requiring grad reaches the update (or the indexed result is a copy): nothing is refused or
    rewritten, and the result is eager's."""
    generator = torch.Generator().manual_seed(0)
    x0, w0 = torch.randn(3, 4, generator=generator), torch.randn(4, generator=generator)

    def run(f):
        x, w = x0.clone(), w0.clone().requires_grad_()
        out = f(x, w)
        return out.detach(), x, torch.autograd.grad(out.sum(), w)[0]

    for got, want in zip(run(thunder.jit(fn, executors=thunderplug.discover(quiet=True))), run(fn)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def _detached_result_doubled(x, w):
    y = x * w
    y.detach().mul_(2)
    return y * 3


def _detached_input_row_updated(x, w):
    x.detach()[0].add_(1.0)
    return x * w


@pytest.mark.parametrize("fn", [_detached_result_doubled, _detached_input_row_updated])
def test_an_update_through_a_detached_view_is_hidden_from_autograd_as_in_eager(fn):
    """Eager's autograd does not see an update through ``detach()`` (torch.distributed.tensor's
    ``distribute_tensor`` makes one): the values change, the gradients are those of the values before it."""
    x, w = torch.randn(3, 4), torch.randn(4, requires_grad=True)
    x_ref, w_ref = x.clone(), w.detach().clone().requires_grad_(True)
    out = thunder.jit(fn, executors=thunderplug.discover(quiet=True))(x, w)
    expected = fn(x_ref, w_ref)
    assert torch.equal(out, expected) and torch.equal(x, x_ref)
    cotangent = torch.randn_like(expected)
    assert torch.equal(torch.autograd.grad(out, w, cotangent)[0], torch.autograd.grad(expected, w_ref, cotangent)[0])
