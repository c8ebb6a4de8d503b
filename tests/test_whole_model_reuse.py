"""``thunder.jit(model, executors=discover())`` of a model with repeated blocks compiles a block once
(issue 26, ``thunderplug.caching.regions``): the blocks are compiled regions, blocks of one structure share
one compilation, everything else runs eagerly.
Every result is checked against eager: losses, outputs and every gradient bit-identical."""

from __future__ import annotations

import contextvars
import copy
import gc
import pathlib
import sys
import threading

import pytest
import thunder
import torch
import torch.nn.functional as F
from torch import nn

import thunderplug
from thunderplug.caching.regions import compiled_regions
from thunderplug.caching.reuse import shared_compilation_of

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import gpt_model  # noqa: E402

CONFIG = gpt_model.GPTConfig(layers=3, d_model=32, heads=2, seq=8, batch=2, vocab=32)


@pytest.fixture(autouse=True)
def no_structures_of_other_tests():
    """Modules of earlier tests, garbage but not yet collected, would share their compilations."""
    gc.collect()
    with torch.backends.mkldnn.flags(enabled=False):
        yield


def jit(module: nn.Module, **options) -> nn.Module:
    return thunder.jit(module, executors=thunderplug.discover(quiet=True), **options)


def misses(jitted: nn.Module) -> dict[str, int]:
    """Compilations per region: 0 for a region that ran another one's compilation."""
    return {path: thunder.cache_misses(region) for path, region in compiled_regions(jitted).items()}


def train_like_eager(model: nn.Module, *inputs: torch.Tensor, steps: int = 3, **options) -> nn.Module:
    """``steps`` AdamW steps of ``jit(model)`` and of an eager copy: every loss and every gradient
    bit-identical; the jitted model."""
    eager = copy.deepcopy(model)
    jitted = jit(model, **options)
    ours, theirs = torch.optim.AdamW(jitted.parameters(), lr=1e-2), torch.optim.AdamW(eager.parameters(), lr=1e-2)
    for step in range(steps):
        ours.zero_grad(set_to_none=True)
        theirs.zero_grad(set_to_none=True)
        loss, expected = jitted(*inputs), eager(*inputs)
        assert torch.equal(loss, expected), f"step {step}: {loss.item()!r} != eager {expected.item()!r}"
        assert loss.requires_grad and expected.requires_grad
        loss.backward()
        expected.backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            assert (p.grad is None) == (q.grad is None), name
            assert q.grad is None or torch.equal(p.grad, q.grad), f"step {step}: grad of {name}"
        ours.step()
        theirs.step()
    return jitted


