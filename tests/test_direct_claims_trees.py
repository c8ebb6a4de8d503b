"""The "claims bound directly" speedup gives the bound symbols thunder's claiming pass gives, at every
depth of the subsymbol trees and with the same argument values and types (issue 23: thunder's own
tests read both: `test_matmul_nd_times_2d_runs_2d_gemm` walks the claimed matmul's subsymbols,
`test_core_vs_torch_consistency_max_pool*d` runs code that prints a `torch.Size` argument)."""

from __future__ import annotations

import pytest
import thunder
import torch
from thunder.core.proxies import Proxy, TensorProxy
from thunder.core.pytree import tree_flatten_with_dataclass

import thunderplug
from thunderplug.wiring import patches


def _leaf(value):
    if isinstance(value, TensorProxy):
        return ("tensor", tuple(value.shape), str(value.dtype))
    if isinstance(value, Proxy):
        return (type(value).__name__,)
    return (type(value).__name__, repr(value))


def _tree(bsym, top: bool = True) -> tuple:
    """A bound symbol as what thunder's tests and its code generation read: symbol, executor, argument
    values (and, for the bound symbols the generated code calls, their container types), outputs,
    and the same of every subsymbol; proxy names left out (the two passes name new proxies
    differently). Subsymbols of a claimed op are never run, only printed as comments."""
    args = (bsym.args, bsym.kwargs)
    containers: list[str] = []

    def walk(value):
        if isinstance(value, (tuple, list, dict)):
            containers.append(type(value).__name__)
            for item in value.values() if isinstance(value, dict) else value:
                walk(item)

    if top:
        walk(args)
    flat, _ = tree_flatten_with_dataclass(args)
    outputs, _ = tree_flatten_with_dataclass(bsym.output)
    return (
        bsym.sym.id,
        bsym.sym.executor.name if bsym.sym.executor else None,
        tuple(containers),
        tuple(_leaf(a) for a in flat),
        tuple(_leaf(o) for o in outputs),
        tuple(_tree(sub, top=False) for sub in bsym.subsymbols),
    )


def _compiled_trees(fn, args):
    jitted = thunder.jit(fn, executors=thunderplug.discover(quiet=True))
    result = jitted(*args)
    traces = [thunder.last_traces(jitted)[-1]]
    if any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        traces.append(thunder.last_backward_traces(jitted)[-1])
    return result, [[_tree(b) for b in trace.bound_symbols] for trace in traces]


def _with_thunders_own_pass(fn, args):
    patch = next(p for p in patches.PATCHES if p.name == "claims bound directly")
    replacement = patch.read()
    patch.write(patches._originals[patch.name][0])
    try:
        return _compiled_trees(fn, args)
    finally:
        patch.write(replacement)


def _matmul_nd_times_2d(x, w):
    return x @ w


def _max_pool_sized(x, kernel_size):
    return torch.nn.functional.max_pool2d(x, kernel_size)


def _mixed(x, w):
    return torch.nn.functional.gelu(x @ w).sum(dim=0, dtype=torch.float64)


CASES = {
    "matmul nd x 2d": (_matmul_nd_times_2d, lambda: (torch.randn(2, 3, 4), torch.randn(4, 5))),
    "max_pool with a torch.Size": (_max_pool_sized, lambda: (torch.randn(1, 2, 6, 6), torch.Size([2, 3]))),
    "gelu, sum with a dtype": (_mixed, lambda: (torch.randn(3, 4), torch.randn(4, 5))),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_direct_claims_give_thunders_trees_and_eagers_values(case, grad):
    fn, make_args = CASES[case]
    thunderplug.discover(quiet=True)  # installs the patches
    torch.manual_seed(0)
    args = make_args()
    if grad:
        args = tuple(a.requires_grad_() if isinstance(a, torch.Tensor) else a for a in args)
    expected = fn(*args)
    result, trees = _compiled_trees(fn, args)
    torch.testing.assert_close(result, expected)
    if grad:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        cotangent = torch.randn_like(expected)
        for got, want in zip(
            torch.autograd.grad(result, tensors, cotangent), torch.autograd.grad(expected, tensors, cotangent)
        ):
            torch.testing.assert_close(got, want)
    _, thunders = _with_thunders_own_pass(fn, args)
    assert trees == thunders
