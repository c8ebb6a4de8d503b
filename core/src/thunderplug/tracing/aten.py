"""ATen overloads as thunder symbols: id ``torch.ops.aten.<op>.<overload>``, printed as such.

Plugins supply the op knowledge (:class:`~thunderplug.plugin_api.specs.AtenOp`: a decomposition into
thunder prims/clang); this module turns it into symbols, checks every decomposition's output
metadata against torch's own meta kernels, and resolves ``torch.ops`` calls made inside
``thunder.jit`` (packet or overload form) to those symbols.

An overload no plugin registered, of any namespace (aten, prims, quantized, custom
``torch.library`` ops, ...), becomes a *fallback* symbol: its output metadata comes from the op's
own fake/meta kernel under FakeTensorMode, it runs as the op itself, and its gradient is what
torch's autograd does for the op, traced on fakes under make_fx (the mechanism of the subclass
ops). Registered decompositions stay preferred: they are fusible and visible to thunder.

Gradients follow eager PyTorch: integer and bool outputs never carry one; an op whose
floating-point output has no derivative raises :class:`NotDifferentiableError` only when a
gradient really flows into that output, naming the op and the user's line: at trace time thunder
skips the backward of outputs whose cotangent is ``None``; at run time the backward checks that
the cotangent it was given is not all zeros (what an output no loss uses receives).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.utils._pytree as torch_pytree
from thunder import clang
from thunder.core import devices, dtypes
from thunder.core.interpreter import get_interpreterruntimectx
from thunder.core.langctxs import Languages, langctx
from thunder.core.prims import OpTags
from thunder.core.proxies import TensorProxy
from thunder.core.pytree import tree_flatten, tree_map, tree_unflatten
from thunder.core.symbol import Symbol
from thunder.core.transform_common import NON_FUNCTIONAL_OPS
from thunder.core.transforms import register_augmented_forward, register_backward
from thunder.executors.pythonex import ex as pythonex
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

from thunderplug.plugin_api.specs import AtenOp
from thunderplug.tracing.compilation import current_record
from thunderplug.tracing.fake import fake_mode, hashable_or_none, to_fake, to_torch_value, value_key
from thunderplug.tracing.trace_state import factory_key, without_autocast

OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket

FALLBACK_PREFIX = "thunderplug.fallback."

_lock = threading.RLock()
_symbols: dict[OpOverload, Symbol] = {}  # one symbol per registered overload per process
_specs: dict[OpOverload, AtenOp] = {}
_fallbacks: dict[OpOverload, Symbol] = {}  # one fallback symbol per unregistered overload per process
_without_derivative: set[str] = set()  # ids of registered symbols whose ops have no derivative
_registered_ids: set[str] = set()  # ids of every registered overload's symbol


class AtenMetadataError(AssertionError):
    """A decomposition disagrees with torch's own meta kernel about an output."""


class UnsupportedAtenOpError(NotImplementedError):
    """An overload thunderplug cannot represent in a trace (the message says why)."""


class DataDependentShapeError(UnsupportedAtenOpError):
    """The overload's output shape depends on its input's values (``nonzero``, masked selection).

    Under ``discover()`` the function then runs with a graph break at the op (``wiring.graph_breaks``);
    ``op`` and ``location`` (`` (at file:line)`` of the user's call, or ``""``) say where; ``why`` and
    ``advice`` finish the graph break's warning (other reasons to break reuse the mechanism)."""

    def __init__(
        self, message: str, op: str = "", location: str = "",
        why: str = "has a data-dependent output shape, which a thunder 0.2.6 trace cannot have",
        advice: str = "For one trace, use a fixed-shape formulation (torch.where(mask, x, 0), a masked reduction) "
        "or index outside the jitted function.",
    ):  # fmt: skip
        super().__init__(message)
        self.op, self.location, self.why, self.advice = op, location, why, advice


class NotDifferentiableError(RuntimeError):
    """A gradient has to flow through an overload that has none."""


def qualified_name(overload: OpOverload) -> str:
    """``torch.ops.aten.add.Tensor``: how traces print an overload and how errors name it."""
    return f"torch.ops.{overload.namespace}.{overload._opname}.{overload._overloadname}"


