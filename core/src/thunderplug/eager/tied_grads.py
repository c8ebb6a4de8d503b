"""The gradient of a tensor passed as several inputs (tied weights), summed in eager's order.

Why: a module whose parameters are one tensor under several names (T5's ``shared``, ``encoder.embed_tokens``,
``decoder.embed_tokens`` and ``lm_head`` weights) reaches thunder's autograd Function as that tensor at several
input positions, and the Function's backward returns one gradient per position. torch's engine then sums them
for the tensor in the order of those positions (the flat arguments' order, by name), where eager sums the
gradient of each use in the order its backward computes them: the last use first (T5: the LM head, then the
decoder's embedding, then the encoder's). Float addition does not associate: T5's ``shared.weight`` gradient
differed from eager's by 1.9e-9 at the first step, 5.7e-7 after three AdamW steps.

How: thunder's Function ``forward`` (patched for ``output_grads``) calls :func:`sum_tied_in_backward`; where
its inputs hold one tensor at several positions, the backward it runs sums that tensor's gradients in the order
the backward program computes them (its statements' order, read from the program thunder generated: a reverse
topological order, as eager's engine runs), returns the sum at the first of them and ``None`` at the others
(one gradient reaching the tensor, as eager's one sum does). Where the program's source cannot be read, the
positions' order stays, as before.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

#: the backward program -> for each returned position, the index of the statement that first assigns it
_RANKS: weakref.WeakKeyDictionary[Callable[..., Any], tuple[int, ...] | None] = weakref.WeakKeyDictionary()


def tied_positions(flat_args: Sequence[Any]) -> list[list[int]]:
    """Groups of two or more positions of ``flat_args`` holding the same tensor that requires grad."""
    groups: dict[int, list[int]] = {}
    for i, a in enumerate(flat_args):
        if isinstance(a, torch.Tensor) and a.requires_grad:
            groups.setdefault(id(a), []).append(i)
    return [g for g in groups.values() if len(g) > 1]


def _ranks(backward: Callable[..., Any]) -> tuple[int, ...] | None:
    """For each value the backward program returns, where the program computes it (its first assignment's
    statement index; the program's inputs and constants rank first); ``None`` if unreadable."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(backward)))
    except (OSError, TypeError, SyntaxError):
        return None
    function = tree.body[0] if tree.body and isinstance(tree.body[0], ast.FunctionDef) else None
    if function is None or not function.body or not isinstance(function.body[-1], ast.Return):
        return None
    returned = function.body[-1].value
    if not isinstance(returned, ast.Tuple):
        return None
    assigned: dict[str, int] = {}
    for index, statement in enumerate(function.body):
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                assigned.setdefault(node.id, index)
    return tuple(assigned.get(e.id, -1) if isinstance(e, ast.Name) else -1 for e in returned.elts)


def sum_tied_in_backward(backward: Callable[..., Any], groups: list[list[int]]) -> Callable[..., Any]:
    """``backward`` (thunder's compiled backward: its gradients by input position) with each group's gradients
    summed in the order the program computes them, at the group's first position."""
    if backward not in _RANKS:
        _RANKS[backward] = _ranks(backward)
    ranks = _RANKS[backward]

    def run(*args: Any) -> Any:
        grads = list(backward(*args))
        if ranks is None or len(ranks) != len(grads):
            return grads
        for group in groups:
            present = sorted((i for i in group if grads[i] is not None), key=lambda i: ranks[i])
            if len(present) < 2:
                continue
            total = grads[present[0]]
            for i in present[1:]:
                total = total + grads[i]
            for i in group:
                grads[i] = None
            grads[group[0]] = total
        return grads

    return run
