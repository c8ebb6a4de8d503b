"""Symbolic input dimensions: one compilation serves every size its guards allow (issue 44).

thunder 0.2.6 traces static shapes, so every new sequence length or batch size is a full compilation.
Here, as torch.compile's automatic dynamic does, a dimension of an input tensor that has been compiled
for two sizes (or that ``torch._dynamo.mark_dynamic`` marked) is *tracked* in the next compilation: its
proxy's size is a :class:`SizeInt`, an ``int`` whose value is the actual size (the hint) and which carries
a ``torch.SymInt`` of a per-compilation ``ShapeEnv``. Arithmetic on it stays a SizeInt; a comparison
returns the hint's answer and records the relation as a guard; anything that leaves the tracked world
(``int()``, ``float()``, ``range()``, ``str()``/``hash()`` in the user's program, true division, an
unknown operand) records a *specialization* (symbol == hint): the trace is then static in that symbol.

The compilation's entry is kept as a template: its final prologue, computation, backward and epilogue
traces still hold the SizeInts. On a cache miss whose new sizes satisfy a template's guards, a concrete
entry is made from the template without running the user's program again: every SizeInt is replaced
by its expression's value for the new sizes (in bound symbols' arguments, nested subsymbols and
proxies' shapes), the callables are generated again, and the entry is appended to thunder's cache
(:func:`respecialize`), whose own exact shape checks then select it. A template whose traces hold a
fusion region (its compiled callable was made for one shape) is never re-specialized.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
from torch.utils._pytree import tree_flatten

from thunderplug.plugin_api.notices import RecompileWarning, warn_once
from thunderplug.thunder_compat import interpret_call
from thunderplug.tracing.aten import user_location


class Respecialized(Exception):  # noqa: N818 - a signal, not an error
    """Raised through thunder's cache lookup once a concrete entry for the call was appended to its cache."""


# -- the per-compilation state ----------------------------------------------------------------------


@dataclass
class Symbolic:
    """One tracked compilation: its ShapeEnv, symbols (with the inputs they are read from), guards."""

    env: ShapeEnv
    hints: dict[sympy.Symbol, int] = field(default_factory=dict)
    sources: dict[sympy.Symbol, list[tuple[str, int]]] = field(default_factory=dict)  # (input, dim): _inputs
    by_tensor: dict[int, dict[int, SizeInt]] = field(default_factory=dict)  # id(tensor) -> dim -> size
    guards: list[tuple[sympy.Basic, bool]] = field(default_factory=list)
    specialized: dict[sympy.Symbol, str] = field(default_factory=dict)  # symbol -> why (the user's line)
    open: bool = True
    interpreting: bool = False

    def symbol_names(self) -> dict[sympy.Symbol, str]:
        return {s: f"input {i} dim {d}" for s, ((i, d), *_) in self.sources.items()}


_local = threading.local()


def active() -> Symbolic | None:
    """The tracked compilation in progress on this thread, if any."""
    state = getattr(_local, "state", None)
    return state if state is not None and state.open else None


def _record(state: Symbolic | None, expr: sympy.Basic, value: bool) -> None:
    if state is not None and state.open and expr not in (sympy.true, sympy.false):
        state.guards.append((expr, value))


def _hint_of(state: Symbolic, expr: sympy.Basic) -> int:
    return int(expr.xreplace({s: sympy.Integer(v) for s, v in state.hints.items()}))


class SizeInt(int):
    """An input size tracked symbolically: the ``int`` is the size of this call, ``sym`` its expression."""

    sym: torch.SymInt
    state: Symbolic

    def __new__(cls, sym: torch.SymInt, state: Symbolic) -> SizeInt:
        self = int.__new__(cls, _hint_of(state, sym.node.expr))
        self.sym, self.state = sym, state
        return self

    @property
    def expr(self) -> sympy.Basic:
        return self.sym.node.expr

    def specialize(self, why: str) -> int:
        """Record that the trace depends on this exact value; returns it as a plain int."""
        value = int.__int__(self)
        state = self.state
        if state.open:
            _record(state, sympy.Eq(self.expr, value), True)
            for symbol in self.expr.free_symbols:
                state.specialized.setdefault(symbol, f"{why}{user_location()}")
        return value

    # leaving the tracked world: specialization
    def __int__(self) -> int:
        return self.specialize("int()")

    def __index__(self) -> int:
        return self.specialize("used as an index")

    def __float__(self) -> float:
        return float(self.specialize("float()"))

    def __complex__(self) -> complex:
        return complex(self.specialize("complex()"))

    def __str__(self) -> str:
        return str(self.specialize("str()") if self.state.interpreting else int.__int__(self))

    def __format__(self, spec: str) -> str:
        value = self.specialize("formatted") if self.state.interpreting else int.__int__(self)
        return format(value, spec)

    def __hash__(self) -> int:
        if self.state.interpreting:
            self.specialize("hashed (a dict key or set member)")
        return int.__hash__(self)

    def __repr__(self) -> str:
        return int.__repr__(self)

    def __copy__(self) -> SizeInt:
        return self

    def __deepcopy__(self, memo: Any) -> SizeInt:
        return self

    def __reduce__(self) -> Any:
        return (int, (int.__int__(self),))

    def __bool__(self) -> bool:
        return _truth(self.state, self.sym != 0)

    def __neg__(self) -> int:
        return _wrap(self.state, -self.sym)

    def __pos__(self) -> int:
        return self

    def __abs__(self) -> int:
        return _wrap(self.state, abs(self.sym))

    def __trunc__(self) -> int:
        return self

    def __floor__(self) -> int:
        return self

    def __ceil__(self) -> int:
        return self

    def __round__(self, ndigits: Any = None) -> int:
        return self if ndigits is None else round(self.specialize("round()"), ndigits)