# -- registered overloads ------------------------------------------------------------------------


def symbol_for(op: AtenOp) -> Symbol:
    """The thunder symbol for ``op``, created on first use."""
    with _lock:
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
            _register_without_derivative(symbol, op.qualified_name)
            _without_derivative.add(symbol.id)
        _symbols[op.overload] = symbol
        _specs[op.overload] = op
        _registered_ids.add(symbol.id)
        return symbol


def is_registered_symbol(symbol: Symbol) -> bool:
    """Whether ``symbol`` is the symbol of a registered ATen overload (the ``aten`` executor's kind)."""
    return symbol.id in _registered_ids


def recorded_symbol(overload: OpOverload) -> Symbol:
    """The symbol unrolled programs record for ``overload``: the one a plugin registered, else its
    fallback (so a kernel claim works whether or not an ATen plugin is installed)."""
    with _lock:
        symbol = _symbols.get(overload)
    return symbol if symbol is not None else fallback_symbol(overload)


_traced_outputs = threading.local()  # (overload, outputs) of the graph node being replayed in this thread


def _take_traced_outputs(overload: OpOverload) -> Any:
    """The traced outputs :meth:`AtenTable.call_traced` passes for ``overload``, taken by the call's
    own symbol before its decomposition runs (so the ATen calls inside it never see them)."""
    pending = getattr(_traced_outputs, "pending", None)
    if pending is None or pending[0] is not overload:
        return None
    _traced_outputs.pending = None
    return pending[1]


def _checked_decomposition(op: AtenOp) -> Callable[..., Any]:
    """The decomposition, checked against torch's fake kernel once per argument metadata and
    ``trace_state.factory_key`` (the same op is traced many times per compilation: interpretation,
    autodiff, re-tracing)."""
    checked: set = set()
    lock = threading.Lock()

    def meta(*args: Any, **kwargs: Any) -> Any:
        traced = _take_traced_outputs(op.overload)
        if not op.differentiable:
            _remember_location(op.qualified_name, args, kwargs)
        result = op.decomposition(*args, **kwargs)
        key = metadata_key(args, kwargs, factory_key())
        with lock:
            known = key is not None and key in checked
        if not known:
            _check_against_torch(op, args, kwargs, result, traced)
            if key is not None:
                with lock:
                    checked.add(key)
        return result

    meta.__name__ = op.qualified_name
    return meta


def metadata_key(args: tuple, kwargs: dict, state: tuple = ()) -> Any:
    """A hashable key of what an ATen call's outputs depend on (``fake.value_key`` of each
    argument, and the torch ``state`` given), or ``None`` when some value is unhashable."""
    flat, spec = tree_flatten((args, kwargs))
    return hashable_or_none(lambda: (repr(spec), tuple(value_key(x) for x in flat), state))


def kernel_meta(overload: OpOverload) -> Callable[..., Any]:
    """Output proxies of ``overload`` from its own fake kernel, cached per argument metadata: the
    meta of an executor operator that runs the overload as itself, so claiming an ATen op does not
    trace its decomposition again (also per ``trace_state.factory_key``; autocast off, as thunder
    runs it). Floating outputs require grad when an input does."""
    cache: dict[Any, Any] = {}
    lock = threading.Lock()

    def meta(*args: Any, **kwargs: Any) -> Any:
        key = metadata_key(args, kwargs, factory_key())
        with lock:
            described = cache.get(key) if key is not None else None
        if described is None:
            with fake_mode(), without_autocast():
                result = overload(*to_fake(args), **to_fake(kwargs))
            grad = any(isinstance(x, TensorProxy) and x.requires_grad for x in tree_flatten((args, kwargs))[0])
            described = torch_pytree.tree_map(lambda value: _described(value, grad), result)
            if key is not None:
                with lock:
                    cache[key] = described
        return torch_pytree.tree_map(_from_description, described)

    meta.__name__ = f"{qualified_name(overload)}.meta"
    return meta


def _described(value: Any, grad: bool) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    inexact = value.dtype.is_floating_point or value.dtype.is_complex
    return _TensorDescription(tuple(value.shape), value.dtype, value.device, grad and inexact)


