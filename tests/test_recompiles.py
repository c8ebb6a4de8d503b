"""A flatten context that changes every call: a recompile limit and one warning naming the subclass and field."""

import pytest
import thunder
import torch
from subclasses import ScaledTensor

import thunderplug
from thunderplug.caching import recompiles


def test_changing_ctx_hits_the_limit_with_one_warning_naming_subclass_and_field(monkeypatch, recwarn):
    monkeypatch.setenv(recompiles.LIMIT_VARIABLE, "3")

    def scaled_sin(x):
        return (x + 1).sin()

    jitted = thunder.jit(scaled_sin, executors=thunderplug.discover(quiet=True))
    data = torch.randn(4)
    for scale in (0.5, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0):
        x = ScaledTensor(data, scale)
        torch.testing.assert_close(jitted(x), (data * scale + 1).sin())  # every compilation is correct
    assert thunder.cache_misses(jitted) == 6
    warned = [w for w in recwarn if issubclass(w.category, thunderplug.RecompileWarning)]
    assert len(warned) == 1
    message = str(warned[0].message)
    assert "'scaled_sin'" in message and "ScaledTensor input 'x'" in message
    assert "ctx['scale'] changed" in message and "2.0" in message and "the limit is 3" in message
    assert recompiles.contexts_seen(thunder.compile_data(jitted), "x") == [
        {"scale": s} for s in (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)
    ]


def test_a_fixed_ctx_never_warns(recwarn):
    jitted = thunder.jit(lambda x: x.sin(), executors=thunderplug.discover(quiet=True))
    for _ in range(12):
        jitted(ScaledTensor(torch.randn(4), 2.0))
    assert thunder.cache_misses(jitted) == 1
    assert not [w for w in recwarn if issubclass(w.category, thunderplug.RecompileWarning)]


def test_strict_mode_raises_at_the_limit(monkeypatch):
    monkeypatch.setenv("THUNDERPLUG_STRICT", "1")
    monkeypatch.setenv(recompiles.LIMIT_VARIABLE, "2")
    key = object.__new__(type("FakeCompileData", (), {"fn": None}))
    for scale in (1.0, 2.0):
        recompiles.note_subclass_input("x", ScaledTensor, {"scale": scale}, compile_data=key)
    with pytest.raises(recompiles.RecompileLimitError, match=r"ScaledTensor input 'x'.*ctx\['scale'\] changed"):
        recompiles.note_subclass_input("x", ScaledTensor, {"scale": 3.0}, compile_data=key)


@pytest.mark.parametrize(
    ("before", "after", "fields"),
    [
        ({"scale": 1.0, "dtype": torch.float8_e4m3fn}, {"scale": 2.0, "dtype": torch.float8_e4m3fn}, ["ctx['scale']"]),
        ((1, "a"), (1, "b"), ["ctx[1]"]),
        (0.5, 0.25, ["ctx"]),
        ({"a": (1, 2)}, {"a": (1, 3)}, ["ctx['a'][1]"]),
        ({"x": 1}, {"x": 1}, []),
    ],
)
def test_changed_fields(before, after, fields):
    assert recompiles.changed_fields(before, after) == fields


def test_a_limit_that_is_no_integer_is_a_warning(monkeypatch):
    monkeypatch.setenv(recompiles.LIMIT_VARIABLE, "lots")
    with pytest.warns(
        thunderplug.ThunderplugWarning, match="THUNDERPLUG_RECOMPILE_LIMIT='lots' is not a non-negative integer"
    ):
        assert recompiles.limit() == recompiles.DEFAULT_LIMIT
