"""Shapes that change from call to call under discover() (issue 44): training with varying sequence lengths, a
partial last batch, a Python branch on a size, ``generate()`` with a growing cache, a graph break whose selected
count changes, jagged NestedTensors.

Values are eager's, bit for bit (they are today, with one compilation per shape: keep them so). The compilation
counts are issue 44's targets: marked ``xfail(strict=True)`` with today's measured count until symbolic sizes serve
them. The models are benchmarks/dynamic_shapes.py's tiny ones (``--quick``); ``THUNDERPLUG_DYNAMIC_HEAVY=1`` also runs
the benchmark-sized GPT and a 16-token ``generate()``.
"""

from __future__ import annotations

import copy
import os

import pytest
import thunder
import torch
from benchmark_scripts import load

import thunderplug
from thunderplug.caching import dynamic_sizes
from thunderplug.tracing.compilation import record_of

HEAVY = os.environ.get("THUNDERPLUG_DYNAMIC_HEAVY") == "1"
bench = load("dynamic_shapes")

#: five distinct sequence lengths (one of them twice), batch 2
LENGTHS = (8, 13, 8, 21, 30, 17)
DISTINCT = len(set(LENGTHS))
AT_MOST = 3  # issue 44: at most 3 full compilations whatever the number of distinct lengths


def _exact(actual, expected, what: str) -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, msg=lambda m: f"{what}: {m}")


def _model(name: str, heavy: bool = False) -> torch.nn.Module:
    return bench.build(name, quick=not heavy)[0]


def _train_against_eager(model: torch.nn.Module, batches: list) -> torch.nn.Module:
    """AdamW steps of ``model`` under discover() and of its copy in eager: every loss and gradient, then every
    parameter, bit for bit. Returns the jitted model."""
    reference = copy.deepcopy(model)
    jitted = thunder.jit(model, executors=thunderplug.discover())
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, reference)]
    for step, (tokens, targets) in enumerate(batches):
        loss, expected = jitted(tokens, targets), reference(tokens, targets)
        _exact(loss, expected, f"step {step} loss (shape {tuple(tokens.shape)})")
        loss.backward()
        expected.backward()
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            _exact(p.grad, q.grad, f"step {step} gradient of {name}")
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        _exact(p, q, f"final {name}")
    return jitted


def _varying_lengths(vocab: int, batch: int = 2, lengths=LENGTHS) -> list:
    generator = torch.Generator().manual_seed(0)
    out = []
    for length in lengths:
        tokens = torch.randint(0, vocab, (batch, length + 1), generator=generator)
        out.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return out


MODELS = ["gpt", "llama"]


@pytest.fixture(scope="module", params=MODELS)
def trained(request):
    """(model name, its discover() compilation) after training over LENGTHS against eager."""
    model = _model(request.param)
    vocab = bench.llama_vocab(True) if request.param == "llama" else bench.gpt_config(True).vocab
    return request.param, _train_against_eager(model, _varying_lengths(vocab))


def test_training_with_varying_lengths_equals_eager(trained):
    """Every step's loss, every gradient and every final parameter are eager's (checked inside the fixture);
    today each distinct length is one full compilation."""
    name, jitted = trained
    assert bench.compilations(jitted) >= 1


def test_distinct_lengths_compile_at_most_three_times(trained):
    """The first length compiles static, the second with the length symbolic (a template), the others are
    re-specialized from it (caching.dynamic_sizes)."""
    name, jitted = trained
    assert bench.compilations(jitted) <= AT_MOST, (name, bench.compilations(jitted))
    assert bench.compilations(jitted) + bench.respecializations(jitted) == DISTINCT, name


@pytest.mark.skipif(not HEAVY, reason="THUNDERPLUG_DYNAMIC_HEAVY=1 runs it (~2 CPU minutes)")
def test_benchmark_sized_gpt_with_varying_lengths_equals_eager():
    config = bench.gpt_config()
    jitted = _train_against_eager(_model("gpt", heavy=True), _varying_lengths(config.vocab, batch=config.batch))
    assert bench.compilations(jitted) <= AT_MOST