@pytest.mark.parametrize("float8", [True, False], ids=["float8", "fp32"])
def test_gpt_blocks_compile_once_and_train_bit_identical_to_eager(float8):
    model, tokens, targets = gpt_model.build(CONFIG)
    if float8:
        model = gpt_model.to_float8(model)
    jitted = train_like_eager(model, tokens, targets)
    assert misses(jitted) == {"blocks.0": 1, "blocks.1": 0, "blocks.2": 0}
    shared = shared_compilation_of(compiled_regions(jitted)["blocks.0"])
    assert shared is not None and shared.reuses == 2
    # the ThunderModule is the model's: its parameters and state_dict under the model's names, and
    # the model's own modules back in their places after each call
    assert [n for n, _ in jitted.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert list(jitted.state_dict()) == list(model.state_dict())
    assert all(type(b) is gpt_model.Block for b in model.blocks)


@pytest.mark.parametrize("name", ["hf_llama", "litgpt_llama"])
def test_transformers_and_litgpt_blocks_compile_once(name):
    """Their blocks keep their index (transformers' ``layer_idx``, litgpt's ``block_idx``), which the
    forward reads only with a KV cache: one compilation for all blocks, trained bit-identically."""
    pytest.importorskip("transformers" if name.startswith("hf") else "litgpt")
    from tests.real_models.cases import BY_NAME

    case = BY_NAME[name]
    model = case.build()
    layers = "model.model.layers" if name.startswith("hf") else "model.transformer.h"
    assert [getattr(b.self_attn if name.startswith("hf") else b.attn, "layer_idx" if name.startswith("hf") else
            "block_idx") for b in model.get_submodule(layers)] == [0, 1]
    jitted = train_like_eager(model, case.batch())
    assert misses(jitted) == {f"{layers}.0": 1, f"{layers}.1": 0}


class Activation(nn.Module):
    """A module without tensors, held outside the module tree."""

    def __init__(self, slope: float = 0.1):
        super().__init__()
        self.slope = slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(x, self.slope)


class WithHelpers(nn.Module):
    """A block with its own helper module in a plain dict, as transformers 5.25's attention layers hold
    their kernel wrappers (``kernels``' ``use_kernelized_func``: a fresh module per layer)."""

    def __init__(self, helper: nn.Module, d: int = 8):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.__dict__["_helpers"] = {"act": helper}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self._helpers["act"](self.fc(x))


def test_blocks_holding_fresh_modules_without_tensors_compile_once():
    torch.manual_seed(0)
    model = nn.Sequential(*(WithHelpers(Activation()) for _ in range(3)))
    jitted = train_like_eager(Loss(model), x8())
    assert misses(jitted) == {"model.0": 1, "model.1": 0, "model.2": 0}


def test_a_block_whose_held_module_differs_compiles_its_own():
    """A block whose helper has another class compiles its own; one whose helper holds another number
    runs correctly (the number is checked by the prologue, as the block's own numbers are)."""
    torch.manual_seed(0)

    class Other(Activation):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(x) * self.slope

    helpers = [Activation(), Activation(0.5), Other(), Activation()]
    model = nn.Sequential(*(WithHelpers(h) for h in helpers))
    jitted = train_like_eager(Loss(model), x8())
    seen = misses(jitted)
    assert seen["model.0"] == 1 and seen["model.3"] == 0  # the same helper: one compilation
    assert seen["model.2"] == 1


class Indexed(nn.Module):
    """A block whose forward reads its index."""

    def __init__(self, index: int, d: int = 8):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.index = index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(x).roll(self.index, -1)


def test_a_block_whose_forward_reads_another_index_compiles_its_own():
    torch.manual_seed(0)
    model = nn.Sequential(Indexed(1), Indexed(2), Indexed(1))
    jitted = train_like_eager(Loss(model), x8())
    assert misses(jitted) == {"model.0": 1, "model.1": 1, "model.2": 0}


class Loss(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.inp = nn.Linear(8, 8)  # every block's input requires grad
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(self.inp(x)).square().mean()


def test_the_whole_model_in_one_trace_when_asked():
    model, tokens, targets = gpt_model.build(CONFIG)
    jitted = train_like_eager(model, tokens, targets, steps=1, thunderplug_regions=False)
    assert compiled_regions(jitted) == {} and thunder.cache_misses(jitted) == 1


def test_stock_thunder_still_compiles_the_whole_model():
    model, tokens, targets = gpt_model.build(CONFIG)
    jitted = thunder.jit(model)
    jitted(tokens, targets)
    assert compiled_regions(jitted) == {} and thunder.cache_misses(jitted) == 1


class Block(nn.Module):
    def __init__(self, d: int = 8):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d)
        self.act = F.gelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.fc(self.norm(x)))


class Stack(nn.Module):
    def __init__(self, n: int = 3, d: int = 8):
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.scale = nn.Parameter(torch.rand(d))  # the root's own parameter, used by its eager code

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return (x * self.scale).square().mean()


def x8() -> torch.Tensor:
    return torch.randn(2, 3, 8)


class Notes:
    """An object a block writes to (as transformers' layers fill their KV cache)."""

    def __init__(self) -> None:
        self.last: torch.Tensor | None = None