class _TensorDescription:
    """Shape, dtype, device and requires_grad of one fake output (a pytree leaf)."""

    __slots__ = ("shape", "dtype", "device", "requires_grad")

    def __init__(self, shape: tuple, dtype: torch.dtype, device: torch.device, requires_grad: bool):
        self.shape, self.dtype, self.device, self.requires_grad = shape, dtype, device, requires_grad


def _from_description(value: Any) -> Any:
    if not isinstance(value, _TensorDescription):
        return value
    return TensorProxy(
        shape=value.shape,
        dtype=dtypes.to_dtype(value.dtype),
        device=devices.to_device(value.device),
        requires_grad=value.requires_grad,
    )


def _check_against_torch(op: AtenOp, args: tuple, kwargs: dict, result: Any, expected: Any = None) -> None:
    """``expected``: torch's outputs for these arguments when known (a traced graph's node values),
    else computed by the op's fake kernel."""
    if expected is None:
        with fake_mode(), without_autocast():
            expected = op.overload(*to_fake(args), **to_fake(kwargs))
    got_leaves = [x for x in tree_flatten(result)[0] if isinstance(x, TensorProxy)]
    want_leaves = [x for x in tree_flatten(expected)[0] if isinstance(x, torch.Tensor)]
    if len(got_leaves) != len(want_leaves):
        raise AtenMetadataError(
            f"{op.qualified_name}: decomposition returned {len(got_leaves)} tensors, torch returns {len(want_leaves)}"
        )
    for index, (got, want) in enumerate(zip(got_leaves, want_leaves)):
        got_meta = (tuple(_size_expr(d) for d in got.shape), dtypes.to_torch_dtype(got.dtype))
        want_meta = (tuple(_size_expr(d) for d in want.shape), want.dtype)
        same_sizes = len(got.shape) == len(want.shape) and all(map(_same_size, got.shape, want.shape))
        if not same_sizes or got_meta[1] != want_meta[1]:
            raise AtenMetadataError(
                f"{op.qualified_name}: output {index} of the decomposition is {got_meta}, torch's meta says {want_meta}"
            )


def _same_size(got: Any, want: Any) -> bool:
    """Whether two sizes agree without recording a guard: symbolic ones by their expressions; one symbolic and one
    plain (a tracked size against torch's fake kernel run on fakes of concrete sizes) by the symbolic one's value
    at this call."""
    got_expr, want_expr = _size_expr(got), _size_expr(want)
    if isinstance(got_expr, int) == isinstance(want_expr, int):
        return got_expr == want_expr
    return _value(got) == _value(want)


def _value(size: Any) -> int:
    """A size's value at this call: a tracked size's own int value, a SymInt's hint."""
    if isinstance(size, torch.SymInt):
        return size.node.hint
    return int.__int__(size) if isinstance(size, int) else size


def _size_expr(size: Any) -> Any:
    """A size as what it stands for: a symbolic size (torch's SymInt, or a tracked size of
    ``caching.dynamic_sizes``, an int carrying one as ``sym``) as its expression, so that comparing
    sizes records no guard; a plain int as itself."""
    sym = getattr(size, "sym", size)
    return sym.node.expr if isinstance(sym, torch.SymInt) else size


def _register_without_derivative(symbol: Symbol, name: str) -> None:
    """Eager semantics for an op without derivative: inputs may require grad; integer and bool
    outputs take no gradient; a gradient arriving at a floating-point output is an error."""

    def augmented_forward(*args: Any, **kwargs: Any) -> tuple[Any, tuple]:
        result = symbol(*args, **kwargs)
        return result, (_recorded_location(name, args, kwargs), _inexact_leaves(result), len(args))

    def backward(location: str, inexact: tuple[bool, ...], nargs: int, *cotangents: Any) -> tuple:
        message = (
            f"{name} has no derivative, but a gradient flows into its floating-point output{location}. "
            "Detach its inputs or that output, or differentiate the operation that calls it (for a tensor "
            "subclass, the outer torch op)."
        )
        for cotangent, flag in zip(cotangents, inexact):
            if cotangent is not None and flag:
                refuse_gradient(cotangent, message)
        return (None,) * nargs

    register_augmented_forward(symbol.id)(augmented_forward)
    register_backward(symbol.id)(backward)