class NumelSize(SizeInt):
    """A tracked proxy's ``numel``: thunder answers ``t.numel`` with an int that can be called (``t.numel()``),
    made by ``int.__new__``, which would specialize a SizeInt; this one stays symbolic."""

    def __call__(self) -> SizeInt:
        return self


class _NumelMethod:
    """The user's ``t.numel`` of a tracked proxy: a method, as in eager, whose call is the symbolic count (a
    NumelSize itself would be hashed as the callee by the interpreter's lookups, a specialization)."""

    __slots__ = ("size",)

    def __init__(self, size: NumelSize) -> None:
        self.size = size

    def __call__(self) -> NumelSize:
        return self.size


def tracked_numel(original: Callable[..., Any]) -> Callable[..., Any]:
    """thunder's ``TensorProxy.__getattr__``: ``numel`` of a proxy whose element count is a SizeInt is a
    :class:`NumelSize` (metas read it: softmax's ``a.numel == 0``); every other attribute is thunder's."""

    def __getattr__(self: Any, attr: str, /) -> Any:  # noqa: N807 - the method it replaces
        if attr == "numel":
            numel = _numel_size(self)
            if numel is not None:
                return numel
        return original(self, attr)

    _REPLACED_GETATTRS[__getattr__] = original
    return __getattr__


#: :func:`tracked_numel`'s replacements, each with thunder's ``__getattr__`` it wraps: thunder's interpreter, which
#: interprets ``__getattr__`` for the user's attribute reads, is given thunder's own instead (its lookasides, its
#: trace: a program's attribute reads trace as they did)
_REPLACED_GETATTRS: dict[Callable[..., Any], Callable[..., Any]] = {}


def _numel_size(proxy: Any) -> NumelSize | None:
    """The proxy's element count as a :class:`NumelSize` where it is a SizeInt (run opaquely by thunder's
    interpreter, which interprets ``__getattr__`` for the user's ``t.numel()``)."""
    numel = proxy.__dict__.get("_numel")
    return NumelSize(numel.sym, numel.state) if type(numel) is SizeInt else None


def _operand(other: Any) -> Any:
    """``other`` as a SymInt operand: a SizeInt's SymInt, an int (bools too); ``None`` for anything else."""
    if isinstance(other, SizeInt):
        return other.sym
    if isinstance(other, int):
        return int.__int__(other)
    return None


def _wrap(state: Symbolic, value: Any) -> Any:
    if isinstance(value, torch.SymInt):
        expr = value.node.expr
        if expr.is_number:
            return int(expr)
        return SizeInt(value, state)
    if isinstance(value, torch.SymBool):
        return _truth(state, value)
    return value


def _truth(state: Symbolic, value: torch.SymBool | bool) -> bool:
    if not isinstance(value, torch.SymBool):
        return bool(value)
    expr = value.node.expr
    if expr in (sympy.true, sympy.false):
        return bool(expr)
    result = bool(expr.xreplace({s: sympy.Integer(v) for s, v in state.hints.items()}))
    _record(state, expr, result)
    return result


def _arithmetic(name: str, symbolic: bool) -> Callable[[SizeInt, Any], Any]:
    plain = getattr(int, name)

    def method(self: SizeInt, other: Any) -> Any:
        operand = _operand(other)
        if symbolic and operand is not None:
            return _wrap(self.state, getattr(self.sym, name)(operand))
        if not isinstance(other, (int, float, complex)):
            return plain(int.__int__(self), other)  # NotImplemented: the other operand's reflected method decides
        return plain(self.specialize(f"'{name}' with {type(other).__name__}"), _plain(other, name))

    method.__name__ = name
    return method


def _plain(other: Any, name: str) -> Any:
    return other.specialize(f"'{name}'") if isinstance(other, SizeInt) else other


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__floordiv__",
              "__rfloordiv__", "__mod__", "__rmod__", "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__"):
    setattr(SizeInt, _name, _arithmetic(_name, True))
for _name in ("__truediv__", "__rtruediv__", "__pow__", "__rpow__", "__and__", "__rand__", "__or__", "__ror__",
              "__xor__", "__rxor__", "__lshift__", "__rlshift__", "__rshift__", "__rrshift__", "__divmod__",
              "__rdivmod__"):
    setattr(SizeInt, _name, _arithmetic(_name, False))
del _name

#: SizeInt's methods (and the making of a NumelSize), which thunder's interpreter must call rather than interpret
#: (they run sympy)
METHODS = tuple(
    value for name, value in vars(SizeInt).items() if callable(value) and name.startswith("__") and name != "__new__"
) + (NumelSize.__call__, _numel_size, _NumelMethod.__call__)


