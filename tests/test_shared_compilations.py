"""``thunder.jit(block)`` on blocks of one structure compiles once (issue 26): the other blocks run
the first one's compilation with their own parameters, and a block that differs in anything its
trace depends on compiles its own. Every result is checked against eager, forward and backward."""

from __future__ import annotations

import copy
import enum
import gc
import pathlib
import sys
import threading

import pytest
import thunder
import torch
import torch.nn.functional as F
from subclasses import ScaledTensor
from torch import nn

import thunderplug
from thunderplug.caching import reuse
from thunderplug.caching.reuse import shared_compilation_of
from thunderplug.commands.explain import explain

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import gpt_model  # noqa: E402


class Block(nn.Module):
    """LayerNorm, an MLP and a residual, with the kinds of attributes a forward reads."""

    def __init__(self, d: int = 8, hidden: int = 16):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, hidden)
        self.proj = nn.Linear(hidden, d)
        self.scale = nn.Parameter(torch.rand(d))
        self.register_buffer("shift", torch.zeros(d))
        self.roll = 1  # int
        self.gain = 0.5  # float
        self.residual = True  # bool
        self.act = F.gelu  # a function (no prologue guard reads it)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        y = self.proj(self.act(self.fc(self.norm(x)))).roll(self.roll, -1) * self.gain * self.scale + self.shift
        return x + y if self.residual else y


@pytest.fixture(autouse=True)
def no_structures_of_other_tests():
    """Modules of earlier tests, garbage but not yet collected, would share their compilations."""
    gc.collect()


def jit(module: nn.Module) -> nn.Module:
    return thunder.jit(module, executors=thunderplug.discover(quiet=True))


def blocks(n: int, **kwargs) -> list[Block]:
    torch.manual_seed(0)
    return [Block(**kwargs) for _ in range(n)]


def check_like_eager(block: nn.Module, jitted: nn.Module, reference: nn.Module, *inputs: torch.Tensor) -> None:
    """One forward and backward of ``jitted`` against ``reference`` (an untouched copy of ``block``):
    outputs, input and parameter gradients bit-identical."""
    ours = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    theirs = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    out, expected = jitted(*ours), reference(*theirs)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert out.requires_grad == expected.requires_grad
    if expected.requires_grad:
        grad = torch.randn_like(expected)
        out.backward(grad)
        expected.backward(grad)
        for a, b in zip(ours, theirs):
            assert (a.grad is None) == (b.grad is None)
            if b.grad is not None:
                torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
        for (name, p), q in zip(block.named_parameters(), reference.parameters()):
            assert (p.grad is None) == (q.grad is None), name
            if q.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=name)


def run_all(modules: list[nn.Module], *inputs: torch.Tensor) -> list[nn.Module]:
    """Jit each module, call it once against an eager copy; the jitted modules (kept alive: the
    compilations are shared while one of them lives)."""
    references = [copy.deepcopy(m) for m in modules]
    jitted = [jit(m) for m in modules]
    for m, j, r in zip(modules, jitted, references):
        check_like_eager(m, j, r, *inputs)
    return jitted


def x8(*shape: int) -> torch.Tensor:
    return torch.randn(*(shape or (2, 3, 8)), requires_grad=True)


def test_identical_blocks_compile_once_and_keep_their_own_parameters():
    modules = blocks(3)
    with torch.no_grad():
        modules[2].shift.fill_(1.5)  # a buffer's value is an input, not part of the program
    jitted = run_all(modules, x8())
    assert [thunder.cache_misses(j) for j in jitted][1:] == [0, 0]
    assert [thunder.cache_hits(j) for j in jitted] == [0, 1, 1]
    shared = shared_compilation_of(jitted[0])
    assert shared is not None and shared.reuses == 2
    assert all(shared_compilation_of(j) is shared for j in jitted)
    # each block trains its own parameters: a step on one changes no other
    optimizer = torch.optim.SGD(jitted[1].parameters(), lr=0.1)
    before = [copy.deepcopy(m.state_dict()) for m in modules]
    optimizer.step()
    for i, m in enumerate(modules):
        changed = any(not torch.equal(v, before[i][k]) for k, v in m.state_dict().items())
        assert changed == (i == 1)
    assert jitted[1].state_dict().keys() == modules[1].state_dict().keys()
    # after the step, every block still agrees with eager
    for m, j in zip(modules, jitted):
        m.zero_grad(set_to_none=True)
        check_like_eager(m, j, copy.deepcopy(m), x8())
    assert [thunder.cache_misses(j) for j in jitted][1:] == [0, 0]


def _param_shape(m: Block) -> None:
    m.fc, m.proj = nn.Linear(8, 12), nn.Linear(12, 8)


def _param_dtype(m: Block) -> None:
    m.scale = nn.Parameter(m.scale.detach().double())


def _requires_grad(m: Block) -> None:
    m.fc.weight.requires_grad_(False)


def _buffer_dtype(m: Block) -> None:
    m.shift = torch.zeros(8, dtype=torch.float64)