def _refuse_gradient(cotangent: torch.Tensor, message: str) -> None:
    """Eager raises when its backward reaches an op without derivative, not when the forward ran;
    thunder builds the backward with the forward, so the check waits until the backward runs (an
    all-zero cotangent is what an output that no loss uses receives)."""
    if bool(cotangent.ne(0).any()):
        raise NotDifferentiableError(message)


refuse_gradient = pythonex.register_operator(
    "refuse_gradient", meta=lambda cotangent, message: None, fn=_refuse_gradient, tags=(OpTags.DONT_DCE,)
)


def _inexact_leaves(result: Any) -> tuple[bool, ...]:
    """Per tensor output (thunder passes one cotangent each, in this order): may it carry a gradient?"""
    return tuple(dtypes.is_inexact_dtype(x.dtype) for x in tree_flatten(result)[0] if isinstance(x, TensorProxy))


# -- where in the user's code an op was called (for errors raised later, in autodiff) ---------------


def user_location() -> str:
    """`` (at file:line)`` of the user's code being interpreted, or ``""`` outside the interpreter."""
    try:
        filename, positions = get_interpreterruntimectx().get_current_user_source_location()
    except Exception:  # noqa: BLE001 - outside the interpreter there is no user location
        return ""
    if filename is None or positions is None:
        return ""
    return f" (at {filename}:{positions.lineno})"


def _call_key(name: str, args: tuple, kwargs: dict) -> tuple[str, tuple]:
    """An op call by its name and its tensors' metadata: proxy names change between the
    interpreted program and the trace autodiff sees, metadata does not."""
    tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, TensorProxy)]
    return (name, tuple((tuple(_size_expr(d) for d in x.shape), str(x.dtype)) for x in tensors))


def _remember_location(name: str, args: tuple, kwargs: dict) -> None:
    record = current_record()
    location = user_location() if record is not None else ""
    if location:
        key = _call_key(name, args, kwargs)
        known = record.source_locations.get(key, "")
        if location not in known:  # two calls that look alike: name both lines
            record.source_locations[key] = f"{known[:-1]} or{location[4:]}" if known else location


def note_call(symbol: Symbol, args: tuple, kwargs: dict) -> None:
    """What calling ``symbol`` records in the compilation in progress (that a fallback ran; the user's
    line of an op without derivative), for a call replayed from bound symbols recorded earlier
    instead of run through the symbol's meta."""
    if is_fallback(symbol):
        name = symbol.id[len(FALLBACK_PREFIX) :]
        record = current_record()
        if record is not None:
            record.fallbacks.add(name)
        _remember_location(name, args, kwargs)
    elif symbol.id in _without_derivative:
        _remember_location(str(symbol.id), args, kwargs)


def records_calls(symbol: Symbol) -> bool:
    """Whether calling ``symbol`` records something in the compilation (see :func:`note_call`)."""
    return is_fallback(symbol) or symbol.id in _without_derivative


def _recorded_location(name: str, args: tuple, kwargs: dict) -> str:
    record = current_record()
    return record.source_locations.get(_call_key(name, args, kwargs), "") if record is not None else ""


# -- errors -----------------------------------------------------------------------------------------


def data_dependent(name: str, how: str = "", refusal: str = "") -> DataDependentShapeError:
    """The error for op ``name`` (called as ``how``, e.g. ``x[mask]``) whose output shape depends on values;
    ``refusal``, thunder's own message where thunder refused the call, is kept in it (where the error stands,
    it still says what thunder says)."""
    location = user_location()
    return DataDependentShapeError(
        (f"{refusal}: " if refusal else "")
        + f"{name}{how} has a data-dependent output shape (its size depends on the input's values){location}: "
        "thunder 0.2.6 traces have static shapes, so it cannot be part of a jitted function. Compute it outside "
        "the jitted function and pass the result in, or use a fixed-shape formulation (a boolean mask with "
        "torch.where, or a masked reduction).",
        op=f"{name}{how}",
        location=location,
    )


# -- fallback symbols for overloads no plugin registered ----------------------------------------------


def is_fallback(symbol: Symbol) -> bool:
    """Whether ``symbol`` is the generic fallback of an overload no plugin registered."""
    return isinstance(symbol.id, str) and symbol.id.startswith(FALLBACK_PREFIX)