def specialized_range(original: Callable[..., Any]) -> Callable[..., Any]:
    """``range()`` reads an int subclass's value in C without calling it: its SizeInt arguments specialize."""

    def call(*args: Any) -> Any:
        return original(*(a.specialize("range()") if isinstance(a, SizeInt) else a for a in args))

    return call


def symbolic_arange(original: Callable[..., Any]) -> Callable[..., Any]:
    """thunder's ``clang.arange`` (under ``torch.arange``, ``tril``/``triu``, SDPA's causal mask): where an
    integer bound is a SizeInt, its length is computed with integer arithmetic, which stays symbolic
    (thunder's ``math.isfinite`` and ``math.ceil((stop - start) / step)`` specialize); the checks of
    progress record guards. The ops are thunder's: an ``iota``, for a floating dtype one of ``int64``
    scaled and converted, as in the original."""
    from thunder.core import devices, dtypes, prims
    from thunder.core import utils as thunder_utils
    from thunder.core.langctxs import Languages, langctx

    @langctx(Languages.CLANG)
    def arange(*, start: Any, step: Any, stop: Any, device: Any, dtype: Any = None) -> Any:
        bounds = (start, step, stop)
        if not any(isinstance(v, SizeInt) for v in bounds) or not all(type(v) is int or isinstance(v, SizeInt)
                                                                      for v in bounds):
            return original(start=start, step=step, stop=stop, device=device, dtype=dtype)
        thunder_utils.check(
            (start == stop) or (step < 0 and stop < start) or (step > 0 and stop > start),
            lambda: f"step={step} must make progress from start={start} to stop={stop}",
        )
        device = devices.Device(device) if isinstance(device, str) else device
        dtype = dtypes.int64 if dtype is None else dtype
        length = (stop - start + step - 1) // step if step > 0 else (start - stop - step - 1) // -step
        if thunder_utils.is_exact_dtype(dtype):
            return prims.iota(length, start=start, step=step, device=device, dtype=dtype)
        from thunder.clang import maybe_convert_to_dtype

        index = prims.iota(length, start=0, step=1, dtype=dtypes.int64, device=device)
        return maybe_convert_to_dtype(start + index * step, dtype)

    return arange


def symbolic_slice_grad(original: Callable[..., Any]) -> Callable[..., Any]:
    """thunder's grad rule of the ``slice_prim`` (``x[..., :n]``, transformers' causal-mask slice): it computes
    the gradient's padding with NumPy, which turns a SizeInt into a plain int (a specialization). Where the
    sliced tensor's shape or the bounds are tracked, the same padding is computed with Python arithmetic,
    which stays symbolic; the ops are thunder's (the slice, then a pad of its gradient)."""
    from thunder.core import prims
    from thunder.core.langctxs import Languages, langctx
    from thunder.core.prims import get_grad, put_grad
    from thunder.core.utils import const_as

    @langctx(Languages.TORCH)
    def grad(a: Any, start_indices: Any, end_indices: Any, strides: Any = None) -> Any:
        if not (tracked(a) or tracked(start_indices) or tracked(end_indices)):
            return original(a, start_indices, end_indices, strides)
        fwd = prims.slice_prim(a, start_indices, end_indices, strides)
        g = get_grad(fwd)
        if strides is None or all(s == 1 for s in strides):
            padding = tuple((lo, n - hi, 0) for lo, n, hi in zip(start_indices, a.shape, end_indices))
        else:
            limits = [lo + (0 if m == 0 else 1 + (m - 1) * s) for lo, m, s in zip(start_indices, g.shape, strides)]
            padding = tuple((lo, n - hi, s - 1) for lo, n, hi, s in zip(start_indices, a.shape, limits, strides))
        put_grad(a, prims.pad(g, const_as(0, g.dtype), padding))
        return fwd

    return grad


# -- which dimensions are tracked --------------------------------------------------------------------


@dataclass
class _Function:
    """Per jitted function (weakly keyed by its CompileData): sizes compiled per (flat input, dim), templates."""

    seen: dict[tuple[str, int], set[int]] = field(default_factory=dict)
    marked: set[tuple[str, int]] = field(default_factory=set)  # (input, dim) tracked from the first call
    templates: list[Template] = field(default_factory=list)
    full: int = 0
    respecialized: int = 0
    last_reason: str = ""  # why the last full compilation was not answered by a template
    last_state: Symbolic | None = None  # the last tracked compilation's symbols, guards and specializations
    lock: threading.Lock = field(default_factory=threading.Lock)


_functions: weakref.WeakKeyDictionary[Any, _Function] = weakref.WeakKeyDictionary()
_functions_lock = threading.Lock()


def _function(compile_data: Any) -> _Function:
    with _functions_lock:
        found = _functions.get(compile_data)
        if found is None:
            found = _functions[compile_data] = _Function()
        return found