class Noting(Block):
    def forward(self, x: torch.Tensor, notes: Notes) -> torch.Tensor:
        notes.last = x = super().forward(x)
        return x


class NotingStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Noting() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        notes = Notes()
        for block in self.blocks:
            x = block(x, notes)
        return x + notes.last


def test_a_block_given_an_object_it_may_write_to_runs_the_model_as_one_trace():
    """A region's writes to an argument object are not carried back by thunder 0.2.6 (the object would
    keep ``last=None``, silently): from such a call on the model runs as one trace, with eager's values."""
    model = NotingStack()
    x = x8()
    jitted = jit(model)
    for _ in range(2):  # the second call goes to the one trace directly
        torch.testing.assert_close(jitted(x), model(x), rtol=0, atol=0)
    assert thunder.cache_misses(jitted) == 1 and thunder.cache_hits(jitted) == 1  # the one trace
    assert all(thunder.cache_misses(region) == 0 for region in compiled_regions(jitted).values())


HOOK_SCALE = 2.0  # a global a hook reads: the region's prologue would reach it through the block's hooks


def _scaling_hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    return output * HOOK_SCALE


def test_a_block_with_hooks_of_its_own_runs_the_model_as_one_trace():
    """A block region's trace would run the block's own hooks with the model's eager objects
    (transformers 5's collector list, :meth:`Regions.hooked`): the model runs as one trace, with eager's
    values and gradients, also when the hooks come after the first call."""
    model = Stack(3)
    eager = copy.deepcopy(model)
    jitted = jit(model)
    x = x8()
    torch.testing.assert_close(jitted(x), eager(x), rtol=0, atol=0)
    assert thunder.cache_misses(jitted) == 1 and sum(misses(jitted).values()) == 1  # regions
    for m in (model, eager):
        for block in m.blocks:
            block.register_forward_hook(_scaling_hook)
    loss, expected = jitted(x), eager(x)
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    assert thunder.cache_misses(jitted) == 2 and sum(misses(jitted).values()) == 1  # the one trace
    loss.backward()
    expected.backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=name)


def test_the_root_counts_its_calls_and_shows_its_regions_traces_as_thunder_does():
    """thunder's statistics of the jitted model (its own tests read them): a call in which a region
    compiled is a cache miss, one that compiled nothing a hit; the last traces are the regions'."""
    jitted = jit(Stack(3))
    x = x8()
    jitted(x)
    jitted(x)
    assert (thunder.cache_misses(jitted), thunder.cache_hits(jitted)) == (1, 1)
    assert len(thunder.last_prologue_traces(jitted)) == len(thunder.last_traces(jitted)) == 3
    with torch.no_grad():
        jitted(x)  # another grad mode: the regions compile again
    assert (thunder.cache_misses(jitted), thunder.cache_hits(jitted)) == (2, 1)


def test_parameters_replaced_on_the_thunder_module_run_the_model_as_one_trace():
    """Only the root's trace reads the ThunderModule's ``_overrides_parameters`` (a thunder transform's
    own parameters; thunder's ``test_tom_overrides_proxy``): with one replaced, the model runs as one
    trace, computing with the replacements and giving them the gradients."""
    model = Stack(3)
    reference = copy.deepcopy(model)
    jitted = jit(model)
    x = x8()
    jitted(x)
    for name, parameter in list(jitted._overrides_parameters.items()):
        jitted._overrides_parameters[name] = nn.Parameter(parameter.detach() * 2)
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.mul_(2)
    loss, expected = jitted(x), reference(x)
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    loss.backward()
    expected.backward()
    assert all(p.grad is None for p in model.parameters())
    for name, p in reference.named_parameters():
        torch.testing.assert_close(jitted._overrides_parameters[name].grad, p.grad, rtol=0, atol=0, msg=name)


_COLLECTOR: contextvars.ContextVar = contextvars.ContextVar("collector", default=None)


