"""Issue 42, loud idioms part E: the two-tensor ``torch.max(a, b)`` (torchvision's box losses) trained under
discover() against eager, bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from train_like_eager import train_like_eager


class _PairwiseMax(nn.Module):
    """``torch.max(a, b)`` and ``Tensor.max(b)`` of two layers' outputs, as generalized_box_iou_loss's enclosing
    box (``torch.max(x2, x2g)``); ties (from the clamp) split the gradient between both."""

    def __init__(self, method: bool):
        super().__init__()
        self.method = method
        self.a, self.b = nn.Linear(5, 4), nn.Linear(5, 4)

    def forward(self, x):
        a, b = self.a(x).clamp(max=0.1), self.b(x).clamp(max=0.1)
        out = a.max(b) if self.method else torch.max(a, b)
        return (out * torch.arange(4.0)).sum() + torch.max(a, b.detach()).mean()


@pytest.mark.parametrize("method", [False, True], ids=["torch.max", "Tensor.max"])
def test_two_tensor_max_trains_as_eager(method):
    """Failed on main: aten::max() Expected a value of type 'int' for argument 'dim' (the reduction's rule ran)."""
    torch.manual_seed(0)
    train_like_eager(_PairwiseMax(method), [(torch.randn(6, 5),) for _ in range(3)])


class _ToList(nn.Module):
    """``t.tolist()`` inside forward: as split sizes (integers: Dynamo captures them as sizes known at run time),
    as Python floats scaling the output, and as a branch."""

    def __init__(self, use: str):
        super().__init__()
        self.use = use
        self.lin = nn.Linear(4, 4)

    def forward(self, x, counts):
        h = self.lin(x)
        if self.use == "split":
            return torch.stack([p.mean(0) for p in torch.split(h, counts.tolist())]).tanh()
        if self.use == "floats":
            scale, shift = h.detach().mean(0)[:2].tolist()
            return (h * scale + shift).sum(-1)
        return h.relu() if counts.tolist()[0] > 1 else h.abs()


_COUNTS = [torch.tensor([1, 3, 2]), torch.tensor([2, 2, 2]), torch.tensor([4, 1, 1])]


@pytest.mark.parametrize("use", ["split", "floats", "branch"])
def test_tolist_in_forward_trains_as_eager(use):
    """Failed on main: 'Exception encountered when doing automatic registration for tolist'. Now a graph break
    naming the line; the counts change every step (a baked-in first call would split or branch wrongly)."""
    from thunderplug.plugin_api.notices import ThunderplugWarning

    torch.manual_seed(0)
    with pytest.warns(ThunderplugWarning, match="Tensor.tolist"):
        train_like_eager(_ToList(use), [(torch.randn(6, 4), counts) for counts in _COUNTS])


def test_tolist_split_compiles_the_graphs_around():
    """The layer before the integer ``tolist()`` and the ops after the sizes' region are thunder compilations;
    only the region whose sizes depend on values runs as in eager."""
    import warnings

    import thunder

    import thunderplug
    from thunderplug.tracing.compilation import record_for

    model = _ToList("split")
    jitted = thunder.jit(model, executors=thunderplug.discover())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for counts in _COUNTS:
            x = torch.randn(6, 4)
            torch.testing.assert_close(jitted(x, counts), model(x, counts), rtol=0, atol=0)
    parts = record_for(thunder.compile_data(jitted)).graph_parts
    traces = [str(thunder.last_traces(part)[-1]) for part in parts]
    assert any("linear" in trace for trace in traces) and any("stack" in trace for trace in traces), traces


class _InplaceDropout(nn.Module):
    """``nn.Dropout(inplace=True)`` of a layer's output, and ``F.dropout(..., inplace=True)`` of a fresh tensor."""

    def __init__(self, functional: bool):
        super().__init__()
        self.functional = functional
        self.lin, self.out = nn.Linear(6, 8), nn.Linear(8, 3)
        self.drop = nn.Dropout(0.3, inplace=True)

    def forward(self, x):
        h = self.lin(x)  # not ReLU's output: eager's backward would raise (ReLU saves it, dropout_ changes it)
        h = nn.functional.dropout(h * 2, 0.4, self.training, inplace=True) if self.functional else self.drop(h)
        return self.out(torch.relu(h))


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("functional", [False, True], ids=["nn.Dropout", "F.dropout"])
def test_inplace_dropout_trains_as_eager(functional, training):
    """Failed on main in training: 'Only inplace=False is currently supported in dropout'. The masks are eager's
    (the generator state after each step is compared)."""
    torch.manual_seed(0)
    model = _InplaceDropout(functional).train(training)
    train_like_eager(model, [(torch.randn(5, 6),) for _ in range(3)], check_rng=True)


def test_inplace_dropout_of_a_leaf_raises_as_eager():
    import thunder

    import thunderplug

    def fn(w):
        return nn.functional.dropout(w, 0.5, True, inplace=True)

    w = torch.randn(4, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        fn(w)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        thunder.jit(fn, executors=thunderplug.discover())(w)


class _Normal(nn.Module):
    """``torch.normal`` with a tensor mean and/or std computed from layers: eager draws from the global generator
    and gives mean and std zero gradients (the result requires grad; AdamW decays the layers)."""

    def __init__(self, form: str):
        super().__init__()
        self.form = form
        self.mean, self.std = nn.Linear(4, 3), nn.Linear(4, 3)

    def forward(self, x):
        mean, std = self.mean(x), nn.functional.softplus(self.std(x)) + 0.1
        if self.form == "tensors":
            noise = torch.normal(mean, std)
        elif self.form == "float std":
            noise = torch.normal(mean, 0.5)
        elif self.form == "float mean":
            noise = torch.normal(1.0, std)
        else:  # a broadcast std, not requiring grad
            noise = torch.normal(mean, torch.full((3,), 0.2))
        return noise + mean * std


@pytest.mark.parametrize("form", ["tensors", "float std", "float mean", "broadcast std"])
def test_torch_normal_of_tensors_trains_as_eager(form):
    """Failed on main: 'Trying to call function torch.normal, but it is not yet supported'."""
    torch.manual_seed(0)
    train_like_eager(_Normal(form), [(torch.randn(5, 4),) for _ in range(3)], check_rng=True)


def test_torch_normal_of_numbers_is_refused_by_line():
    import thunder

    import thunderplug

    jitted = thunder.jit(lambda x: x + torch.normal(0.0, 1.0, (3,)), executors=thunderplug.discover())
    with pytest.raises(NotImplementedError, match=r"torch.normal with numbers .*test_loud_idioms_e.py"):
        jitted(torch.zeros(3))


class _EmptyStrided(nn.Module):
    """``torch.empty_strided`` filled by ``copy_`` (a transposed layout), then used and returned."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        buf = torch.empty_strided((x.shape[0], 4), (1, x.shape[0]))
        buf.copy_(self.lin(x).tanh())
        return buf * 2, buf


def test_empty_strided_trains_as_eager():
    """Failed on main: 'Trying to call function torch.empty_strided, but it is not yet supported'."""
    torch.manual_seed(0)
    train_like_eager(_EmptyStrided(), [(torch.randn(3, 4),) for _ in range(3)])


def test_empty_strided_has_eager_strides_and_refuses_requires_grad():
    import thunder

    import thunderplug

    jitted = thunder.jit(lambda x: torch.empty_strided((2, 3), (1, 2)).copy_(x), executors=thunderplug.discover())
    x = torch.randn(2, 3)
    out = jitted(x)
    assert out.stride() == (1, 2) and torch.equal(out, x)
    refusing = thunder.jit(lambda x: x + torch.empty_strided((3,), (1,), requires_grad=True),
                           executors=thunderplug.discover())
    with pytest.raises(NotImplementedError, match="torch.empty_strided: only strided tensors"):
        refusing(x)