def _inputs(args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's inputs by where they are: each flat input by its index (``"0"``), and each plain tensor an
    input object holds in its attributes, lists and dicts (a DynamicCache's keys and values, which grow every
    token) by its path (``"1.layers[0].keys"``). Modules are not entered (their tensors are parameters and
    buffers, read as the module's)."""
    found: dict[str, Any] = {}
    for index, leaf in enumerate(tree_flatten((args, kwargs))[0]):
        found[str(index)] = leaf
        if not isinstance(leaf, (torch.Tensor, torch.nn.Module, int, float, complex, str, bytes, type(None))):
            _held(leaf, str(index), 0, found)
    return found


#: how deep :func:`_inputs` looks into an input object, and the most tensors it notes there
_HELD_DEPTH, _HELD_MOST = 4, 256


def _held(value: Any, path: str, depth: int, found: dict[str, Any]) -> None:
    if len(found) >= _HELD_MOST or depth > _HELD_DEPTH:
        return
    if type(value) is torch.Tensor:
        if depth:
            found[path] = value
        return
    if isinstance(value, (list, tuple)):
        items: Any = ((f"[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, dict):
        items = ((f"[{k!r}]", v) for k, v in value.items() if isinstance(k, (str, int)))
    elif isinstance(value, (torch.Tensor, torch.nn.Module, type)) or callable(value):
        return
    else:
        try:
            items = ((f".{k}", v) for k, v in vars(value).items())
        except TypeError:  # no __dict__
            return
    for suffix, item in list(items):
        _held(item, path + suffix, depth + 1, found)


def dynamic_dims(compile_data: Any, args: tuple, kwargs: dict) -> dict[str, list[int]]:
    """Note the sizes of this call's input tensors (:func:`_inputs`); return, per input, the dims to track:
    those seen with two or more sizes and those marked with ``torch._dynamo.mark_dynamic``. Sizes 0 and 1
    are not tracked (broadcasting and empty tensors trace differently)."""
    function = _function(compile_data)
    chosen: dict[str, list[int]] = {}
    with function.lock:
        for index, leaf in _inputs(args, kwargs).items():
            if type(leaf) is not torch.Tensor:  # parameters, subclasses and non-tensors stay static
                continue
            marked = getattr(leaf, "_dynamo_dynamic_indices", set())
            for dim, size in enumerate(leaf.shape):
                sizes = function.seen.setdefault((index, dim), set())
                sizes.add(int(size))
                if (len(sizes) >= 2 or dim in marked or (index, dim) in function.marked) and size >= 2:
                    chosen.setdefault(index, []).append(dim)
    return chosen


def mark_dynamic(compile_data: Any, dims: set[tuple[int, int]]) -> None:
    """Track these (flat input, dim) of the jitted function's inputs from its first call on, as
    ``torch._dynamo.mark_dynamic`` marks a tensor's: the dims Dynamo made symbolic in a graph after a break."""
    function = _function(compile_data)
    with function.lock:
        function.marked |= {(str(index), dim) for index, dim in dims}


def begin(compile_data: Any, args: tuple, kwargs: dict) -> Symbolic | None:
    """Start a tracked compilation of this call (``None``: nothing to track)."""
    dims = dynamic_dims(compile_data, args, kwargs)
    if not dims:
        return None
    state = Symbolic(ShapeEnv(duck_shape=False, specialize_zero_one=False))
    leaves = _inputs(args, kwargs)
    for index, tensor_dims in dims.items():
        tensor = leaves[index]
        sizes = state.by_tensor.setdefault(id(tensor), {})
        for dim in tensor_dims:
            if dim in sizes:
                state.sources[sizes[dim].expr].append((index, dim))
                continue
            hint = int(tensor.shape[dim])
            symbol = state.env.create_symbol(hint, source=_Source(index, dim), dynamic_dim=DimDynamic.DYNAMIC)
            state.hints[symbol] = hint
            state.sources[symbol] = [(index, dim)]
            state.guards.append((symbol >= 2, True))  # 0 and 1 trace otherwise
            sizes[dim] = SizeInt(state.env.create_symintnode(symbol, hint=hint), state)
    _local.state = state
    return state


def _Source(index: str, dim: int) -> Any:  # noqa: N802 - a constructor
    from torch._dynamo.source import ConstantSource

    return ConstantSource("".join(c if c.isalnum() else "_" for c in f"input{index}_dim{dim}"))


def end(state: Symbolic | None) -> None:
    if state is not None:
        state.open = False
    _local.state = None


def tracked_tensorproxy(original: Callable[..., Any]) -> Callable[..., Any]:
    """thunder's ``tensorproxy`` (a real tensor to the proxy of an input), giving a tracked input's proxy
    its SizeInts while a tracked compilation interprets the program."""

    def make(t: Any, /, *, name: Any, history: Any = None) -> Any:
        proxy = original(t, name=name, history=history)
        state = active()
        sizes = state.by_tensor.get(id(t)) if state is not None and state.interpreting else None
        if sizes:
            shape = tuple(sizes.get(d, s) for d, s in enumerate(proxy._shape))
            numel = 1
            for s in shape:
                numel = numel * s
            proxy._shape, proxy._numel = shape, numel
        return proxy

    return make


# -- templates and re-specialization ----------------------------------------------------------------


@dataclass
class Template:
    """A compilation's cache entry whose traces hold SizeInts, with what it was traced under."""

    entry: Any
    state: Symbolic


def keep(compile_data: Any, state: Symbolic, entry: Any) -> str:
    """Keep ``entry`` (the compilation ``state`` tracked) as a template; returns why not, or ``""``."""
    function = _function(compile_data)
    function.full += 1
    free = [s for s in state.hints if s not in state.specialized]
    why = ""
    if not free:
        why = "every tracked size was specialized: " + "; ".join(
            f"{state.symbol_names()[s]}: {w}" for s, w in state.specialized.items()
        )
    else:
        why = _fusion_in(entry)
    if not why:
        with function.lock:
            function.templates.append(Template(entry, state))
    return why


def _traces(entry: Any) -> Iterator[Any]:
    for traces in (entry.prologue_traces, entry.computation_traces, entry.epilogue_traces, entry.backward_traces):
        if traces and traces[-1] is not None:
            yield traces[-1]


def _fusion_in(entry: Any) -> str:
    from thunder.extend import FusionExecutor

    for trace in _traces(entry):
        for bsym in trace.bound_symbols:
            executor = bsym.sym.executor
            if isinstance(executor, FusionExecutor) and bsym.sym.is_fusion:
                return f"its trace holds a {executor.name} fusion region, compiled for one shape"
    return ""


def guards_hold(template: Template, args: tuple, kwargs: dict) -> tuple[dict[sympy.Symbol, int] | None, str]:
    """The new value of each symbol when the call's sizes satisfy the template's guards (else ``None``),
    and why not."""
    leaves = _inputs(args, kwargs)
    values: dict[sympy.Symbol, int] = {}
    names = template.state.symbol_names()
    for symbol, sources in template.state.sources.items():
        for index, dim in sources:
            leaf = leaves.get(index)
            if not isinstance(leaf, torch.Tensor) or leaf.ndim <= dim:
                return None, f"input {index} has no dim {dim}"
            size = int(leaf.shape[dim])
            if values.setdefault(symbol, size) != size:
                return None, f"{names[symbol]} is one size in the template, two here"
    substitution = {s: sympy.Integer(v) for s, v in values.items()}
    env = template.state.env
    checks = [(g.expr, True) for g in env.guards] + template.state.guards
    checks += [(sympy.Eq(s, e), True) for s, e in env.replacements.items()]
    for expr, expected in checks:
        result = expr.xreplace(substitution)
        if result not in (sympy.true, sympy.false) or bool(result) is not expected:
            shown = ", ".join(f"{names[s]} = {v}" for s, v in values.items())
            relation = expr if expected else sympy.Not(expr)
            return None, f"{shown}: the trace depends on {_named(relation, names)}, which does not hold"
    return values, ""


def _named(expr: sympy.Basic, names: dict[sympy.Symbol, str]) -> str:
    """``expr`` with each symbol written as the input dimension it stands for."""
    text = str(expr)
    for symbol, name in sorted(names.items(), key=lambda item: -len(str(item[0]))):
        text = text.replace(str(symbol), f"[{name}]")
    return text


def respecialize(template: Template, values: dict[sympy.Symbol, int]) -> Any:
    """A concrete cache entry of the template for the symbols' new values."""
    from thunder.common import transform_to_torch_types

    substitution = {s: sympy.Integer(v) for s, v in values.items()}
    entry = template.entry
    prologue = _substituted(entry.prologue_traces[-1], substitution)
    computation = _substituted(entry.computation_traces[-1], substitution)
    backward_fn, backward_traces = None, []
    if entry.backward_fn is not None:
        backward = _substituted(entry.backward_traces[-1], substitution)
        backward_fn, backward_traces = backward.python_callable(), [backward]
    epilogue_fn, epilogue_traces = None, [None]
    if entry.epilogue_fn is not None and entry.epilogue_traces and entry.epilogue_traces[-1] is not None:
        epilogue = _substituted(entry.epilogue_traces[-1], substitution)
        epilogue_fn = transform_to_torch_types(epilogue, translate_all=True).python_callable()
        epilogue_traces = [epilogue]
    for trace in (computation, *backward_traces):
        _verify_shapes(trace)
    return entry._replace(
        prologue_fn=prologue.python_callable(include_decorators=False),
        prologue_traces=[prologue],
        computation_fn=transform_to_torch_types(computation).python_callable(),
        computation_traces=[computation],
        epilogue_fn=epilogue_fn,
        epilogue_traces=epilogue_traces,
        backward_fn=backward_fn,
        backward_traces=backward_traces,
    )


class LeakedSize(Exception):  # noqa: N818
    """A re-specialized trace's output shapes are not what its ops' metas compute for the new sizes: a size
    left the tracked world without a guard (a C function read it, such as a meta tensor's constructor)."""


def _verify_shapes(trace: Any) -> None:
    """Run the meta of every op of ``trace`` on its (re-specialized) arguments and check that each output
    tensor's shape is the one the trace holds. A dim the template held as a plain int but whose value
    changes is a size that left the tracked world without a guard (what was computed from it may be
    stale): :class:`LeakedSize`, and the call compiles in full."""
    from thunder.core.proxies import TensorProxy
    from thunder.core.pytree import tree_flatten as thunder_flatten
    from thunder.core.trace import TraceCtx, tracectx

    scratch = TraceCtx()
    with tracectx(scratch):
        for bsym in trace.bound_symbols:
            if bsym.sym.name.startswith("unpack") or bsym.sym.name in _NO_META:
                continue
            meta = bsym.sym.meta
            if meta is None:
                raise LeakedSize(f"{bsym.sym.name} has no meta to check its shapes with")
            try:
                result = meta(*bsym.args, **bsym.kwargs)
            except Exception as error:  # noqa: BLE001 - a meta refusing the new sizes: compile
                raise LeakedSize(f"{bsym.sym.name}: {error}") from error
            held = [o for o in thunder_flatten(bsym.output)[0] if isinstance(o, TensorProxy)]
            computed = [o for o in thunder_flatten(result)[0] if isinstance(o, TensorProxy)]
            if len(held) != len(computed):
                raise LeakedSize(f"{bsym.sym.name}: {len(computed)} tensor outputs, the trace holds {len(held)}")
            for a, b in zip(held, computed):
                if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
                    raise LeakedSize(f"{bsym.sym.name}: computes {tuple(b.shape)}, the trace holds {tuple(a.shape)}")


#: ops of execution traces that compute nothing a meta could check
_NO_META = ("python_return", "python_del", "del", "return", "comment")


#: the prologue's checks of a tensor input's metadata (the prim and the python executor's symbol)
_SHAPE_CHECKS = ("check_tensor_shape_and_metadata", "check_tensor_metadata")


def _substituted(trace: Any, substitution: dict[sympy.Symbol, sympy.Integer]) -> Any:
    """A copy of ``trace`` with every SizeInt replaced by its value under ``substitution``."""
    from thunder.core.proxies import TensorProxy
    from thunder.core.trace import from_trace, tracectx

    new = from_trace(trace)
    new.names = set(trace.names)
    proxies: dict[str, Any] = {}

    def value(x: Any) -> Any:
        if isinstance(x, SizeInt):
            return int(x.expr.xreplace(substitution))
        if isinstance(x, TensorProxy):
            found = proxies.get(x.name)
            if found is None:
                if any(isinstance(s, SizeInt) for s in x._shape):
                    new.names.discard(x.name)
                    found = x.replace(shape=tuple(value(s) for s in x._shape))
                else:
                    found = x
                proxies[x.name] = found
            return found
        if isinstance(x, tuple):
            mapped = tuple(value(v) for v in x)
            return type(x)(*mapped) if hasattr(x, "_fields") else mapped
        if isinstance(x, list):
            return [value(v) for v in x]
        if isinstance(x, dict):
            return {k: value(v) for k, v in x.items()}
        if isinstance(x, slice):
            return slice(value(x.start), value(x.stop), value(x.step))
        return x

    def bsym_of(bsym: Any) -> Any:
        args = value(bsym.args)
        if bsym.sym.name in _SHAPE_CHECKS and isinstance(bsym.args[0], TensorProxy):
            # the prologue's check holds the real tensor's sizes (plain ints): the proxy's are the tracked ones
            args = (args[0], tuple(args[0].shape), *args[2:])
        return bsym.from_bsym(
            args=args, kwargs=value(bsym.kwargs), output=value(bsym.output),
            subsymbols=[bsym_of(s) for s in bsym.subsymbols],
        )  # fmt: skip

    with tracectx(new):
        new.args, new.kwargs = value(trace.args), value(trace.kwargs)
        new.bound_symbols = [bsym_of(b) for b in trace.bound_symbols]
    new.set_provenance(_Provenance())
    return new


class _Provenance:
    """The provenance line of a re-specialized trace."""

    pss = "Re-specialized for new input sizes from a symbolic template (thunderplug dynamic sizes)"

    def __repr__(self) -> str:
        return f"# {self.pss}"


def stats(compile_data: Any) -> tuple[int, int]:
    """(full compilations, re-specializations) of the jitted function with this CompileData."""
    function = _function(compile_data)
    return function.full, function.respecialized


def function_state(compile_data: Any) -> _Function:
    """What the mechanism keeps for the jitted function with this CompileData (templates, sizes seen)."""
    return _function(compile_data)


@dataclass(frozen=True)
class SizesSummary:
    """What ``thunderplug explain`` shows of a jitted function's symbolic sizes."""

    full: int  # full compilations
    respecialized: int  # entries made from a template for new sizes
    symbolic: tuple[str, ...]  # the input dims the newest template serves every size of ("input 0 dim 1")
    guards: tuple[str, ...]  # the relations its trace depends on, each dim written as above
    specialized: tuple[str, ...]  # tracked dims the last tracked compilation had to specialize, and why
    last_reason: str  # why the last call compiled in full


def summary(compile_data: Any) -> SizesSummary | None:
    """The function's symbolic sizes (``None`` when none of its dims was ever tracked)."""
    function = _function(compile_data)
    state = function.last_state
    if state is None and not function.templates:
        return None
    template = function.templates[-1].state if function.templates else None
    symbolic: tuple[str, ...] = ()
    guards: list[str] = []
    if template is not None:
        names = template.symbol_names()
        symbolic = tuple(n for s, n in names.items() if s not in template.specialized)
        checks = [(g.expr, True) for g in template.env.guards] + template.guards
        for expr, expected in checks:
            text = _named(expr if expected else sympy.Not(expr), names)
            if text not in guards and expr not in (sympy.true, sympy.false):
                guards.append(text)
    specialized: tuple[str, ...] = ()
    if state is not None:
        names = state.symbol_names()
        specialized = tuple(f"{names[s]}: {why}" for s, why in state.specialized.items())
    return SizesSummary(function.full, function.respecialized, symbolic, tuple(guards), specialized,
                        function.last_reason)


def _notice(compile_data: Any, function: _Function, refused: str) -> None:
    """The recompile notice: once per function, where a tracked dimension cannot be served symbolically (each
    new size compiles in full), naming the dims and why."""
    name = getattr(getattr(compile_data, "fn", None), "__qualname__", None) or "the jitted function"
    warn_once(
        ("dynamic sizes", id(compile_data)),
        f"thunderplug: {name} compiles again for every new size: {refused}. Each new size is a full "
        "compilation (correct, only slow); `thunderplug explain` shows the symbolic dimensions and why a call "
        "compiled again (docs/dynamic_shapes.md).",
        RecompileWarning, stacklevel=4,
    )


# -- the wiring: thunder's cache lookup and tracing --------------------------------------------------


@dataclass
class _Call:
    compile_data: Any
    stats: Any
    state: Symbolic | None = None
    respecialized: bool = False


def _closure_value(fn: Any, name: str) -> Any:
    code, closure = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or closure is None or name not in code.co_freevars:
        return None
    return closure[code.co_freevars.index(name)].cell_contents


def symbolic_calls(original: Callable[..., Any], uses_thunderplug: Callable[[Any], bool]) -> Callable:
    """thunder's ``_with_cache_info_ctx`` (it wraps each jitted function's ``get_computation_and_inputs``),
    for functions jitted with thunderplug's executors: a miss that a template's re-specialization answered
    (:class:`Respecialized`) looks the cache up again; a tracked compilation's entry becomes a template."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        wrapped = original(fn)
        compile_data_ref, stats_ref = _closure_value(fn, "weakref_cd"), _closure_value(fn, "weakref_cs")
        if compile_data_ref is None or stats_ref is None:
            return wrapped

        def call(*args: Any, **kwargs: Any) -> Any:
            compile_data, stats = compile_data_ref(), stats_ref()
            if compile_data is None or stats is None or not uses_thunderplug(compile_data) or str(
                getattr(compile_data, "cache_option", "")
            ) != "CACHE_OPTIONS.CONSTANT_VALUES":
                return wrapped(*args, **kwargs)
            record, previous = _Call(compile_data, stats), getattr(_local, "call", None)
            _local.call = record
            misses = stats.cache_misses
            try:
                try:
                    return wrapped(*args, **kwargs)
                except Respecialized:
                    return wrapped(*args, **kwargs)
            finally:
                _local.call = previous
                end(record.state)
                if record.state is not None and stats.cache_misses != misses and not record.respecialized:
                    refused = keep(compile_data, record.state, stats.interpreter_cache[-1])
                    if refused:
                        function = _function(compile_data)
                        function.last_reason += f"; no template kept: {refused}"
                        _notice(compile_data, function, refused)

        return call

    return decorate


def general_jit(original: Callable[..., Any]) -> Callable[..., Any]:
    """thunder's ``thunder_general_jit`` (called on every cache miss, to trace the program): first, the
    templates whose guards hold for the call's sizes, newest first; one whose concrete entry's prologue
    accepts the call is appended to thunder's cache (:class:`Respecialized`). Otherwise the call compiles,
    tracked when a dimension is dynamic (:func:`begin`)."""

    def replacement(fn: Any, args: Any, kwargs: Any, /, **options: Any) -> Any:
        record: _Call | None = getattr(_local, "call", None)
        if record is None or record.state is not None or record.respecialized:
            return original(fn, args, kwargs, **options)
        _local.call = None  # compilations nested in this one (graph breaks) are their own calls
        try:
            function = _function(record.compile_data)
            reasons = []
            for template in reversed(function.templates):
                values, why = guards_hold(template, args, kwargs)
                if values is None:
                    reasons.append(why)
                    continue
                try:
                    entry = respecialize(template, values)
                except LeakedSize as error:
                    reasons.append(f"not re-specialized ({error})")
                    continue
                try:
                    entry.prologue_fn(*args, **kwargs)
                except Exception:  # noqa: BLE001 - another input differs: compile
                    reasons.append("another input's metadata differs from the template's")
                    continue
                record.stats.interpreter_cache.append(entry)
                record.respecialized = True
                function.respecialized += 1
                raise Respecialized
            function.last_reason = "; ".join(reasons)
            state = record.state = begin(record.compile_data, args, kwargs)
            if state is None:
                function.full += 1
                return original(fn, args, kwargs, **options)
            function.last_state = state
            if not reasons:
                function.last_reason = "traced with " + ", ".join(state.symbol_names().values()) + " symbolic"
            state.interpreting = True
            try:
                return original(fn, args, kwargs, **options)
            finally:
                state.interpreting = False
        finally:
            _local.call = record

    return replacement


# -- metas from torch on symbolic sizes -------------------------------------------------------------


def tracked(x: Any) -> bool:
    """Whether ``x`` (a proxy, a number, a container) holds a SizeInt."""
    from thunder.core.proxies import TensorProxy

    if isinstance(x, SizeInt):
        return True
    if isinstance(x, TensorProxy):
        return any(isinstance(s, SizeInt) for s in x._shape)
    if isinstance(x, (tuple, list)):
        return any(tracked(v) for v in x)
    if isinstance(x, dict):
        return any(tracked(v) for v in x.values())
    return False


def symbolic_fake_call(call: Callable[..., Any], args: tuple, to_value: Callable[[Any], Any]) -> Any:
    """``call(*args)`` on FakeTensors with symbolic sizes (the compilation's ShapeEnv; guards torch records
    there are checked at every re-specialization) where a tensor argument's shape holds SizeInts: the
    outputs' sizes are then SizeInts too (:func:`shape_of`). ``to_value`` converts the other arguments."""
    state = active()
    assert state is not None
    from thunder.core import dtypes
    from thunder.core.proxies import TensorProxy

    def fake(x: Any) -> Any:
        if isinstance(x, TensorProxy):
            shape = [s.sym if isinstance(s, SizeInt) else int.__int__(s) for s in x._shape]
            return torch.empty(shape, dtype=dtypes.to_torch_dtype(x.dtype), device="meta")
        if isinstance(x, (SizeInt, tuple, list)):
            return symbolic_value(x)
        return to_value(x)

    with fake_mode_of(state):
        return call(*(fake(a) for a in args))


def fake_mode_of(state: Symbolic) -> Any:
    """The FakeTensorMode of the tracked compilation's ShapeEnv (one per compilation: fakes of two modes
    cannot meet in one op)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = state.__dict__.get("fake_mode")
    if mode is None:
        mode = state.__dict__["fake_mode"] = FakeTensorMode(shape_env=state.env, allow_non_fake_inputs=False)
    return mode


def symbolic_value(x: Any) -> Any:
    """``x`` with each SizeInt as its SymInt (in tuples and lists too), for torch code run on fakes."""
    if isinstance(x, SizeInt):
        return x.sym
    if isinstance(x, (tuple, list)) and any(isinstance(v, SizeInt) for v in x):
        return type(x)(symbolic_value(v) for v in x)
    return x


def symbolic_fake(proxy: Any, order: tuple[int, ...] | None, device: torch.device, dtype: torch.dtype) -> Any:
    """A FakeTensor of the compilation's mode for ``proxy``: its SizeInts as SymInts, dense in memory
    ``order`` (outermost first; ``None``: contiguous). Entered in :func:`fake_mode_of`."""
    shape = [s.sym if isinstance(s, SizeInt) else int.__int__(s) for s in proxy._shape]
    if order is None:
        return torch.empty(shape, dtype=dtype, device=device)
    inverse = sorted(range(len(order)), key=order.__getitem__)
    return torch.empty([shape[d] for d in order], dtype=dtype, device=device).permute(inverse)


def size_key(x: Any) -> Any:
    """A SizeInt as a cache key, by its expression (hashing it would record a specialization); other
    values as they are. Keys with expressions belong in caches of one compilation (its symbols)."""
    return ("size", x.expr) if isinstance(x, SizeInt) else x


def symbolic_value_key(proxy: Any) -> Any:
    """``fake.value_key`` of a proxy whose shape holds SizeInts, each by its expression: a key for caches of
    one compilation (:func:`compilation_cache`)."""
    from thunderplug.tracing.fake import memory_order_of

    shape = tuple(size_key(s) for s in proxy._shape)
    return ("tensor", shape, proxy.dtype, proxy.device, proxy.requires_grad, memory_order_of(proxy))


def hint(size: int) -> int:
    """A size's value in this call, recording nothing: only for choices every size is right with (how much a
    trace saves for its backward), never for what a trace computes."""
    return int.__int__(size)


def compilation_cache(state: Symbolic, name: str) -> dict[Any, Any]:
    """A cache that lives as long as the tracked compilation (and its template): for what is computed
    with its symbols (graphs traced on its symbolic fakes)."""
    return state.__dict__.setdefault(f"cache {name}", {})


def shape_of(t: torch.Tensor) -> tuple[int, ...]:
    """A (fake) tensor's shape, its symbolic sizes as SizeInts of the compilation in progress."""
    state = active()
    return tuple(_wrap(state, s) if isinstance(s, torch.SymInt) and state is not None else int(s) for s in t.shape)


def opaque_size_methods(original: Callable[..., Any]) -> Callable[..., Any]:
    """thunder's lookaside lookup, answering an opaque call for each of SizeInt's :data:`METHODS`."""
    from thunder.core.interpreter import interpreter_needs_wrap, unwrap

    opaque = {method: interpreter_needs_wrap(method) for method in METHODS}
    numel_of = interpreter_needs_wrap(lambda proxy, attr: _NumelMethod(_numel_size(proxy)))

    def replacement(fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            found = opaque.get(fn)
            thunders = _REPLACED_GETATTRS.get(fn)
        except TypeError:  # unhashable
            found = thunders = None
        if thunders is not None:
            found = original(thunders, *args, **kwargs)
            attribute = found if found is not None else functools.partial(interpret_call, thunders)

            def getattr_numel_first(proxy: Any, attr: Any, /, *rest: Any, **options: Any) -> Any:
                # the user's ``t.numel()`` (a DynamicCache's ``keys.numel() == 0``): symbolic, as for metas
                if unwrap(attr) == "numel" and _numel_size(unwrap(proxy)) is not None:
                    return numel_of(proxy, attr)
                return attribute(proxy, attr, *rest, **options)

            return getattr_numel_first
        return found if found is not None else original(fn, *args, **kwargs)

    return replacement
