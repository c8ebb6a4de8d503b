"""``F.cross_entropy`` and ``F.nll_loss`` against eager, forward and backward: 1-D to 5-D inputs,
every reduction, class weights, an ``ignore_index`` that is hit, label smoothing and probability
targets. Stock thunder 0.2.6 gets 3-D and 5-D gradients wrong (an ``(n, c, 1, -1)`` gradient or a
shape error) and label smoothing with a hit ``ignore_index`` silently wrong; under discover() the
NLL-loss kernels (``eager_kernels``) and the label-smoothing fix (docs/patches.md) make them eager's.
"""

import itertools

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunderplug

CLASSES = 5
#: input shapes (the class dim is 0 for 1-D, else 1)
SHAPES = {
    "1d": (CLASSES,),
    "2d": (3, CLASSES),
    "3d": (3, CLASSES, 4),
    "4d": (2, CLASSES, 3, 4),
    "5d": (2, CLASSES, 3, 2, 2),
}
REDUCTIONS = ["mean", "sum", "none"]
VARIANTS = {
    "plain": {},
    "weight": {"weight": True},
    "ignore_index": {"ignore_index": 1},
    "label_smoothing": {"label_smoothing": 0.1},
    "smoothing_weight_ignore": {"weight": True, "ignore_index": 2, "label_smoothing": 0.2},
    "probabilities": {"probabilities": True},
    "probabilities_smoothing": {"probabilities": True, "label_smoothing": 0.3},
}


def _inputs(shape, variant, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, dtype=torch.float64, generator=g)
    class_dim = 0 if len(shape) == 1 else 1
    if variant.get("probabilities"):
        target = torch.randn(shape, dtype=torch.float64, generator=g).softmax(class_dim)
    else:
        target_shape = shape[:class_dim] + shape[class_dim + 1 :]
        target = torch.randint(0, CLASSES, target_shape, generator=g)
        if "ignore_index" in variant:  # hit it at least once
            target.view(-1)[0] = variant["ignore_index"]
    weight = torch.rand(CLASSES, dtype=torch.float64, generator=g) + 0.5 if variant.get("weight") else None
    return x, target, weight


def _loss(reduction, variant):
    kwargs = {k: v for k, v in variant.items() if k in ("ignore_index", "label_smoothing")}

    def loss(x, target, weight):
        return F.cross_entropy(x, target, weight=weight, reduction=reduction, **kwargs)

    return loss


def _assert_like_eager(fn, x, target, weight, executors):
    x_ref = x.clone().requires_grad_(True)
    expected = fn(x_ref, target, weight)
    cotangent = torch.randn(expected.shape, dtype=expected.dtype, generator=torch.Generator().manual_seed(1))
    (expected_grad,) = torch.autograd.grad(expected, x_ref, cotangent)
    x = x.clone().requires_grad_(True)
    jitted = thunder.jit(fn, executors=executors) if executors else thunder.jit(fn)
    actual = jitted(x, target, weight)
    # a 1-D input whose only target is ignored: a mean over nothing is NaN in eager too
    torch.testing.assert_close(actual, expected, equal_nan=True)
    (grad,) = torch.autograd.grad(actual, x, cotangent)
    assert grad.shape == expected_grad.shape
    torch.testing.assert_close(grad, expected_grad, equal_nan=True)


@pytest.mark.parametrize(
    "shape, reduction, variant", list(itertools.product(SHAPES, REDUCTIONS, VARIANTS))
)
def test_cross_entropy_as_in_eager(shape, reduction, variant):
    x, target, weight = _inputs(SHAPES[shape], VARIANTS[variant])
    _assert_like_eager(_loss(reduction, VARIANTS[variant]), x, target, weight, thunderplug.discover(quiet=True))


def _stock_is_right(shape, variant):
    return shape in ("1d", "2d", "4d") and variant in ("plain", "weight", "ignore_index", "probabilities")


@pytest.mark.parametrize(
    "shape, variant", [(s, v) for s in SHAPES for v in VARIANTS if _stock_is_right(s, v)]
)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_under_stock_thunder_where_it_is_right(shape, variant, reduction):
    x, target, weight = _inputs(SHAPES[shape], VARIANTS[variant])
    _assert_like_eager(_loss(reduction, VARIANTS[variant]), x, target, weight, None)


def test_stock_thunder_gets_3d_and_label_smoothing_wrong():
    """What the overrides change (tested so they are not silently no-ops)."""
    x, target, _ = _inputs(SHAPES["3d"], {})
    with pytest.raises(RuntimeError, match=r"invalid gradient at index 0 - got \[3, 5, 1, 4\]"):
        _assert_like_eager(_loss("mean", {}), x, target, None, None)
    variant = VARIANTS["smoothing_weight_ignore"]
    x, target, weight = _inputs(SHAPES["2d"], variant)
    with pytest.raises(AssertionError):
        _assert_like_eager(_loss("mean", variant), x, target, weight, None)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("variant", ["plain", "weight", "ignore_index"])
def test_nll_loss_as_in_eager(shape, reduction, variant):
    kwargs = {k: v for k, v in VARIANTS[variant].items() if k == "ignore_index"}

    def loss(x, target, weight):
        logp = F.log_softmax(x, 0 if x.ndim == 1 else 1)
        return F.nll_loss(logp, target, weight=weight, reduction=reduction, **kwargs)

    x, target, weight = _inputs(SHAPES[shape], VARIANTS[variant])
    _assert_like_eager(loss, x, target, weight, thunderplug.discover(quiet=True))
