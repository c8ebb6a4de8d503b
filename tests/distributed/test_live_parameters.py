"""A parameter swapped under a jitted module is what the compiled module uses (single process).

FSDP2 swaps parameters under modules; so do users (``module.weight = nn.Parameter(...)``). thunder's
ThunderModule captures the parameters when it is created; under ``discover()`` it reads them
through to the module (``thunderplug.subclass.distributed.LiveParameters``), and the prologue's guards
re-trace when the new parameter has other metadata or another type. Never the stale copy.
"""

from __future__ import annotations

import thunder
import torch
from torch.testing._internal.two_tensor import TwoTensor

import thunderplug
from thunderplug.subclass.distributed import LiveParameters


def _step(module, x):
    module.zero_grad(set_to_none=True)
    out = module(x)
    out.sum().backward()
    return out


def _compiled_and_eager(make):
    torch.manual_seed(0)
    eager = make()
    compiled_model = make()
    compiled_model.load_state_dict(eager.state_dict())
    return eager, compiled_model, thunder.jit(compiled_model, executors=thunderplug.discover())


def _swap(module, weight, bias):
    module.weight = torch.nn.Parameter(weight)
    module.bias = torch.nn.Parameter(bias)


def _assert_same(eager, compiled_model, compiled, x):
    expected = _step(eager, x)
    actual = _step(compiled, x)
    assert type(actual) is type(expected)
    torch.testing.assert_close(actual, expected, atol=0, rtol=0)
    for (name, p), q in zip(eager.named_parameters(), compiled_model.parameters()):
        assert q.grad is not None, f"{name}: the swapped-in parameter got no gradient"
        torch.testing.assert_close(q.grad, p.grad, atol=0, rtol=0, msg=lambda m, name=name: f"grad of {name}: {m}")


def test_same_shape_swap_is_trained():
    eager, compiled_model, compiled = _compiled_and_eager(lambda: torch.nn.Linear(8, 4))
    x = torch.randn(3, 8)
    _assert_same(eager, compiled_model, compiled, x)
    weight, bias = torch.randn(4, 8), torch.randn(4)
    old = compiled_model.weight
    _swap(eager, weight.clone(), bias.clone())
    _swap(compiled_model, weight.clone(), bias.clone())
    old.grad = None
    _assert_same(eager, compiled_model, compiled, x)
    assert old.grad is None, "the parameter swapped out was trained"
    assert set(map(id, compiled.parameters())) == set(map(id, compiled_model.parameters()))


def test_swap_to_other_shape_retraces():
    eager, compiled_model, compiled = _compiled_and_eager(lambda: torch.nn.Linear(8, 4))
    x = torch.randn(3, 8)
    _assert_same(eager, compiled_model, compiled, x)
    weight, bias = torch.randn(6, 8), torch.randn(6)
    _swap(eager, weight.clone(), bias.clone())
    _swap(compiled_model, weight.clone(), bias.clone())
    _assert_same(eager, compiled_model, compiled, x)
    assert thunder.cache_misses(compiled) == 2


def test_swap_to_a_subclass_parameter_retraces():
    eager, compiled_model, compiled = _compiled_and_eager(lambda: torch.nn.Linear(8, 4))
    x = torch.randn(3, 8)
    _assert_same(eager, compiled_model, compiled, x)
    weight = torch.randn(4, 8)
    eager.weight = torch.nn.Parameter(TwoTensor(weight.clone(), weight.clone() * 2))
    compiled_model.weight = torch.nn.Parameter(TwoTensor(weight.clone(), weight.clone() * 2))
    _assert_same(eager, compiled_model, compiled, x)
    assert thunder.cache_misses(compiled) == 2


def test_a_transforms_override_is_kept():
    module = torch.nn.Linear(8, 4)
    live = LiveParameters(module, dict(module.named_parameters()), lambda: True)
    replacement = torch.nn.Parameter(torch.zeros(2, 8))
    live["weight"] = replacement
    module.bias = torch.nn.Parameter(torch.ones(4))
    assert live["weight"] is replacement and live.get("weight") is replacement
    assert live["bias"] is module.bias and dict(live.items())["bias"] is module.bias


def test_not_live_is_the_captured_dict():
    module = torch.nn.Linear(8, 4)
    captured = dict(module.named_parameters())
    live = LiveParameters(module, captured, lambda: False)
    module.bias = torch.nn.Parameter(torch.ones(4))
    assert live["bias"] is captured["bias"] and list(live.values()) == list(captured.values())


def test_every_change_through_a_dict_method_is_tracked():
    """Each of dict's ways to change or copy it reads through and marks the dict replaced, as assignment does."""
    module = torch.nn.Linear(8, 4)
    for change in (lambda d: d.popitem(), lambda d: d.__ior__({"extra": torch.nn.Parameter(torch.zeros(1))}),
                   lambda d: d.pop("bias"), lambda d: d.update(bias=module.weight), lambda d: d.clear()):
        live = LiveParameters(module, dict(module.named_parameters()), lambda: True)
        assert not live.replaced
        change(live)
        assert live.replaced
    live = LiveParameters(module, dict(module.named_parameters()), lambda: True)
    module.bias = torch.nn.Parameter(torch.ones(4))
    assert live.popitem() == ("bias", module.bias) and "bias" not in live
    live = LiveParameters(module, dict(module.named_parameters()), lambda: True)
    merged = live | {"extra": 1}
    assert type(merged) is dict and merged["weight"] is module.weight and not live.replaced
    live |= {"weight": module.bias}
    assert live["weight"] is module.bias