def _collecting_hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
    collected = _COLLECTOR.get()
    if collected is not None:
        collected.append(output)


class Collecting(Stack):
    """Registers hooks on its blocks in its first call and collects their outputs in a list it makes
    (transformers 5's ``output_hidden_states``)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        if not getattr(self, "hooked", False):
            for module in self.modules():  # by class, as transformers finds its layers
                if type(module) is Block:
                    module.register_forward_hook(_collecting_hook)
            self.hooked = True
        collected: list[torch.Tensor] = []
        token = _COLLECTOR.set(collected)
        try:
            return super().forward(x), collected
        finally:
            _COLLECTOR.reset(token)


def test_hooks_the_model_registers_on_its_blocks_in_the_call_run_in_one_trace():
    """A region's trace would append its proxies to the model's list: the call runs as one trace, which
    makes the list itself; every collected output, loss and gradient is eager's, at every call."""
    model = Collecting(3)
    eager = copy.deepcopy(model)
    jitted = jit(model)
    x = x8()
    for _ in range(2):
        (loss, collected), (expected, expected_collected) = jitted(x), eager(x)
        assert len(collected) == len(expected_collected) == 3
        for got, want in zip(collected, expected_collected, strict=True):
            assert type(got) is torch.Tensor
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch.testing.assert_close(loss, expected, rtol=0, atol=0)
        loss.backward()
        expected.backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=name)
    assert thunder.cache_misses(jitted) == 1


def test_a_block_that_differs_compiles_its_own():
    model = Stack(4)
    model.blocks[1].act = F.relu
    model.blocks[3].fc = nn.Linear(8, 8, bias=False)
    jitted = train_like_eager(model, x8())
    assert misses(jitted) == {"blocks.0": 1, "blocks.1": 1, "blocks.2": 0, "blocks.3": 1}
    regions = compiled_regions(jitted)
    assert shared_compilation_of(regions["blocks.2"]) is shared_compilation_of(regions["blocks.0"])


def test_layers_that_are_no_blocks_compile_whole():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU())
    eager = copy.deepcopy(model)
    jitted = jit(model)
    x = x8()
    torch.testing.assert_close(jitted(x), eager(x), rtol=0, atol=0)
    assert compiled_regions(jitted) == {} and thunder.cache_misses(jitted) == 1


