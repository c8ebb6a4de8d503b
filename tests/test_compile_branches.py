"""Which branch of ``torch.compiler.is_compiling()`` discover() compilations take (thunderplug.eager.compile_branches):
eager's (False), except inside functions whose eager branch reads a tensor's value, which get the
branch written for tracers (True). Both kinds of library code are checked against eager, alone and in
one program."""

import pytest
import thunder
import torch

import thunderplug
from thunderplug.eager import compile_branches


def _forget(*functions):
    with compile_branches._lock:
        for function in functions:
            compile_branches._compiling_branch.discard(function.__code__)


# -- a library that asks "can values be read?" and one that asks "is Inductor generating this?" ----------


def _shortcut_unless_tracing(x):
    """transformers' pattern: a data-dependent shortcut that gives the same values as the general path."""
    if not torch.compiler.is_compiling() and bool((x == 0).all()):
        return None
    return x


def _clamp_unless_compiling(x):
    """torchao's pattern: a clamp only Inductor's saturating cast makes redundant."""
    return x.clamp(-1, 1) if not torch.compiler.is_compiling() else x


def _program(x, y):
    shortcut = _shortcut_unless_tracing(y)
    out = _clamp_unless_compiling(x * 3)
    return out if shortcut is None else out + shortcut


@pytest.mark.parametrize("zeros", [True, False])
def test_both_kinds_of_branch_in_one_program_equal_eager(zeros):
    _forget(_shortcut_unless_tracing, _clamp_unless_compiling)
    x = torch.randn(8, requires_grad=True)
    y = torch.zeros(8) if zeros else torch.randn(8)
    expected = _program(x, y)
    (expected_grad,) = torch.autograd.grad(expected.sum(), x)
    actual = thunder.jit(_program, executors=thunderplug.discover())(x, y)
    (actual_grad,) = torch.autograd.grad(actual.sum(), x)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    torch.testing.assert_close(actual_grad, expected_grad, rtol=0, atol=0)
    # the shortcut read a value on the eager branch, so its function now takes the tracers' branch; the clamp
    # (no value read) kept eager's
    assert compile_branches.uses_compiling_branch(_shortcut_unless_tracing.__code__)
    assert not compile_branches.uses_compiling_branch(_clamp_unless_compiling.__code__)


def test_stock_thunder_answers_true_everywhere():
    """What the rule changes: stock thunder takes the tracers' branch, which skips the clamp."""
    x = torch.randn(8) * 4
    torch.testing.assert_close(thunder.jit(_clamp_unless_compiling)(x), x)
    torch.testing.assert_close(thunder.jit(_clamp_unless_compiling, executors=thunderplug.discover())(x),
                               x.clamp(-1, 1))


def test_a_value_branch_of_the_users_own_breaks_the_graph_naming_the_line():
    def branches_on_value(x):
        if x.sum() > 0:
            return x
        return -x

    jitted = thunder.jit(branches_on_value, executors=thunderplug.discover())
    where = r"bool\(\) of a tensor \(at .*test_compile_branches.py:\d+\)"
    with pytest.warns(thunderplug.ThunderplugWarning, match=where):
        x = torch.randn(4).abs()
        torch.testing.assert_close(jitted(x), x)
    torch.testing.assert_close(jitted(-x), x)
    with pytest.raises(NotImplementedError, match="data dependency"):
        thunder.jit(branches_on_value)(x)


# -- torchao: MX float8 casts saturate at 448 as in eager ------------------------------------------------


def _to_mx_bits(x):
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    scale, data = to_mx(x, torch.float8_e4m3fn, 32)
    return scale.view(torch.uint8), data.view(torch.uint8)


def test_torchao_mx_float8_cast_saturates_as_in_eager():
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    x = torch.randn(2, 64) * 100
    x[0, 0], x[0, 40], x[1, 3], x[1, 40] = 1e6, float("inf"), float("nan"), 1e9
    expected = _to_mx_bits(x)
    data = expected[1].view(torch.float8_e4m3fn).float()
    assert data[0, 0] == 448 and data[0, 40] == 448 and data[1, 40] == 448 and data[1, 3].isnan()
    actual = thunder.jit(_to_mx_bits, executors=thunderplug.discover())(x)
    assert all(torch.equal(a, e) for a, e in zip(actual, expected))
    # the tracers' branch (what stock thunder answers) gives other values: NaN past the float8 range
    with compile_branches._lock:
        compile_branches._compiling_branch.add(to_mx.__code__)
    try:
        other = thunder.jit(_to_mx_bits, executors=thunderplug.discover())(x)
    finally:
        _forget(to_mx)
    assert not torch.equal(other[1], expected[1])


# -- transformers: masks built without reading tensors -----------------------------------------------------


@pytest.mark.parametrize("packed", [False, True])
def test_transformers_packed_sequence_detection_equals_eager(packed):
    masking_utils = pytest.importorskip("transformers.masking_utils")
    _forget(masking_utils.find_packed_sequence_indices)

    def sequence_ids(position_ids, x):
        found = masking_utils.find_packed_sequence_indices(position_ids)
        return x if found is None else x + found

    position_ids = torch.tensor([[0, 1, 2, 0, 1, 2]]) if packed else torch.arange(6)[None]
    x = torch.randn(1, 6)
    torch.testing.assert_close(
        thunder.jit(sequence_ids, executors=thunderplug.discover())(position_ids, x), sequence_ids(position_ids, x),
        rtol=0, atol=0,
    )
    assert compile_branches.uses_compiling_branch(masking_utils.find_packed_sequence_indices.__code__)


def test_hf_bert_with_padding_equals_eager():
    """thunder's own test_networks.py::test_hf_bert, tiny and with a padding mask (``padding_mask.all()``)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, vocab_size=64, max_position_embeddings=32)
    model = transformers.BertForSequenceClassification(config).eval()
    ids = torch.randint(1, 60, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 8:] = 0
    expected = model(ids, attention_mask=mask).logits
    actual = thunder.jit(model, executors=thunderplug.discover())(ids, attention_mask=mask).logits
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
