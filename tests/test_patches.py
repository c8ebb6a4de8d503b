"""Every patch of thunder listed in docs/patches.md: installed, inert without discover(), effective with it."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import thunder
import torch
from thunder.core import jit_ext
from thunder.core.codeutils import SigInfo
from thunder.core.symbol import Symbol
from thunder.torch.experimental import dtensor_proxy
from torch.testing._internal.two_tensor import TwoTensor

import thunderplug
from thunderplug import patches

ROOT = Path(__file__).resolve().parents[1]


def test_patches_are_installed_once_by_discover():
    thunderplug.discover()
    assert dtensor_proxy.proxify_dtensor is patches._proxify
    assert Symbol.__call__ is patches._symbol_call
    assert jit_ext._general_jit_lookaside_map[isinstance] is patches._isinstance_lookaside
    assert jit_ext._general_jit_lookaside_map[type.__call__] is patches._type_call
    assert SigInfo.from_name_and_args is patches._siginfo_from_name_and_args
    assert jit_ext._general_jit_lookaside_map[patches._FUNCTION_APPLY] is patches._autograd_function_apply
    before = dict(patches._originals)
    patches.install()
    assert patches._originals == before


def test_every_patch_is_listed_in_the_docs():
    listed = (ROOT / "docs" / "patches.md").read_text()
    for name in ("proxify_dtensor", "Symbol.__call__", "isinstance", "type.__call__", "SigInfo.from_name_and_args", "Function.apply", "autograd_function_apply", "thunder.jit"):
        assert f"`{name}`" in listed, name


def test_plain_thunder_jit_keeps_thunder_behaviour():
    thunderplug.discover()

    def fn(x):
        return isinstance(x, TwoTensor), x * 2

    jitted = thunder.jit(fn)
    is_two_tensor, _ = jitted(TwoTensor(torch.randn(2), torch.randn(2)))
    assert is_two_tensor is False  # thunder 0.2.6 erases the subclass; we do not change that
    assert '"TwoTensor[' not in str(thunder.last_traces(jitted)[0])


def test_autograd_function_with_a_config_argument():
    """thunder 0.2.6 alone fails with "... has no attribute 'name'" on such an argument."""

    @dataclasses.dataclass
    class Config:
        factor: float

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, config):
            ctx.factor = config.factor
            return x * config.factor

        @staticmethod
        def backward(ctx, grad):
            return grad * ctx.factor, None

    thunderplug.discover()
    x = torch.randn(3, requires_grad=True)
    out = thunder.jit(lambda x: Scale.apply(x, Config(3.0)))(x)
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 3.0))


def test_recording_restores_thunder_jit():
    original = thunder.jit
    with patches.recording_jitted_functions() as recorded:
        thunder.jit(lambda x: x + 1)
    assert thunder.jit is original and len(recorded) == 1


def test_explain_cli_runs_a_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch, thunder, thunderplug\n"
        "from torch.testing._internal.two_tensor import TwoTensor\n"
        "f = thunder.jit(lambda x: (x * 2).sin(), executors=thunderplug.discover())\n"
        "f(TwoTensor(torch.randn(3), torch.randn(3)))\n"
    )
    result = subprocess.run([sys.executable, "-m", "thunderplug", "explain", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "TwoTensor.torch.mul" in result.stdout and "before autodiff" in result.stdout
    assert "aten_sin_default" in result.stdout


NON_DIFFERENTIABLE_PROGRAM = """
import torch, thunder
def fwd(ctx, x, y):
    return (x * y, x + y), (x, y)
def bwd(ctx, g0, g1, x, y):
    return g0 * y + g1, g0 * x + g1
def f(x, y):
    a, b = torch.ops.higher_order.autograd_function_apply(
        fwd, bwd, x, y, args_tensor_mask=[True, True], non_differentiable_idx=[1])
    return (a + b * 2).sum()
torch.manual_seed(0)
x, y = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
expected = torch.autograd.grad(f(x, y), (x, y))
"""


def test_non_differentiable_idx_is_honoured():
    namespace: dict = {}
    exec(NON_DIFFERENTIABLE_PROGRAM, namespace)  # noqa: S102 - the test's own program text
    f, x, y, expected = (namespace[k] for k in ("f", "x", "y", "expected"))
    actual = torch.autograd.grad(thunder.jit(f, executors=thunderplug.discover())(x, y), (x, y))
    torch.testing.assert_close(actual, expected)


def test_stock_thunder_ignores_non_differentiable_idx():
    """The reason for the patch: in a process without thunderplug the same program is wrong."""
    check = NON_DIFFERENTIABLE_PROGRAM + (
        "actual = torch.autograd.grad(thunder.jit(f)(x, y), (x, y))\n"
        "print(max((a - e).abs().max().item() for a, e in zip(actual, expected)))\n"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert float(result.stdout.split()[-1]) > 1.0
