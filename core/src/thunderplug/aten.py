"""ATen overloads as thunder symbols: id ``torch.ops.aten.<op>.<overload>``, printed as such.

Plugins supply the op knowledge (:class:`~thunderplug.specs.AtenOp`: a decomposition into
thunder prims/clang); this module turns it into symbols, checks every decomposition's output
metadata against torch's own meta kernels, and resolves ``torch.ops.aten`` calls made inside
``thunder.jit`` (packet or overload form) to those symbols.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from thunder.core import dtypes
from thunder.core.interpreter import get_interpreterruntimectx
from thunder.core.langctxs import Languages, langctx
from thunder.core.proxies import TensorProxy
from thunder.core.pytree import tree_flatten
from thunder.core.symbol import Symbol
from thunder.core.transforms import register_grad

from thunderplug.fake import fake_mode, to_fake
from thunderplug.specs import AtenOp

OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket

_symbols: dict[OpOverload, Symbol] = {}  # one symbol per overload per process
_specs: dict[OpOverload, AtenOp] = {}


class AtenMetadataError(AssertionError):
    """A decomposition disagrees with torch's own meta kernel about an output."""


class UnsupportedAtenOpError(NotImplementedError):
    """No active plugin registers this ATen overload."""


class NotDifferentiableError(RuntimeError):
    """A gradient was requested through an ATen overload that has none."""


def symbol_for(op: AtenOp) -> Symbol:
    """The thunder symbol for ``op``, created on first use."""
    existing = _specs.get(op.overload)
    if existing is op or (existing is not None and existing.decomposition is op.decomposition):
        return _symbols[op.overload]
    symbol = Symbol(
        name=f"{op.overload._opname}.{op.overload._overloadname}",
        meta=langctx(Languages.TORCH)(_checked_decomposition(op)),
        id=op.qualified_name,
        _module=torch.ops.aten,  # prints (and, if ever run as Python, runs) as torch.ops.aten.<op>.<overload>
    )
    if not op.differentiable:
        register_grad(symbol.id, _refuse_gradient(op))
    _symbols[op.overload] = symbol
    _specs[op.overload] = op
    return symbol


def registered_symbol(overload: OpOverload) -> Symbol:
    """The symbol of an overload some plugin registered (for executors that claim it)."""
    if overload not in _symbols:
        raise _unsupported(f"torch.ops.{overload.namespace}.{overload._opname}.{overload._overloadname}")
    return _symbols[overload]


def _checked_decomposition(op: AtenOp) -> Callable[..., Any]:
    def meta(*args: Any, **kwargs: Any) -> Any:
        result = op.decomposition(*args, **kwargs)
        _check_against_torch(op, args, kwargs, result)
        return result

    meta.__name__ = op.qualified_name
    return meta


def _check_against_torch(op: AtenOp, args: tuple, kwargs: dict, result: Any) -> None:
    with fake_mode():
        expected = op.overload(*to_fake(args), **to_fake(kwargs))
    got_leaves = [x for x in tree_flatten(result)[0] if isinstance(x, TensorProxy)]
    want_leaves = [x for x in tree_flatten(expected)[0] if isinstance(x, torch.Tensor)]
    if len(got_leaves) != len(want_leaves):
        raise AtenMetadataError(
            f"{op.qualified_name}: decomposition returned {len(got_leaves)} tensors, torch returns {len(want_leaves)}"
        )
    for index, (got, want) in enumerate(zip(got_leaves, want_leaves)):
        got_meta = (tuple(got.shape), dtypes.to_torch_dtype(got.dtype))
        want_meta = (tuple(want.shape), want.dtype)
        if got_meta != want_meta:
            raise AtenMetadataError(
                f"{op.qualified_name}: output {index} of the decomposition is {got_meta}, torch's meta says {want_meta}"
            )


def _refuse_gradient(op: AtenOp) -> Callable[..., Any]:
    def grad_rule(*args: Any, **kwargs: Any) -> Any:
        raise NotDifferentiableError(
            f"{op.qualified_name} has no gradient, but one was requested through it{user_location()}. "
            "Detach its inputs, or differentiate the operation that calls it (for a tensor subclass, "
            "the outer torch op)."
        )

    return grad_rule


def user_location() -> str:
    try:
        filename, positions = get_interpreterruntimectx().get_current_user_source_location()
    except Exception:  # noqa: BLE001 - outside the interpreter there is no user location
        return ""
    if filename is None or positions is None:
        return ""
    return f" (at {filename}:{positions.lineno})"


def _unsupported(qualified_name: str) -> UnsupportedAtenOpError:
    return UnsupportedAtenOpError(
        f"{qualified_name} is not supported by any active thunderplug plugin{user_location()}. "
        "Install or enable a plugin that registers it (`thunderplug plugins` lists them), or add it "
        "from your own plugin: implement the `register_aten_ops` hook and call "
        f"register(AtenOp({qualified_name}, decomposition)); see docs/hooks.md."
    )


def resolve_packet(packet: OpOverloadPacket, args: tuple, kwargs: dict) -> OpOverload:
    """The overload eager PyTorch would pick for these arguments (schema matching on fakes)."""
    with fake_mode():
        overload_name = torch._C._jit_resolve_packet(packet._qualified_op_name, *to_fake(args), **to_fake(kwargs))
    return getattr(packet, overload_name or "default")


class AtenTable:
    """The ATen overloads active in one ``discover()`` result, and how calls to them resolve."""

    def __init__(self, ops: Iterable[AtenOp]):
        self.symbols: dict[OpOverload, Symbol] = {op.overload: symbol_for(op) for op in ops}
        self.overloads_by_id: dict[str, OpOverload] = {symbol.id: overload for overload, symbol in self.symbols.items()}

    @functools.cached_property
    def decompositions(self) -> dict:
        """torch's own decompositions to core ATen for the ops not in this table (e.g. the backward
        kernels autograd emits, ``threshold_backward``), for ``make_fx``; registered ops stay whole."""
        from torch._decomp import core_aten_decompositions

        return {op: fn for op, fn in core_aten_decompositions().items() if op not in self.symbols}

    def call(self, overload: OpOverload, *args: Any, **kwargs: Any) -> Any:
        symbol = self.symbols.get(overload)
        if symbol is None:
            raise _unsupported(f"torch.ops.{overload.namespace}.{overload._opname}.{overload._overloadname}")
        return symbol(*args, **kwargs)

    def call_packet(self, packet: OpOverloadPacket, *args: Any, **kwargs: Any) -> Any:
        return self.call(resolve_packet(packet, args, kwargs), *args, **kwargs)

    def lookasides(self) -> dict[Any, Callable[..., Any]]:
        """Interpretation-time lookasides: every registered overload and packet, plus catch-alls
        for ``OpOverload.__call__``/``OpOverloadPacket.__call__`` that give a clear error for
        overloads no plugin registers."""
        result: dict[Any, Callable[..., Any]] = {
            OpOverload.__call__: _as_lookaside(self.call),
            OpOverloadPacket.__call__: _as_lookaside(self.call_packet),
        }
        for overload, symbol in self.symbols.items():
            packet = overload.overloadpacket
            result[overload] = _as_lookaside(symbol)
            result[packet] = _as_lookaside(functools.partial(self.call_packet, packet))
        return result


def _as_lookaside(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Record the user's source line in the trace, as thunder's own torch lookasides do.

    ``thunder.jit`` itself wraps executor lookasides with ``interpreter_needs_wrap``.
    """
    from thunder.core.jit_ext import record_source_loc_in_symbol_header

    return record_source_loc_in_symbol_header(fn)