def _buffer_shape(m: Block) -> None:
    m.shift = torch.zeros(1, 8)


def _int(m: Block) -> None:
    m.roll = 2


def _float(m: Block) -> None:
    m.gain = 0.25


def _bool(m: Block) -> None:
    m.residual = False


def _function(m: Block) -> None:
    m.act = F.relu


def _submodule(m: Block) -> None:
    m.norm = nn.Identity()


def _submodule_attribute(m: Block) -> None:
    m.norm.eps = 1e-2


def _tied(m: Block) -> None:
    m.proj.bias = m.norm.bias  # the same parameter twice


def _training(m: Block) -> None:
    m.eval()


class Read(Block):
    """A block whose forward also reads a string, a complex number, a dtype, ``None``, an enum and
    whether it is training: the strings, numbers and bools the prologue checks, the others only the
    structure key covers."""

    def __init__(self) -> None:
        super().__init__()
        self.mode, self.phase, self.dtype, self.cap, self.side = "sum", 1j, torch.float32, None, Side.LEFT

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x).to(self.dtype) * abs(self.phase)
        y = y.sum(-1, keepdim=True) + y if self.mode == "sum" else y.amax(-1, keepdim=True) + y
        y = y if self.cap is None else y.clamp(max=self.cap)
        y = y * 2 if self.training else y  # as dropout and batch norm read it
        return -y if self.side is Side.LEFT else y


class Side(enum.Enum):
    LEFT = 1
    RIGHT = 2


def _str(m: Block) -> None:
    m.mode = "max"


def _complex(m: Block) -> None:
    m.phase = 2j


def _dtype(m: Block) -> None:
    m.dtype = torch.float64


def _none(m: Block) -> None:
    m.cap = 0.5


def _enum(m: Block) -> None:
    m.side = Side.RIGHT


CHANGES = [_param_shape, _param_dtype, _requires_grad, _buffer_dtype, _buffer_shape, _int, _float, _bool, _function,
           _submodule, _submodule_attribute, _tied, _training, _str, _complex, _dtype, _none, _enum]


@pytest.mark.parametrize("change", CHANGES, ids=[c.__name__.strip("_") for c in CHANGES])
def test_a_block_that_differs_compiles_its_own(change):
    torch.manual_seed(0)
    modules = [Read() for _ in range(3)]
    change(modules[1])
    jitted = run_all(modules, x8())
    assert [thunder.cache_misses(j) for j in jitted][1:] == [1, 0]  # the first may run an earlier test's
    assert shared_compilation_of(jitted[1]) is not shared_compilation_of(jitted[0])
    assert shared_compilation_of(jitted[2]) is shared_compilation_of(jitted[0])


def test_attributes_the_forward_does_not_read_may_differ():
    """transformers' ``layer_idx`` and litgpt's ``block_idx``: numbers and strings each block keeps but
    its forward does not read (transformers reads ``layer_idx`` only with a KV cache), on the block
    and on a submodule whose parameters the forward reads."""
    modules = blocks(3)
    for i, m in enumerate(modules):
        m.index, m.name, m.fc.index = i, f"block {i}", i / 2
    modules[2].fc.eval()  # a Linear does not read whether it is training
    jitted = run_all(modules, x8())
    assert [thunder.cache_misses(j) for j in jitted][1:] == [0, 0]
    assert all(shared_compilation_of(j) is shared_compilation_of(jitted[0]) for j in jitted)


@pytest.mark.parametrize(
    "inputs", [x8(2, 5, 8), x8().double(), torch.randn(2, 3, 8)], ids=["shape", "dtype", "no-requires-grad"]
)
def test_other_inputs_compile_once_more_and_that_is_shared_too(inputs):
    modules = blocks(3)
    references = [copy.deepcopy(m) for m in modules]
    jitted = [jit(m) for m in modules]
    first = x8()
    check_like_eager(modules[0], jitted[0], references[0], first)
    check_like_eager(modules[1], jitted[1], references[1], inputs)  # its own compilation
    check_like_eager(modules[2], jitted[2], references[2], first)  # the first block's
    check_like_eager(modules[2], jitted[2], references[2], inputs)  # the second block's
    check_like_eager(modules[0], jitted[0], references[0], inputs)
    assert [thunder.cache_misses(j) for j in jitted][1:] == [1, 0]


@pytest.mark.parametrize("mode", ["no_grad", "autocast"])
def test_grad_and_autocast_modes_are_guarded(mode):
    modules = blocks(2)
    references = [copy.deepcopy(m) for m in modules]
    jitted = [jit(m) for m in modules]
    x = x8()
    check_like_eager(modules[0], jitted[0], references[0], x)
    context = torch.no_grad() if mode == "no_grad" else torch.autocast("cpu", dtype=torch.bfloat16)
    with context:
        out, expected = jitted[1](x), references[1](x)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert out.dtype == expected.dtype and out.requires_grad == expected.requires_grad
    assert thunder.cache_misses(jitted[1]) == 1


