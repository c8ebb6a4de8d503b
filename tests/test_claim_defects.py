"""A plugin's claim that is wrong in an ordinary way never reaches the user's call as a raw
exception or a wrong number: a raising checker declines (plugin reported failed), a forward with
other outputs than the op is refused naming claim, plugin and op, a misspelled target is refused."""

from __future__ import annotations

import pytest
import thunder
import torch
from torch.testing._internal.two_tensor import TwoTensor

import thunderplug
from thunderplug import Status, SubclassOpClaim, hookimpl
from thunderplug.host.claims import ClaimError


def _mul_claim(checker, forward):
    class Plugin:
        @hookimpl
        def register_claims(self, register):
            register(
                SubclassOpClaim(
                    executor="bad_claim",
                    target="TwoTensor.torch.mul",
                    checker=checker,
                    forward=forward,
                    backward=lambda a, b, grad: (grad * b, None),
                )
            )

    return Plugin()


def _status(name):
    return next(s for s in thunderplug.report() if s.name == name)


def test_a_checker_that_raises_declines_and_marks_its_plugin(register_plugin):
    def checker(a, b):
        raise KeyError("bug in the plugin")

    register_plugin(_mul_claim(checker, lambda a, b: torch.mul(a, b)), "bad_claim")
    x = TwoTensor(torch.randn(3), torch.randn(3))
    jitted = thunder.jit(lambda x: x * 2, executors=thunderplug.discover(quiet=True))
    out = jitted(x)  # the user's call is unaffected: the generic path takes the op
    torch.testing.assert_close(out.a, x.a * 2)
    torch.testing.assert_close(out.b, x.b * 2)
    status = _status("bad_claim")
    assert status.status is Status.FAILED and "bug in the plugin" in status.reason
    assert "bad_claim" not in [e.name for e in thunderplug.discover(quiet=True)]


def test_a_claim_forward_with_the_wrong_shape_is_refused_naming_claim_plugin_and_op(register_plugin):
    register_plugin(_mul_claim(lambda a, b: None, lambda a, b: torch.mul(a, b).sum()), "bad_claim")
    x = TwoTensor(torch.randn(3), torch.randn(3))
    jitted = thunder.jit(lambda x: x * 2, executors=thunderplug.discover(quiet=True))
    with pytest.raises(ClaimError, match=r"'bad_claim'.*plugin 'bad_claim'.*TwoTensor.torch.mul.*\(3,\)"):
        jitted(x)


def test_a_claim_forward_with_the_wrong_shape_is_refused_with_gradients_too(register_plugin):
    register_plugin(_mul_claim(lambda a, b: None, lambda a, b: torch.mul(a, b).sum()), "bad_claim")
    x = TwoTensor(torch.randn(3), torch.randn(3)).requires_grad_()
    jitted = thunder.jit(lambda x: x * 2, executors=thunderplug.discover(quiet=True))
    with pytest.raises(ClaimError, match=r"TwoTensor.torch.mul"):
        jitted(x)


def test_a_misspelled_claim_target_is_refused():
    with pytest.raises(ValueError, match=r"names no torch function: torch.mull does not exist"):
        SubclassOpClaim("bad_claim", "TwoTensor.torch.mull", lambda *a: None, torch.mul, lambda *a: a)
    with pytest.raises(ValueError, match=r"must be '<SubclassName>.torch.<function>'"):
        SubclassOpClaim("bad_claim", "torch.mul", lambda *a: None, torch.mul, lambda *a: a)


def test_a_plugin_registering_a_misspelled_target_is_reported_not_silent(register_plugin):
    class Typo:
        @hookimpl
        def register_claims(self, register):
            register(SubclassOpClaim("typo_claim", "TwoTensor.torch.mull", lambda *a: None, torch.mul, lambda *a: a))

    status = register_plugin(Typo(), "typo_claim")
    assert status.status is Status.FAILED and "torch.mull does not exist" in status.reason
