"""functorch transforms inside jitted functions: refused with the user's line before any functorch level
is entered, and a failed compilation leaves no level behind (thunderplug.functorch_transforms)."""

import pytest
import thunder
import torch

import thunderplug
from thunderplug.functorch_transforms import _depth, _leave_innermost_level


def _vmapped_mask(q, kv):
    return torch.vmap(lambda i: kv <= i)(q)


def _eager_still_works():
    assert torch._C._functorch.maybe_current_level() is None
    torch.nn.init.normal_(torch.empty(3))  # random ops fail while a vmap level is left entered


def test_vmap_is_refused_naming_the_line_and_the_process_stays_usable():
    q, kv = torch.arange(4), torch.arange(4)
    with pytest.raises(NotImplementedError, match=r"(?s)`torch.vmap`.*test_functorch_transforms.py:\d+.*outside"):
        thunder.jit(_vmapped_mask, executors=thunderplug.discover())(q, kv)
    _eager_still_works()
    torch.testing.assert_close(_vmapped_mask(q, kv), kv[None, :] <= q[:, None])


def test_grad_transform_is_refused():
    def f(x):
        return torch.func.grad(lambda y: (y * y).sum())(x)

    with pytest.raises(NotImplementedError, match="torch.func.grad"):
        thunder.jit(f, executors=thunderplug.discover())(torch.randn(3))
    _eager_still_works()


def test_a_level_entered_before_a_failure_is_left():
    def enters_then_fails(x):
        torch._C._functorch._vmap_increment_nesting(2, "error")
        raise ValueError("failed inside a transform")

    with pytest.raises(ValueError, match="failed inside a transform"):
        thunder.jit(enters_then_fails, executors=thunderplug.discover())(torch.randn(2))
    _eager_still_works()


def test_stock_thunder_leaves_the_vmap_level_entered():
    """What the patches change (the level is left here by the test itself)."""
    depth = _depth()
    try:
        with pytest.raises(TypeError, match="_add_batch_dim"):
            thunder.jit(_vmapped_mask)(torch.arange(4), torch.arange(4))
        assert _depth() > depth
    finally:
        while _depth() > depth:
            _leave_innermost_level()
    _eager_still_works()