def test_a_sequential_of_blocks_is_its_own_root():
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block())
    x = torch.randn(2, 8, requires_grad=True)
    eager = copy.deepcopy(model)
    jitted = jit(model)
    out, expected = jitted(x), eager(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert misses(jitted) == {"0": 1, "1": 0}


def test_no_grad_and_outputs_as_eager():
    model = Stack()
    eager = copy.deepcopy(model)
    jitted = jit(model)
    x = x8()
    with torch.no_grad():
        out, expected = jitted(x), eager(x)
    assert torch.equal(out, expected) and not out.requires_grad
    out, expected = jitted(x), eager(x)  # with grad: a compilation of its own per region
    assert torch.equal(out, expected) and out.requires_grad
    assert misses(jitted)["blocks.1"] == 0 and misses(jitted)["blocks.2"] == 0


def test_hooks_run_as_in_eager():
    """A block with a hook of its own: the model runs as one trace (:meth:`Regions.hooked`); the hooks
    of the root, of that block and of a block's submodule as eager's."""
    model = Stack()
    model.blocks[1].register_forward_hook(lambda module, args, out: out * 2)
    model.blocks[0].fc.register_forward_hook(lambda module, args, out: out + 1)
    model.register_forward_pre_hook(lambda module, args: (args[0] * 3,))
    jitted = train_like_eager(model, x8(), steps=2)
    assert thunder.cache_misses(jitted) == 1


def test_a_block_replaced_after_the_first_call_is_compiled_in_its_place():
    model = Stack()
    jitted = jit(model)
    x = x8()
    jitted(x)
    torch.manual_seed(1)
    model.blocks[2] = Block()
    torch.testing.assert_close(jitted(x), copy.deepcopy(model)(x), rtol=0, atol=0)
    assert compiled_regions(jitted)["blocks.2"]._model is model.blocks[2]
    assert type(model.blocks[2]) is Block


class Marked(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    @torch.compiler.nested_compile_region
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).sin()


def test_nested_compile_region_marks_a_region():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Marked(), nn.Linear(8, 8), Marked())  # the Linear layers run eagerly
    x = torch.randn(4, 8, requires_grad=True)
    eager = copy.deepcopy(model)
    jitted = jit(model)
    out, expected = jitted(x), eager(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert misses(jitted) == {"1": 1, "3": 0}


def test_calls_from_threads_match_eager():
    model = Stack(4)
    eager = copy.deepcopy(model)
    jitted = jit(model)
    inputs = [x8() for _ in range(4)]
    results: dict[int, torch.Tensor] = {}

    def run(i: int) -> None:
        results[i] = jitted(inputs[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, x in enumerate(inputs):
        torch.testing.assert_close(results[i], eager(x), rtol=0, atol=0)
    assert all(type(b) is Block for b in model.blocks)
    # thunder compiles a function called in several threads at once in each of them (blocks.0, up
    # to 4 times); every thread has offered its blocks.0 before it calls blocks.1
    assert [misses(jitted)[f"blocks.{i}"] for i in (1, 2, 3)] == [0, 0, 0]


def test_quantized_blocks_share_and_match_eager():
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    model = Stack()
    quantize_(model, Int8WeightOnlyConfig())
    eager = copy.deepcopy(model)
    jitted = jit(model)
    x = x8()
    with torch.no_grad():
        torch.testing.assert_close(jitted(x), eager(x), rtol=0, atol=0)
    assert misses(jitted) == {"blocks.0": 1, "blocks.1": 0, "blocks.2": 0}


EXPLAINED = '''
import sys, torch, thunder, thunderplug
sys.path.insert(0, {benchmarks!r})
import gpt_model

model, tokens, targets = gpt_model.build(gpt_model.GPTConfig(layers=3, d_model=32, heads=2, seq=8, batch=2, vocab=32))
thunder.jit(model, executors=thunderplug.discover(quiet=True))(tokens, targets).backward()
'''


def test_thunderplug_explain_shows_the_regions_and_their_reuse_counts(tmp_path, capsys):
    from thunderplug.commands.cli import main

    script = tmp_path / "gpt.py"
    script.write_text(EXPLAINED.format(benchmarks=str(pathlib.Path(gpt_model.__file__).parent)))
    assert main(["explain", str(script)]) == 0
    out = capsys.readouterr().out
    assert "1 thunder.jit function(s) compiled\n" in out
    assert "compiled as 3 regions (the code around them runs eagerly)" in out
    regions = out.split("== thunder.jit function 0: GPT ==", 1)[1].split("\n\n", 1)[0]
    assert "blocks.0  Block" in regions and "compiled here; run by 2 other regions" in regions
    for name in ("blocks.1", "blocks.2"):
        assert f"{name}  Block" in regions
    assert regions.count("runs the compilation of region blocks.0") == 2
    assert "== region blocks.0 (Block) of function 0 ==" in out and "== region blocks.1" not in out


class Experts(nn.Module):
    """A block whose own blocks repeat (a mixture of experts)."""

    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleList(Block() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(expert(x) for expert in self.experts)


def test_a_region_compiles_whole():
    torch.manual_seed(0)
    model = nn.Sequential(Experts(), Experts())
    jitted = jit(model)
    x = x8().requires_grad_()  # as the second one's input: both run one compilation
    torch.testing.assert_close(jitted(x), copy.deepcopy(model)(x), rtol=0, atol=0)
    assert misses(jitted) == {"0": 1, "1": 0}
    assert all(compiled_regions(region) == {} for region in compiled_regions(jitted).values())