def test_partial_last_batch_equals_eager():
    """An epoch's last, smaller batch (4, 4, then 3 and 1 sequences), at two lengths."""
    vocab = bench.gpt_config(True).vocab
    batches = [b for size in (4, 4, 3, 1) for b in _varying_lengths(vocab, batch=size, lengths=(12,))]
    batches += _varying_lengths(vocab, batch=3, lengths=(20,))
    jitted = _train_against_eager(_model("gpt"), batches)
    assert bench.compilations(jitted) == 4  # (4, 12), (3, 12), (1, 12), (3, 20)


#: 32 steps, two epochs of batch 4 each ending in a partial batch (3, then 2)
EPOCHS = (4,) * 15 + (3,) + (4,) * 15 + (2,)


def _sized_batches(vocab: int, shapes) -> list:
    """(tokens, targets) of each (batch, length) in ``shapes``."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for batch, length in shapes:
        tokens = torch.randint(0, vocab, (batch, length + 1), generator=generator)
        out.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return out


@pytest.mark.parametrize("name", MODELS)
def test_changing_batch_sizes_compile_at_most_three_times(name):
    """32 steps of 30 lengths whose batch size also changes (two epochs, each ending in a partial batch): the
    first call static, the second with the length symbolic, the first partial batch with both symbolic; the rest
    re-specialized, bit-identical to eager."""
    vocab = bench.llama_vocab(True) if name == "llama" else bench.gpt_config(True).vocab
    shapes = list(zip(EPOCHS, bench.lengths(len(EPOCHS)), strict=True))
    jitted = _train_against_eager(_model(name), _sized_batches(vocab, shapes))
    assert bench.compilations(jitted) <= AT_MOST, (name, bench.compilations(jitted))
    assert bench.compilations(jitted) + bench.respecializations(jitted) == len(set(shapes)), name


def test_a_batch_size_crossing_a_guard_gives_eagers_results():
    """The GPT's template with batch and length symbolic depends on ``batch != length`` and ``batch != d_model``
    (32 here; the ShapeEnv's guards): calls where they fail compile again, and give eager's values."""
    config = bench.gpt_config(True)
    shapes = [(4, 10), (4, 13), (3, 17), (5, 22), (3, 3), (config.d_model, 9), (2, 30)]
    jitted = _train_against_eager(_model("gpt"), _sized_batches(config.vocab, shapes))
    assert bench.compilations(jitted) == 5, bench.compilations(jitted)  # (4, 10), (4, 13), (3, 17), (3, 3), (32, 9)


@pytest.fixture
def float8_gpt(no_onednn):
    """The float8 GPT (torchao's convert_to_float8_training, tensorwise), oneDNN off as in the benchmark."""
    pytest.importorskip("torchao.float8")
    return _model("gpt-fp8")


def test_float8_gpt_with_changing_lengths_and_batches_compiles_at_most_three_times(float8_gpt):
    """The float8 matmuls are torchao's ``__torch_dispatch__`` traced on fakes (the subclass compiler): in a tracked
    compilation on fakes with symbolic sizes, so the template serves every length and batch; bit-identical to eager
    float8."""
    shapes = list(zip(EPOCHS, bench.lengths(len(EPOCHS)), strict=True))
    jitted = _train_against_eager(float8_gpt, _sized_batches(bench.gpt_config(True).vocab, shapes))
    assert bench.compilations(jitted) <= AT_MOST, bench.compilations(jitted)
    assert bench.compilations(jitted) + bench.respecializations(jitted) == len(set(shapes))


def test_float8_gpt_keeps_its_templates_residual_choice_at_every_size(float8_gpt):
    """Which float8 casts the backward recomputes rather than saves depends on the activations' bytes (the subclass
    compiler's residual budget; here it flips below 11 rows): made once for the template's sizes, without a guard,
    since either choice gives the same values. 10 rows re-specialize the template, bit-identical to eager."""
    shapes = [(4, 20), (4, 33), (3, 41), (2, 5), (3, 17)]
    jitted = _train_against_eager(float8_gpt, _sized_batches(bench.gpt_config(True).vocab, shapes))
    assert bench.compilations(jitted) == 3, bench.compilations(jitted)
    assert bench.respecializations(jitted) == 2


class _BranchOnLength(torch.nn.Module):
    """Branches in Python on a size, as code with a fast path for long inputs does: a trace with a symbolic length
    must guard ``x.shape[1] > 64`` and compile again across it."""

    def __init__(self):
        super().__init__()
        self.long = torch.nn.Linear(8, 8)
        self.short = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if x.shape[1] > 64:
            y = self.long(x).relu()
        else:
            y = torch.tanh(self.short(x)) * 2
        return torch.nn.functional.mse_loss(y, targets)


def test_a_branch_on_a_size_gives_eagers_results_on_both_sides_of_it():
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    lengths = (40, 50, 70, 90, 60, 64, 65, 100)  # both sides, twice each before crossing, and the edge
    batches = [(torch.randn(2, n, 8, generator=generator), torch.randn(2, n, 8, generator=generator))
               for n in lengths]
    model = _BranchOnLength()
    jitted = _train_against_eager(model, batches)
    assert bench.compilations(jitted) <= len(lengths)


@pytest.fixture(scope="module")
def generated():
    """Greedy ``generate()`` of the tiny Llama without a static cache (DynamicCache: the cache grows every token),
    ``model.forward`` under discover(); (eager's tokens, discover()'s tokens, compilations)."""
    new_tokens = 16 if HEAVY else 5
    prompt = torch.randint(0, bench.llama_vocab(True), (1, 8), generator=torch.Generator().manual_seed(1))
    options = dict(max_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None)
    results = []
    for jit in (False, True):
        model = bench.llama(True, use_cache=True, initializer_range=0.3).eval()
        if jit:
            model.forward = thunder.jit(model.forward, executors=thunderplug.discover())
        with torch.no_grad():
            results.append(model.generate(prompt, **options))
    return results[0], results[1], bench.compilations(model.forward), new_tokens


def test_generate_with_a_growing_cache_gives_eagers_tokens(generated):
    expected, tokens, _, new_tokens = generated
    assert expected.shape == (1, 8 + new_tokens)
    assert torch.equal(tokens, expected)


def test_generate_with_a_growing_cache_compiles_at_most_three_times(generated):
    """The DynamicCache's keys and values are tracked through its attributes (``input 1.layers[0].keys dim 2``):
    the prompt and the first decoding step compile static, the second with the cache length symbolic, every
    later token is re-specialized (the new token's input_ids, (1, 1), is never tracked)."""
    _, _, compilations, new_tokens = generated
    assert compilations <= AT_MOST, compilations
    assert compilations < new_tokens


def test_generate_again_with_another_prompt_length_gives_eagers_tokens():
    """A second generate() on the same compiled forward with a longer prompt: the prompt's length (seen twice)
    is then tracked, with an empty cache, and decoding re-specializes the cache template for other lengths."""
    model = bench.llama(True, use_cache=True, initializer_range=0.3).eval()
    reference = copy.deepcopy(model)
    model.forward = thunder.jit(model.forward, executors=thunderplug.discover())
    options = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None)
    generator = torch.Generator().manual_seed(3)
    for length in (8, 12, 5):
        prompt = torch.randint(0, bench.llama_vocab(True), (1, length), generator=generator)
        with torch.no_grad():
            expected, tokens = reference.generate(prompt, **options), model.generate(prompt, **options)
        assert torch.equal(tokens, expected), (length, tokens, expected)
    assert bench.respecializations(model.forward) >= 1


# -- graph breaks (issue 44 item 3) -----------------------------------------------------------------


def _masked(layer: torch.nn.Linear):
    def fn(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        selected = (layer(x) * 2)[mask]  # data-dependent: a graph break, the graphs around it jitted
        return (selected.relu() * 3).sum()

    return fn


def _masked_parts(counts):
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 8)
    reference = copy.deepcopy(layer)
    jitted = thunder.jit(_masked(layer), executors=thunderplug.discover())
    generator = torch.Generator().manual_seed(2)
    for count in counts:
        x = torch.randn(10, 8, generator=generator)
        mask = torch.zeros(10, dtype=torch.bool)
        mask[torch.randperm(10, generator=generator)[:count]] = True
        out = jitted(x, mask)
        expected = _masked(reference)(x, mask)
        _exact(out, expected, f"{count} selected: value")
        out.backward()
        expected.backward()
        for p, q in zip(layer.parameters(), reference.parameters(), strict=True):
            _exact(p.grad, q.grad, f"{count} selected: gradient")
            p.grad = q.grad = None
    return record_of(jitted).graph_parts


def _masked_calls(counts=(3, 5, 7, 9, 3)):
    return sum(thunder.cache_misses(part) for part in _masked_parts(counts))


def test_a_graph_break_with_changing_selected_counts_equals_eager():
    assert _masked_calls() >= 2  # the graphs before and after the break


def test_a_graph_break_compiles_the_graph_after_it_once_for_all_counts():
    """Issue 44 item 3: the graph before the break, Dynamo's static graph for the first count and its symbolic one
    for every later count are compiled once each; each further count re-specializes the symbolic graph's trace
    (Dynamo's ``SymInt`` argument is read from the tensor's shape: wiring.graph_breaks)."""
    counts = (3, 5, 7, 9, 6, 3)
    torch._dynamo.reset()  # Dynamo's automatic dynamic is per code object: forget the earlier tests' counts
    parts = _masked_parts(counts)
    full = sum(dynamic_sizes.stats(thunder.compile_data(part))[0] for part in parts)
    respecialized = sum(dynamic_sizes.stats(thunder.compile_data(part))[1] for part in parts)
    assert full <= 3, full
    # the first two counts compiled in full; the others re-specialize (the first count again may be Dynamo's
    # static graph or its symbolic one, as Dynamo's guards pick)
    assert respecialized >= len(set(counts)) - 3, respecialized


# -- jagged NestedTensor (issue 44 item 4) ----------------------------------------------------------


def test_a_jagged_nested_tensor_made_inside_is_refused_naming_the_type():
    """Made inside the function from plain values and offsets (tests/real_programs pins a NestedTensor input's
    refusal): refused by name, not run with wrong sizes (docs/subclasses.md says what is missing)."""
    layer = torch.nn.Linear(8, 4)

    def fn(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        nested = torch.nested.nested_tensor_from_jagged(values, offsets)
        return layer(nested).relu().values().sum()

    values, offsets = torch.randn(8, 8), torch.tensor([0, 3, 8])
    assert torch.isfinite(fn(values, offsets))  # eager runs it
    jitted = thunder.jit(fn, executors=thunderplug.discover())
    # the first NestedTensor the interpreter meets is torch's own view dummy (nested_tensor.py's _nt_view_dummy)
    with pytest.raises(Exception, match=r"NestedTensor with a dynamic \(nested int\) dimension, shape \(2, j\d+, 3\) "
                       r"\(at .*nested_tensor.py:\d+\): thunder 0.2.6 traces static shapes only, so jagged "
                       r"NestedTensors are not supported, as inputs or made inside the function") as error:
        jitted(values, offsets)
    assert "while tracing <function" in str(error.value) and ".fn at" in str(error.value)  # the user's function
