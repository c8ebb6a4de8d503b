"""Parts of eager's tensor API that thunder 0.2.6's proxies and symbols lack or shape otherwise, in discover()
compilations (wired in by ``thunderplug.wiring.patches``; docs/known-issues.md lists what they were).

* ``x % y``, ``2 % x``, ``x %= y``: eager's ``Tensor.__mod__``/``__rmod__``/``__imod__`` are
  ``torch.remainder`` (the sign of the divisor) and ``remainder_``; thunder's ``TensorProxy.__mod__`` looks up
  a method ``mod`` its torch language context does not have (``TypeError: 'NoneType' object is not callable``),
  and ``Proxy.__imod__`` refuses. The operators call ``thunder.torch.remainder``/``remainder_``
  (:func:`remainder_operator`).
* ``x.max(1).values``: eager returns ``torch.return_types`` structseqs (``max``, ``min``, ``sort``, ``topk``,
  ``median``, ``kthvalue``, ``mode``, ``cummax``, ...), thunder's symbols plain tuples (``AttributeError:
  values``). A call of such a torch function (or tensor method) in interpreted code returns the structseq eager
  returns (:func:`structseq_results`), and traces print one as code that builds it (:func:`structseq_printing`),
  so a jitted function that returns it returns eager's type.
* ``torch.lerp(start, end, weight)`` with a ``start`` smaller than the broadcast shape (a 0-dim start and
  larger ``end``/``weight``): thunder's meta gives the result ``start``'s shape; ``start`` is expanded to
  the broadcast shape first (:func:`eager_arguments`, asked by the subclass core's ``Symbol.__call__``
  replacement), eager's result shape, values and (through the expand) gradient sum.
* ``t.bernoulli_(p)`` and other ``torch.Tensor`` methods thunder's torch language has no entry for (``Unknown
  attribute bernoulli_``): where an executor of the compilation has a lookaside for the method, ``t.name`` is the
  method, so the call is that lookaside (:func:`executor_methods`).

Calls whose result's shape depends on values raise :class:`DataDependentShapeError`, naming the op and the line,
on which discover() breaks the graph (``wiring.graph_breaks``): ``x[mask]`` with a boolean mask tensor
(:func:`boolean_mask_refusal`), the torch functions thunder registered automatically whose fake kernel says so
(``bincount``, ``unique``, ``nonzero(as_tuple=True)``, ...) and thunder's own refusals of such forms
(:func:`as_data_dependent`), and ``torch.unique``'s implementations thunder has no symbol for
(:data:`UNSUPPORTED_DATA_DEPENDENT`, :func:`data_dependent_call`). So does a Python branch on a number read from a
tensor (``if x.sum().item() > 0:``; :func:`unknown_number_branch`): thunder converted the number, whose value it
does not know, to False and recorded no check, so every call took the else branch, silently. And so does
``t.tolist()`` (:func:`autograd_hook_break`), whose values Python code uses as sizes or in branches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import thunder.torch as ltorch
import torch
from thunder.core import dtypes
from thunder.core.compile_data import get_compile_data
from thunder.core.interpreter import INTERPRETER_SIGNALS, interpreter_needs_wrap, unwrap
from thunder.core.proxies import NumberProxy, Proxy, TensorProxy
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import get_tracectx
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

from thunderplug.eager.output_grads import requires_grad_while_tracing
from thunderplug.thunder_compat import torch_to_thunder_function_map
from thunderplug.tracing import trace_walk
from thunderplug.tracing.aten import DataDependentShapeError, data_dependent, user_location

# -- the % operators ------------------------------------------------------------------------------------------

#: the proxy methods thunder's interpreter calls for ``%``, ``%`` reflected and ``%=``, with what eager computes
REMAINDER_OPERATORS: dict[Callable[..., Any], Callable[[Any, Any], Any]] = {
    TensorProxy.__mod__: lambda a, b: ltorch.remainder(a, b),
    TensorProxy.__rmod__: lambda a, b: ltorch.remainder(b, a),
    Proxy.__imod__: lambda a, b: ltorch.remainder_(a, b),
}


def remainder_operator(method: Callable[..., Any], active: Callable[[], bool]) -> Callable[[Any], Callable]:
    """The lookaside of one of :data:`REMAINDER_OPERATORS`, whose ``original`` (thunder's) runs the proxy's method
    opaquely: in discover() compilations, eager's ``torch.remainder`` for a tensor proxy; thunder's otherwise
    (and for the other proxies, whose ``__imod__`` this also is)."""
    from thunder.core.jit_ext import ensure_recursive_proxies, record_source_loc_in_symbol_header

    ours = ensure_recursive_proxies(interpreter_needs_wrap(record_source_loc_in_symbol_header(
        REMAINDER_OPERATORS[method])))

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def lookaside(a: Any, b: Any) -> Any:
            if isinstance(unwrap(a), TensorProxy) and active():
                return ours(a, b)
            return original(a, b)

        return lookaside

    return make


# -- torch.return_types ---------------------------------------------------------------------------------------


def _result_types() -> tuple[dict[Any, type], dict[Any, type]]:
    """The structseq type eager returns, by torch function (``torch.max``, ``torch.Tensor.max``,
    ``torch.linalg.qr``) and by the thunder symbol a tensor method call reaches (``x.max(1)``: the method's
    type, so ``x.qr()`` is ``torch.return_types.qr``, as ``torch.qr``, where ``torch.linalg.qr`` is
    ``linalg_qr``)."""
    symbols = torch_to_thunder_function_map()
    by_function: dict[Any, type] = {}
    by_symbol: dict[Any, type] = {}
    for name in dir(torch.return_types):
        cls = getattr(torch.return_types, name)
        if name.endswith("_out") or not (isinstance(cls, type) and issubclass(cls, tuple)):
            continue
        if name.startswith("linalg_"):
            found = [getattr(torch.linalg, name.removeprefix("linalg_"), None)]
        else:
            found = [getattr(torch, name, None), getattr(torch.Tensor, name, None)]
        for function in found:
            if function is None or function not in symbols:
                continue
            by_function[function] = cls
            if not name.startswith("linalg_"):
                by_symbol[symbols[function]] = cls
    return by_function, by_symbol


_BY_FUNCTION, _BY_SYMBOL = _result_types()
#: what a call returns in eager, for the callables thunder's interpreter is asked to call
RESULT_TYPES: dict[Any, type] = {**_BY_SYMBOL, **_BY_FUNCTION}


def structseq_results(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder's lookaside lookup (``general_jit_lookaside``): the lookaside of a callable whose eager result
    is a ``torch.return_types`` structseq returns that structseq where thunder's symbol returns the tuple of
    its fields (``torch.max(x)``, a tensor, is left as it is)."""

    def replacement(fn: Any, *args: Any, **kwargs: Any) -> Any:
        lookaside = original(fn, *args, **kwargs)
        try:
            cls = RESULT_TYPES.get(fn)
        except TypeError:  # an unhashable callable
            return lookaside
        if cls is None or lookaside is None or not active():
            return lookaside
        return _returning(cls, lookaside)

    return replacement


def _returning(cls: type, lookaside: Callable[..., Any]) -> Callable[..., Any]:
    as_structseq = interpreter_needs_wrap(cls)

    def call(*args: Any, **kwargs: Any) -> Any:
        result = lookaside(*args, **kwargs)
        if result is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
            return result
        value = unwrap(result)
        if type(value) is not tuple or len(value) != cls.n_fields:
            return result
        return as_structseq(result)

    return call


def structseq_printing(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder's ``codeutils.prettyprint``: a structseq (or a tuple, list or dict holding one) prints as the
    code that builds it, ``torch.return_types.max((t0, t1))``; thunder printed its repr, ``max(values=t0,
    indices=t1)``, which the epilogue then called (``TypeError: structseq() missing required argument``)."""

    def replacement(x: Any, **kwargs: Any) -> Any:
        if type(x) in _CONTAINERS or _is_structseq(x):
            if active() and _holds_structseq(x):
                leaf_kwargs = {k: v for k, v in kwargs.items() if k != "_quote_markers"}
                return _printed(x, original, leaf_kwargs)
        return original(x, **kwargs)

    return replacement


_CONTAINERS = (tuple, list, dict)


def _is_structseq(x: Any) -> bool:
    return type(x).__module__ == "torch.return_types" and isinstance(x, tuple)


def _holds_structseq(x: Any) -> bool:
    if _is_structseq(x):
        return True
    if type(x) in (tuple, list):
        return any(_holds_structseq(item) for item in x)
    return type(x) is dict and any(_holds_structseq(item) for item in x.values())


def _printed(x: Any, leaf: Callable[..., str], kwargs: dict) -> str:
    if _is_structseq(x):
        return f"torch.return_types.{type(x).__name__}({_printed(tuple(x), leaf, kwargs)})"
    if type(x) is tuple:
        return "(" + ", ".join(_printed(item, leaf, kwargs) for item in x) + ("," if len(x) == 1 else "") + ")"
    if type(x) is list:
        return "[" + ", ".join(_printed(item, leaf, kwargs) for item in x) + "]"
    if type(x) is dict:
        return "{" + ", ".join(f"{leaf(k)}: {_printed(v, leaf, kwargs)}" for k, v in x.items()) + "}"
    return leaf(x, **kwargs)


# -- lerp -----------------------------------------------------------------------------------------------------


def eager_arguments(symbol: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """The arguments eager's kernel effectively takes, where thunder's symbol would trace another result:
    ``lerp``'s ``start`` expanded to the shape it broadcasts to with ``end`` and ``weight`` (thunder's meta
    gives the result ``start``'s shape: a 0-dim start gave a 0-dim result, and no gradient rule applied).
    ``None``: the arguments as they are."""
    if symbol is not ltorch.lerp:
        return None
    try:
        bound = _LERP_SIGNATURE.bind(*args, **kwargs)
    except TypeError:
        return None
    start, end, weight = (bound.arguments.get(name) for name in ("start", "end", "weight"))
    tensors = [t for t in (start, end, weight) if isinstance(t, TensorProxy)]
    if type(start) is not TensorProxy or len(tensors) < 2:
        return None
    try:
        shape = tuple(torch.broadcast_shapes(*(tuple(t.shape) for t in tensors)))
    except RuntimeError:
        return None  # thunder's own error
    if shape == tuple(start.shape):
        return None
    return (ltorch.expand(start, shape), end, weight), {}


def _lerp_signature() -> Any:
    import inspect

    return inspect.signature(ltorch.lerp.meta)


_LERP_SIGNATURE = _lerp_signature()


# -- boolean masks --------------------------------------------------------------------------------------------


def boolean_mask_refusal(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder's advanced indexing refuses a boolean mask tensor (``x[x > 0]``) with a message that names
    neither the program's line nor what to do. A trace has one shape per tensor and this one depends on the
    mask's values: it is refused as a :class:`DataDependentShapeError`, which names both, and on which
    ``discover()`` breaks the graph there (``wiring.graph_breaks``)."""

    def replacement(a: Any, /, key: Any) -> Any:
        try:
            return original(a, key)
        except NotImplementedError as error:
            if not active() or "boolean advanced indexing" not in str(error):
                raise
            raise data_dependent("x[mask]", " (indexing a tensor with a boolean mask)") from None

    return replacement


def unknown_number_branch(to_bool: Callable[[Any], bool], active: Callable[[], bool]) -> Callable[[Any], Callable]:
    """A lookaside for ``NumberProxy.__bool__`` (``to_bool``). A number read from a tensor (``t.item()``, and what
    is computed from it) has no value while tracing; thunder 0.2.6 converts it to False and records no check, so
    ``if x.sum().item() > 0:`` bakes the else branch into the trace (stock thunder too). Its truth is a value of
    the data: a :class:`DataDependentShapeError` naming the line, on which ``discover()`` breaks the graph there
    (Dynamo runs the branch eagerly, with the number's real value, on every call)."""

    def make(_no_lookaside: Any) -> Callable[..., Any]:
        def read(number: Any) -> bool:
            if not active() or not isinstance(number, NumberProxy) or not _read_from_tensor(number):
                return to_bool(number)
            location = user_location()
            op = "bool() of a number read from a tensor (Tensor.item())"
            raise DataDependentShapeError(
                f"{op}{location}: a Python branch on a tensor's value; thunder 0.2.6 does not know the number while "
                "tracing. Compute the condition outside the jitted function and pass it in, or express the branch "
                "with tensor ops (torch.where).",
                op=op, location=location, why="branches on a tensor's value, which a thunder 0.2.6 trace cannot hold",
                advice="For one trace, express the branch with tensor ops (torch.where) or compute the condition "
                "outside the jitted function.",
            )  # fmt: skip

        return interpreter_needs_wrap(read)

    return make


def _read_from_tensor(number: NumberProxy) -> bool:
    """Whether ``number`` has no value of its own while tracing: it, or a number it was computed from in the
    trace being recorded, is unknown (``t.item()``'s result prints as ``float ?``; a comparison of it gets a
    made-up value). The numbers computed from unknown ones are gathered once per trace, each symbol visited
    once (``tracing.trace_walk``), not on every ``bool()``."""
    if number.value is None:
        return True
    trace = get_tracectx()
    return trace is not None and number.name in trace_walk.facts(trace, "numbers read from tensors", set, _unknowns)


def _unknowns(unknown: set[str], bsym: BoundSymbol) -> None:
    """Extend ``unknown`` with the numbers ``bsym`` computes from an unknown number."""
    if any(isinstance(a, NumberProxy) and (a.value is None or a.name in unknown) for a in bsym.flat_proxy_args):
        unknown.update(out.name for out in bsym.flat_proxy_outs if isinstance(out, NumberProxy))


def requires_grad_property(
    original: Callable[..., Any], active: Callable[[], bool], cuts: Callable[[BoundSymbol], bool]
) -> Callable[..., Any]:
    """The lookaside of ``TensorProxy.requires_grad``'s getter (``original``): the program's ``h.requires_grad``
    of a tensor it computed is eager's in discover() compilations, True where ``h`` is derived under grad mode
    from an input or parameter that requires grad through differentiable ops (``output_grads.
    requires_grad_while_tracing``, ``cuts`` as its). thunder sets the flag on inputs only, so ``if
    h.requires_grad: h.register_hook(...)`` skipped the hook and ``h * 2 if h.requires_grad else h * 3`` took the
    else branch, silently (stock thunder too). Only the interpreted program's read is answered: thunder's own
    code (its transforms) reads the proxy's flag, unchanged."""
    ours = interpreter_needs_wrap(lambda proxy: requires_grad_while_tracing(proxy, cuts))

    def replacement(*args: Any, **kwargs: Any) -> Any:
        if not active():
            return original(*args, **kwargs)
        return ours(*args, **kwargs)

    return replacement


#: tensor methods registering a hook on the autograd graph: a trace has no autograd graph to put them on
HOOK_METHODS = frozenset({"register_hook", "register_post_accumulate_grad_hook", "retain_grad"})

#: tensor methods returning the tensor's values as Python objects, which a trace does not know
VALUE_METHODS = frozenset({"tolist"})


#: the adjoint properties thunder's proxies lack (``Unknown attribute H``): for real tensors, transposes
ADJOINTS = frozenset({"H", "mH"})


def _real_tensor(value: Any) -> bool:
    return isinstance(value, TensorProxy) and not dtypes.is_complex_dtype(value.dtype)


def _adjoint(proxy: TensorProxy, attr: str) -> TensorProxy:
    """``t.H`` (a matrix's) and ``t.mH`` (the last two dimensions') of a real tensor: eager's transposed view
    (``parametrizations.spectral_norm``'s power method, ``orthogonal``'s skew-symmetric part)."""
    if attr == "H" and proxy.ndim != 2:
        raise RuntimeError(f"tensor.H is only supported on matrices (2-D tensors). Got {proxy.ndim}-D tensor.")
    if attr == "mH" and proxy.ndim < 2:
        raise RuntimeError(f"tensor.mH is only supported on matrices or batches of matrices. Got {proxy.ndim}-D "
                           "tensor.")
    return ltorch.transpose(proxy, -2, -1)


def autograd_hook_break(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """The lookaside of ``TensorProxy.__getattr__`` (``original``), for ``t.register_hook(fn)`` and the other
    :data:`HOOK_METHODS` inside a jitted function: thunder's proxies have none (``AttributeError: Unknown
    attribute register_hook``), and the hook runs during eager's backward, which a trace does not record. In
    discover() compilations it is a :class:`DataDependentShapeError` naming the line, on which the compilation
    graph-breaks (``wiring.graph_breaks``): Dynamo registers the hook on the real tensor, eager's autograd calls it.
    So is ``t.tolist()`` (:data:`VALUE_METHODS`; thunder's automatic registration ran it on a fake tensor:
    ``NotImplementedError: Exception encountered when doing automatic registration for tolist``): the list holds
    the tensor's values, which Python code then uses as sizes or branches on, as after ``t.item()``."""

    def refuse(proxy: Any, attr: str) -> Any:
        location = user_location()
        op = f"Tensor.{attr}"
        if attr in VALUE_METHODS:
            raise DataDependentShapeError(
                f"{op}{location}: the tensor's values as Python numbers; thunder 0.2.6 does not know them while "
                "tracing. Compute them outside the jitted function and pass them in, or keep them a tensor.",
                op=op, location=location,
            )  # fmt: skip
        raise DataDependentShapeError(
            f"{op}{location}: an autograd hook on a tensor inside the jitted function; a thunder trace has no "
            "autograd graph to register it on. Register it outside the jitted function (on an input or a "
            "parameter), or return the tensor and hook it there.",
            op=op, location=location,
        )  # fmt: skip

    refusal = interpreter_needs_wrap(refuse)
    transposed = interpreter_needs_wrap(_adjoint)

    def lookaside(proxy: Any, attr: Any, /, *args: Any, **kwargs: Any) -> Any:
        # the attribute name first: this runs for every method call on a proxy in the user's program
        name = unwrap(attr)
        if (name in HOOK_METHODS or name in VALUE_METHODS) and active() and isinstance(unwrap(proxy), TensorProxy):
            return refusal(proxy, attr)
        if name in ADJOINTS and active() and _real_tensor(unwrap(proxy)):
            return transposed(proxy, attr)
        return original(proxy, attr, *args, **kwargs)

    return lookaside


#: module hook registrations whose hook runs in the backward, which a trace does not record
BACKWARD_HOOK_REGISTRATIONS = (
    torch.nn.Module.register_full_backward_hook,
    torch.nn.Module.register_backward_hook,
    torch.nn.Module.register_full_backward_pre_hook,
)


def backward_hook_registration_break(method: Callable[..., Any]) -> Callable[[Any], Callable[..., Any]]:
    """A lookaside for ``method`` (of :data:`BACKWARD_HOOK_REGISTRATIONS`) called inside a jitted function: the
    hook belongs to eager's backward of the module's calls, which a thunder trace does not run, and the
    registration changed the module under the prologue's guards. In discover() compilations it is a
    :class:`DataDependentShapeError` naming the line, on which the compilation graph-breaks: Dynamo runs the
    registration and the hooked module eagerly."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        location = user_location()
        op = f"nn.Module.{method.__name__}"
        raise DataDependentShapeError(
            f"{op}{location}: a backward hook registered inside the jitted function; a thunder trace does not run "
            "eager's backward of the module. Put the hook's effect into the module's forward (a "
            "torch.autograd.Function).",
            op=op, location=location, why="registers a module backward hook, which a thunder 0.2.6 trace cannot run",
            advice="For one trace, put the hook's effect into the module's forward (a torch.autograd.Function).",
        )  # fmt: skip

    def make(_no_lookaside: Any) -> Callable[..., Any]:
        return interpreter_needs_wrap(refuse)  # seen by discover() compilations only (patches' discover-only list)

    return make


#: thunder 0.2.6's refusals of call forms whose result's shape depends on values: ``torch.repeat_interleave``
#: with repeats given as a tensor, ``torch.where`` with only a condition
_THUNDER_DATA_DEPENDENT_REFUSALS = ("does not support tensor repeats", "does not support only specifying a condition")


def as_data_dependent(symbol: Any, error: NotImplementedError) -> DataDependentShapeError | None:
    """The :class:`DataDependentShapeError` for ``symbol``'s failure ``error`` when it failed because the result's
    shape depends on values: thunder's automatic registration ran the torch function on fake tensors, which raised
    torch's dynamic-output-shape exception, or thunder refused such a form (its message kept first: where no graph
    break is made, e.g. ``thunder.jit(ltorch.where)``, the error says what stock thunder's does). ``None`` for any
    other failure."""
    if isinstance(error, DataDependentShapeError):
        return None
    dynamic = isinstance(error.__cause__, (DynamicOutputShapeException, DataDependentOutputException))
    refused = any(refusal in str(error) for refusal in _THUNDER_DATA_DEPENDENT_REFUSALS)
    if not dynamic and not refused:
        return None
    name = str(symbol.id)
    return data_dependent(name if "." in name else f"torch.{symbol.name}", refusal=str(error) if refused else "")


#: torch functions thunder 0.2.6 has no symbol for, whose result's shape depends on values: what ``torch.unique``
#: and ``Tensor.unique`` call (``unique_dim`` with ``dim``; thunder: ``Trying to call function torch._unique2, but
#: it is not yet supported``)
UNSUPPORTED_DATA_DEPENDENT = (torch._unique2, torch._unique, torch._C._VariableFunctions.unique_dim)


def data_dependent_call(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The lookaside of a function of :data:`UNSUPPORTED_DATA_DEPENDENT`: it raises the data-dependent error."""
    name = f"torch.{fn.__name__}"

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise data_dependent(name)

    return interpreter_needs_wrap(refused)


# -- tensor methods thunder lacks, from the compilation's executors --------------------------------------------


def executor_methods(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """thunder's torch language ``get_method`` (what ``TensorProxy.__getattr__`` asks for ``t.name``), answering
    for a ``torch.Tensor`` method it has no entry for (``t.bernoulli_(p)``: ``AttributeError: Unknown attribute
    bernoulli_``) with that method itself where an executor of the discover() compilation in progress has a
    lookaside for it: the call is then that lookaside, as for ``torch.Tensor.name(t, ...)``. Otherwise thunder's
    answer, its ``AttributeError`` included."""

    def get_method(self: Any, id: Any, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        try:
            return original(self, id, *args, **kwargs)
        except AttributeError:
            method = getattr(torch.Tensor, id, None) if isinstance(id, str) else None
            if method is not None and active() and args and isinstance(args[0], TensorProxy):
                compile_data = get_compile_data()
                if compile_data is not None and method in compile_data.executor_lookasides:
                    return method
            raise

    return get_method


def tensor_like(original: Callable[[Any], bool], active: Callable[[], bool]) -> Callable[[Any], Callable]:
    """A lookaside for ``torch.overrides.is_tensor_like`` (``original``): a tensor proxy is tensor-like, as the
    tensor it stands for. torch.distributions' ``broadcast_all`` (``Normal(loc, scale)``, ``Uniform``, ...)
    asks it of every parameter, and a proxy, which is no ``torch.Tensor`` and has no ``__torch_function__``, made
    it raise ``ValueError: Input arguments must all be instances of Number, torch.Tensor or ...``."""

    def make(_no_lookaside: Any) -> Callable[..., Any]:
        def lookaside(value: Any) -> bool:
            if active() and isinstance(value, TensorProxy):
                return True
            return original(value)

        return interpreter_needs_wrap(lookaside)

    return make