def fallback_symbol(overload: OpOverload) -> Symbol:
    """The fallback symbol of ``overload``, created once per process (it holds no compilation state)."""
    with _lock:
        symbol = _fallbacks.get(overload)
        if symbol is None:
            symbol = _fallbacks[overload] = _new_fallback(overload)
        return symbol


def _new_fallback(overload: OpOverload) -> Symbol:
    name = qualified_name(overload)
    random = torch.Tag.nondeterministic_seeded in overload.tags
    symbol = Symbol(
        name=f"{overload._opname}.{overload._overloadname}",
        meta=_fallback_meta(overload, name),
        id=FALLBACK_PREFIX + name,
        is_prim=True,  # opaque: no decomposition (thunder drops composite symbols without subsymbols)
        _module=getattr(torch.ops, overload.namespace),  # prints as torch.ops.<namespace>.<op>.<overload>
        tags=(OpTags.RANDOM_OP, OpTags.DONT_RECOMPUTE_IN_BACKWARD) if random else (),
    )
    if random:  # every call draws new numbers: never merge two calls (thunder's CSE)
        NON_FUNCTIONAL_OPS.add(symbol.id)
    identifier = "".join(c if c.isalnum() else "_" for c in f"{overload.namespace}_{symbol.name}")
    run = pythonex.register_operator(f"fallback_{identifier}", like=symbol, fn=runner(overload))
    pythonex.register_implementation(symbol, run)
    _register_torch_autograd(symbol, overload, name)
    return symbol


def _fallback_meta(overload: OpOverload, name: str) -> Callable[..., Any]:
    mutated = [a.name for a in overload._schema.arguments if a.alias_info is not None and a.alias_info.is_write]

    def meta(*args: Any, **kwargs: Any) -> Any:
        if mutated:
            raise UnsupportedAtenOpError(
                f"{name} writes to its argument(s) {', '.join(mutated)} in place{user_location()}; thunderplug "
                "traces are functional and no plugin registers a functional decomposition for it. Call its "
                "out-of-place variant, or register an AtenOp for it."
            )
        record = current_record()
        if record is not None:
            record.fallbacks.add(name)
        _remember_location(name, args, kwargs)
        fakes_args, fakes_kwargs = to_fake(args), to_fake(kwargs)
        for fake in tree_flatten((fakes_args, fakes_kwargs))[0]:
            if isinstance(fake, torch.Tensor) and (fake.dtype.is_floating_point or fake.dtype.is_complex):
                fake.requires_grad_(True)  # as the VJP does: torch says which outputs carry a gradient
        try:
            with fake_mode(), torch.enable_grad(), without_autocast():
                result = overload(*fakes_args, **fakes_kwargs)
        except (DynamicOutputShapeException, DataDependentOutputException) as error:
            raise data_dependent(name) from error
        except Exception as error:
            raise UnsupportedAtenOpError(
                f"{name} has no plugin decomposition, and its fake (meta) kernel failed{user_location()}: "
                f"{type(error).__name__}: {error}. For a custom op, register one with torch.library.register_fake."
            ) from error
        return tree_map(_proxy_of, result)

    meta.__name__ = name
    return meta