class Scaling(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sin() * self.w


def test_a_subclass_input_with_another_flatten_context_compiles_its_own():
    torch.manual_seed(0)
    modules = [Scaling() for _ in range(3)]
    references = [copy.deepcopy(m) for m in modules]
    jitted = [jit(m) for m in modules]
    data = torch.randn(4)
    for i, scale in enumerate([2.0, 3.0, 2.0]):
        check_like_eager(modules[i], jitted[i], references[i], ScaledTensor(data, scale))
    assert [thunder.cache_misses(j) for j in jitted][1:] == [1, 0]


def test_float8_blocks_share_and_match_eager_float8():
    config = gpt_model.GPTConfig(layers=3, d_model=64, heads=2, seq=16, batch=2)
    model, tokens, _ = gpt_model.build(config)
    model = gpt_model.to_float8(model)
    x = (model.tok(tokens) + model.pos(torch.arange(config.seq))).detach().requires_grad_()
    jitted = run_all(list(model.blocks), x)
    assert [thunder.cache_misses(j) for j in jitted][1:] == [0, 0]


def test_quantized_blocks_share_and_match_eager():
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    modules = blocks(3)
    for m in modules:
        quantize_(m, Int8WeightOnlyConfig())
    references = [copy.deepcopy(m) for m in modules]
    jitted = [jit(m) for m in modules]
    x = torch.randn(2, 3, 8)
    with torch.no_grad():
        for j, r in zip(jitted, references):
            torch.testing.assert_close(j(x), r(x), rtol=0, atol=0)
    assert [thunder.cache_misses(j) for j in jitted][1:] == [0, 0]


def test_blocks_compiled_in_threads_match_eager():
    modules = blocks(4)
    references = [copy.deepcopy(m) for m in modules]
    jitted = [jit(m) for m in modules]
    x = x8()
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            check_like_eager(modules[i], jitted[i], references[i], x)
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sum(thunder.cache_misses(j) for j in jitted) >= 1
    for m, j, r in zip(modules, jitted, references):  # and again, whichever compilation each adopted
        check_like_eager(m, j, r, x)


def test_explain_of_a_block_shows_the_compilation_it_ran():
    jitted = run_all(blocks(2), x8())
    assert explain(jitted[1]) == explain(jitted[0])
    assert shared_compilation_of(jitted[1]).record is shared_compilation_of(jitted[0]).record


def test_the_registry_forgets_a_structure_when_its_modules_are_gone():
    jitted = run_all(blocks(2), x8())
    key = next(k for k, group in reuse._groups.items() if group is shared_group(jitted[0]))
    del jitted
    gc.collect()
    assert key not in reuse._groups


def shared_group(jitted: nn.Module) -> reuse.SharedGroup:
    shared = shared_compilation_of(jitted)
    return next(g for g in reuse._groups.values() if shared in g.compilations)


def test_functions_are_not_shared():
    def f(x):
        return x.sin()

    def g(x):
        return x.sin()

    jf, jg = (thunder.jit(fn, executors=thunderplug.discover(quiet=True)) for fn in (f, g))
    x = torch.randn(3)
    jf(x), jg(x)
    assert thunder.cache_misses(jg) == 1


EXPLAINED = '''
import thunder, torch, thunderplug
from torch import nn

torch.manual_seed(0)
blocks = [nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(3)]
jitted = [thunder.jit(b, executors=thunderplug.discover(quiet=True)) for b in blocks]
for j in jitted:
    j(torch.randn(2, 4)).sum().backward()
'''


def test_thunderplug_explain_shows_the_shared_compilation_and_its_reuses(tmp_path, capsys):
    from thunderplug.commands.cli import main
    from thunderplug.commands.explain import LEGEND

    script = tmp_path / "blocks.py"
    script.write_text(EXPLAINED)
    assert main(["explain", str(script)]) == 0
    out = capsys.readouterr().out.replace(LEGEND, "")
    assert "3 thunder.jit function(s) compiled (2 of them ran the compilation of a module of the same structure)" in out
    functions = out.split("== thunder.jit function ")[1:]
    assert "compiled here; run by 2 other modules of the same structure without compiling" in functions[0]
    assert "executor" in functions[0]  # its summary table
    for text in functions[1:]:
        assert "runs the compilation of function 0 (shared with 2 other modules): no compilation of its own" in text
        assert "executor" not in text


def test_a_module_changed_after_its_first_call_offers_later_compilations_under_its_new_structure():
    modules = blocks(2)
    references = [copy.deepcopy(m) for m in modules]
    jitted = [jit(m) for m in modules]
    check_like_eager(modules[0], jitted[0], references[0], x8())
    modules[0].act = references[0].act = F.relu  # not a value any prologue checks
    check_like_eager(modules[0], jitted[0], references[0], x8(2, 5, 8))  # a new shape: traced with relu
    check_like_eager(modules[1], jitted[1], references[1], x8(2, 5, 8))  # still gelu: not that compilation
    assert thunder.cache_misses(jitted[1]) == 1