def _proxy_of(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return TensorProxy(
            shape=tuple(value.shape),
            device=devices.to_device(value.device),
            dtype=dtypes.to_dtype(value.dtype),
            requires_grad=value.requires_grad,
        )
    return value


def runner(overload: OpOverload) -> Callable[..., Any]:
    """The overload itself, or (when it takes a dtype or device, which traces hold as thunder
    objects) a wrapper turning those back into torch's: what executes an ATen symbol."""
    if not any(t in str(arg.type) for arg in overload._schema.arguments for t in ("ScalarType", "Device")):
        return overload

    def run(*args: Any, **kwargs: Any) -> Any:
        # ATen schemas take a dtype or device only as a whole argument (never inside a list), so the top
        # level is converted; no pytree walk, which also keeps the call traceable by Dynamo (regions)
        return overload(*map(to_torch_value, args), **{name: to_torch_value(v) for name, v in kwargs.items()})

    return run


def _register_torch_autograd(symbol: Symbol, overload: OpOverload, name: str) -> None:
    """The fallback's gradient is torch's autograd of ``overload``: the table's ``backward_symbol``,
    ``torch.autograd.grad`` of the op unrolled on fakes, as for subclass ops. Without a torch derivative,
    a gradient flowing into the op is a :class:`NotDifferentiableError` when the backward runs."""

    def augmented_forward(*args: Any, **kwargs: Any) -> tuple[Any, tuple]:
        result = symbol(*args, **kwargs)
        tensors = [x for x in tree_flatten(result)[0] if isinstance(x, TensorProxy)]  # one cotangent each
        carries = tuple(x.requires_grad for x in tensors)
        like = tuple((tuple(x.shape), x.device, x.dtype) for x in tensors)
        return result, (args, kwargs, _recorded_location(name, args, kwargs), carries, like)

    def backward(args: tuple, kwargs: dict, location: str, carries: tuple, like: tuple, *cotangents: Any) -> tuple:
        if not any(c is not None and flag for c, flag in zip(cotangents, carries)):
            return (None,) * len(args)
        flowing = [
            c if c is not None else clang.full(shape, 0, device=device, dtype=dtype)
            for c, flag, (shape, device, dtype) in ((c, f, m) for c, f, m in zip(cotangents, carries, like) if f)
        ]
        table = active_table()
        build = table.backward_symbol if table is not None else None
        problem = _derivative_problem(overload, args, kwargs) if build is not None else "no thunderplug core executor"
        if problem is not None:
            message = (
                f"{name}: a gradient flows into its output{location}, but torch's autograd has no derivative "
                f"for it ({problem}). Detach its inputs or that output."
            )
            for cotangent in flowing:
                refuse_gradient(cotangent, message)
            return (None,) * len(args)
        grads = iter(build(name, overload)(args, kwargs, flowing))
        # vjp gives one gradient per tensor of (args, kwargs); thunder wants one per positional arg
        return tuple(_grads_like(arg, grads) for arg in args)

    register_augmented_forward(symbol.id)(augmented_forward)
    register_backward(symbol.id)(backward)


def _derivative_problem(overload: OpOverload, args: tuple, kwargs: dict) -> str | None:
    """Why torch's autograd cannot differentiate ``overload`` here (asked on fakes), or ``None``."""
    fake_args, fake_kwargs = to_fake(args), to_fake(kwargs)
    inputs = [
        t for t in tree_flatten((fake_args, fake_kwargs))[0] if isinstance(t, torch.Tensor) and t.is_floating_point()
    ]
    try:
        with fake_mode(), torch.enable_grad(), without_autocast():
            for t in inputs:
                t.requires_grad_(True)
            outputs = [
                o
                for o in tree_flatten(overload(*fake_args, **fake_kwargs))[0]
                if isinstance(o, torch.Tensor) and o.requires_grad
            ]
            torch.autograd.grad(outputs, inputs, [torch.ones_like(o) for o in outputs], allow_unused=True)
    except Exception as error:  # noqa: BLE001 - torch's own words are the reason
        return f"{type(error).__name__}: {error}"
    return None


def _grads_like(arg: Any, grads: Any) -> Any:
    """The gradients of the tensors in ``arg`` (a tensor, a list of them, or a constant)."""
    leaves, spec = tree_flatten(arg)
    if not any(isinstance(x, TensorProxy) for x in leaves):
        return None
    return tree_unflatten([next(grads) if isinstance(x, TensorProxy) else None for x in leaves], spec)


# -- resolving calls ------------------------------------------------------------------------------------


def resolve_packet(packet: OpOverloadPacket, args: tuple, kwargs: dict) -> OpOverload:
    """The overload eager PyTorch would pick for these arguments (schema matching on fakes)."""
    with fake_mode():
        overload_name = torch._C._jit_resolve_packet(packet._qualified_op_name, *to_fake(args), **to_fake(kwargs))
    return getattr(packet, overload_name or "default")


def active_table() -> AtenTable | None:
    """The ATen table of the ``discover()`` list the compilation in progress uses, if any."""
    from thunder.core.compile_data import get_compile_data

    compile_data = get_compile_data()
    for executor in compile_data.executors_list if compile_data is not None else ():
        table = getattr(executor, "aten", None)
        if isinstance(table, AtenTable):
            return table
    return None


#: ``(display name, overload) -> symbol`` taking ``(args, kwargs, cotangents)``, returning one gradient
#: (or None) per tensor of ``(args, kwargs)``
BackwardSymbol = Callable[[str, OpOverload], Symbol]


class AtenTable:
    """The ATen overloads active in one ``discover()`` result, and how calls to them resolve:
    registered overloads to their plugin's symbol, every other overload to its fallback symbol."""

    def __init__(self, ops: Iterable[AtenOp], *, backward_symbol: BackwardSymbol | None = None):
        #: builds the backward symbol of a fallback op from torch's autograd of the op (the subclass
        #: package's VJP unrolling, passed in by the executor that owns this table: it imports this module)
        self.backward_symbol = backward_symbol
        self.symbols: dict[OpOverload, Symbol] = {op.overload: symbol_for(op) for op in ops}
        self._registered_by_id = {symbol.id: overload for overload, symbol in self.symbols.items()}
        self.overloads_by_id: dict[str, OpOverload] = dict(self._registered_by_id)  # fallbacks join on first use

    def registered_overload(self, symbol: Symbol) -> OpOverload | None:
        """The overload ``symbol`` stands for, if a plugin of this table registered it."""
        return self._registered_by_id.get(symbol.id)

    @functools.cached_property
    def decompositions(self) -> dict:
        """torch's own decompositions to core ATen for the ops not in this table (e.g. the backward
        kernels autograd emits, ``threshold_backward``), for ``make_fx``; registered ops stay whole.

        torch's post-autograd table without its CompositeImplicitAutograd ops: ``make_fx`` decomposes
        those itself, with their own kernel, as eager runs them (``proxy_call``'s ``func.decompose``).
        That is what ``core_aten_decompositions()``'s extra entries for them do too, but reading that
        table first collects every such op of every namespace: 0.07 s of each process's first trace."""
        from torch._decomp import _core_aten_decompositions_post_autograd

        table = _core_aten_decompositions_post_autograd()
        return {op: fn for op, fn in table.items() if op not in self.symbols and not op._can_decompose()}

    def has_effects(self, bsym: Any) -> bool:
        """Whether a bound symbol must not be merged, moved or removed: random, mutating or
        communicating ATen overloads (by their schema and tags), other symbols tagged DONT_DCE."""
        overload = self.overloads_by_id.get(bsym.sym.id)
        if overload is None:
            return OpTags.DONT_DCE in (bsym.sym.tags or ())
        return (
            torch.Tag.nondeterministic_seeded in overload.tags
            or overload._schema.is_mutable
            or overload.namespace in ("_c10d_functional", "c10d", "profiler")
        )

    def symbol(self, overload: OpOverload) -> Symbol:
        """The registered symbol of ``overload``, else its fallback."""
        symbol = self.symbols.get(overload)
        if symbol is None:
            symbol = fallback_symbol(overload)
            self.overloads_by_id.setdefault(symbol.id, overload)
        return symbol

    def call(self, overload: OpOverload, *args: Any, **kwargs: Any) -> Any:
        return self.symbol(overload)(*args, **kwargs)

    def call_traced(self, overload: OpOverload, traced_outputs: Any, *args: Any, **kwargs: Any) -> Any:
        """:meth:`call` for a node of a graph torch traced (``make_fx``), whose output values
        ``traced_outputs`` (fakes) are what torch's fake kernel gives for these arguments: a
        registered decomposition is checked against them instead of running that kernel again."""
        _traced_outputs.pending = (overload, traced_outputs)
        try:
            return self.symbol(overload)(*args, **kwargs)
        finally:
            _traced_outputs.pending = None

    def call_packet(self, packet: OpOverloadPacket, *args: Any, **kwargs: Any) -> Any:
        return self.call(resolve_packet(packet, args, kwargs), *args, **kwargs)

    def lookasides(self) -> dict[Any, Callable[..., Any]]:
        """Interpretation-time lookasides: every registered overload and packet, plus catch-alls for
        ``OpOverload.__call__``/``OpOverloadPacket.__call__`` (the other overloads, as fallbacks)."""
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
