"""Every change thunderplug makes to thunder 0.2.6 beyond registering symbols and executors.

Listed in docs/patches.md and tested in tests/test_patches.py. Each one is inert unless the
compilation in progress uses ``discover()``'s executors (the ``thunderplug`` core executor is in
``executors=``), so plain ``thunder.jit`` behaves exactly as before.

1. ``proxify``: thunder creates tensor proxies through ``proxies.proxy()``, whose only hook is the
   function-local import of ``dtensor_proxy.proxify_dtensor``. We chain it: a traceable subclass
   input becomes a :class:`SubclassTensorProxy` with prologue guards, and plain tensors get a
   guard that they are not subclasses (else plain and subclass calls share a cache entry).
2. ``Symbol.__call__``: a symbol called with a subclass proxy records the subclass op symbol
   instead (``TwoTensor.torch.mul``). This one place catches ``torch.mul(x, 2)``, ``x * 2``,
   ``x.mul(2)`` and ``torch.ops.aten.mul.Tensor(x, 2)`` alike, and also the ops that grad rules
   emit.
3. The ``isinstance`` lookaside answers with the real subclass for subclass proxies.
4. A ``type.__call__`` lookaside constructs traceable subclasses inside jitted code on fakes
   (thunder would interpret ``__new__`` and fail on ``Unknown attribute stride``).
5. ``SigInfo.from_name_and_args`` (a thunder 0.2.6 bug, not subclass-specific): tracing a
   ``torch.autograd.Function.apply`` whose arguments include an object thunder cannot proxy (a
   config dataclass, as torchao's ``matmul_with_hp_or_float8_args`` takes) fails with
   ``AttributeError: ... has no attribute 'name'``. Such arguments are constants of the trace; we
   name them instead of crashing. Always active: it only turns that crash into working code.
6. ``recording_jitted_functions()`` (only for ``thunderplug explain <script>``, only inside its
   ``with`` block): wraps ``thunder.jit`` to collect the functions a script compiles.
7. The ``torch.autograd.Function.apply`` lookaside: for Function classes a plugin claimed whole
   (``Claim(target=SomeFunction)``), ``SomeFunction.apply`` becomes one op traced on fakes,
   instead of thunder interpreting the Function's forward and backward line by line.
8. The ``torch.ops.higher_order.autograd_function_apply`` lookaside (a thunder 0.2.6 gap, always
   active): thunder ignores ``non_differentiable_idx``; the outputs it lists are detached after the
   call, so no gradient flows into them, as in eager.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from thunder import clang
from thunder.core import prims
from thunder.core import jit_ext
from thunder.core.interpreter import (
    ProvenanceRecord,
    PseudoInst,
    _type_call_lookaside,
    interpreter_needs_wrap,
    unwrap,
    wrap,
    wrap_const,
)
from thunder.core.proxies import TensorProxy, tensorproxy
from thunder.core.codeutils import SigInfo
from thunder.core.proxies import ProxyInterface
from thunder.core.symbol import Symbol
from thunder.core.trace import get_tracectx
from thunder.torch.experimental import dtensor_proxy
from torch.utils._python_dispatch import is_traceable_wrapper_subclass, is_traceable_wrapper_subclass_type

from thunderplug.aten import user_location
from thunderplug.core_executor import active_core_executor
from thunderplug.subclass_ops import (
    check_not_subclass,
    check_subclass,
    construct,
    dispatch,
    has_subclass_proxy,
    passes_through,
    subclass_unflatten,
)
from thunderplug.subclass_autodiff import tangent_layout
from thunderplug.subclass_proxy import SubclassLayout, SubclassTensorProxy

_originals: dict[str, Any] = {}
_FUNCTION_APPLY = torch.autograd.function.Function.apply.__func__
_HOP_APPLY = torch.ops.higher_order.autograd_function_apply


class UntraceableSubclassError(TypeError):
    """A torch.Tensor subclass without ``__tensor_flatten__``/``__tensor_unflatten__`` reached thunder."""


def install() -> None:
    """Apply the patches once per process (idempotent)."""
    if _originals:
        return
    _originals["proxify_dtensor"] = dtensor_proxy.proxify_dtensor
    _originals["Symbol.__call__"] = Symbol.__call__
    _originals["isinstance"] = jit_ext._general_jit_lookaside_map[isinstance]
    _originals["type.__call__"] = jit_ext._general_jit_lookaside_map.get(type.__call__, _type_call_lookaside)
    _originals["Function.apply"] = jit_ext._general_jit_lookaside_map[_FUNCTION_APPLY]
    _originals["autograd_function_apply"] = jit_ext._general_jit_lookaside_map[_HOP_APPLY]
    _originals["SigInfo.from_name_and_args"] = SigInfo.from_name_and_args
    dtensor_proxy.proxify_dtensor = _proxify
    SigInfo.from_name_and_args = staticmethod(_siginfo_from_name_and_args)
    Symbol.__call__ = _symbol_call
    jit_ext._general_jit_lookaside_map[isinstance] = _isinstance_lookaside
    jit_ext._general_jit_lookaside_map[type.__call__] = _type_call
    jit_ext._general_jit_lookaside_map[_FUNCTION_APPLY] = _autograd_function_apply
    jit_ext._general_jit_lookaside_map[_HOP_APPLY] = _higher_order_autograd_function_apply


# -- 1. proxies for inputs ------------------------------------------------------------------


def _proxify(x: Any, name: str | None, history: Any) -> Any:
    result = _originals["proxify_dtensor"](x, name, history)
    if result is not None or not isinstance(x, torch.Tensor) or history is None or active_core_executor() is None:
        return result
    if is_traceable_wrapper_subclass(x):
        return _subclass_input(x, name, history)
    if type(x) is not torch.Tensor and not isinstance(x, torch.nn.Parameter):
        raise UntraceableSubclassError(
            f"{type(x).__qualname__} is a torch.Tensor subclass without __tensor_flatten__/__tensor_unflatten__"
            f"{user_location()}; thunderplug cannot see through it. Make it a traceable wrapper subclass, or pass "
            "a plain tensor (e.g. x.as_subclass(torch.Tensor))."
        )
    proxy = tensorproxy(x, name=name, history=history)
    jit_ext.get_jit_ctx().add_constraint((check_not_subclass, proxy))
    return proxy


def _subclass_input(x: torch.Tensor, name: str | None, history: Any) -> SubclassTensorProxy:
    """Inner tensors become inputs unpacked by the prologue (``t = x._data``); the subclass value
    is rebuilt from them at the top of the computation, where nothing needs it at run time."""
    from thunder.core.proxies import proxy as make_proxy

    jit_ctx = jit_ext.get_jit_ctx()
    layout = SubclassLayout.of(x)
    inner: dict[str, TensorProxy] = {}
    for attr in layout.attrs:
        attr_history = ProvenanceRecord(
            PseudoInst.LOAD_ATTR, inputs=[history, ProvenanceRecord(PseudoInst.CONSTANT, inputs=[], value=attr)]
        )
        inner_name = f"{name}_{attr.strip('_')}" if name else None
        inner[attr] = make_proxy(getattr(x, attr), name=inner_name, history=attr_history)
        jit_ctx.add_constraint((clang.check_tensor_shape_and_metadata, inner[attr]))
    proxy = SubclassTensorProxy(layout, inner, outer=x, name=name, history=history)
    jit_ctx.add_constraint((check_subclass, proxy, layout))
    if not x.requires_grad:
        # the prologue unpacks the inner tensors; ops flatten ``proxy`` and the core executor folds
        # that back onto them. An input that requires grad is passed whole instead: autograd must
        # see the subclass object itself, so that its (subclass) gradient reaches it.
        get_tracectx().scopes[-1].append(subclass_unflatten.bind(layout, *inner.values(), output=proxy))
    return proxy


# -- 2. ops on subclass proxies ---------------------------------------------------------------


def _symbol_call(self: Symbol, *args: Any, **kwargs: Any) -> Any:
    if has_subclass_proxy(args, kwargs) and not passes_through(self):
        core = active_core_executor()
        if core is not None:
            subclass_op = dispatch(self, core.aten, args, kwargs)
            if subclass_op is not None:
                return subclass_op(*args, **kwargs)
    result = _originals["Symbol.__call__"](self, *args, **kwargs)
    if self is prims.get_grad and isinstance(result, SubclassTensorProxy):
        result.layout = tangent_layout(args[0])  # the gradient's assumed type, as AOTAutograd guesses it
    return result


# -- 3. isinstance ----------------------------------------------------------------------------


def _isinstance_lookaside(obj: Any, cls: Any) -> Any:
    value = unwrap(obj)
    if not isinstance(value, SubclassTensorProxy):
        return _originals["isinstance"](obj, cls)
    classes = unwrap(cls)
    result = issubclass(value.subclass_type, classes if isinstance(classes, tuple) else (classes,))
    provenance = ProvenanceRecord(
        PseudoInst.LOOKASIDE, inputs=[wrap_const(isinstance).provenance, obj.provenance, cls.provenance]
    )
    return wrap(result, provenance=provenance)


# -- 4. constructing subclasses inside jitted code ----------------------------------------------


def _type_call(wrapped_type: Any, *args: Any, **kwargs: Any) -> Any:
    cls = unwrap(wrapped_type)
    if is_traceable_wrapper_subclass_type(cls):
        core = active_core_executor()
        values = [unwrap(a) for a in (*args, *kwargs.values())]
        if core is not None and any(isinstance(v, TensorProxy) for v in values):
            build = interpreter_needs_wrap(lambda *a, **k: construct(cls, core.aten, a, k))
            return build(*args, **kwargs)
    return _originals["type.__call__"](wrapped_type, *args, **kwargs)


# -- 5. autograd.Function arguments thunder cannot proxy -------------------------------------------


def _siginfo_from_name_and_args(name: str, args: Any) -> SigInfo:
    from thunder.core.proxies import proxy

    signature = SigInfo(name)
    for index, arg in enumerate(args):
        named = arg if isinstance(arg, ProxyInterface) else proxy(arg)
        signature.args.append((named.name if isinstance(named, ProxyInterface) else f"_constant_{index}", None))
    return signature


# -- 6. finding the functions a script compiles (thunderplug explain) --------------------------------


@contextlib.contextmanager
def recording_jitted_functions() -> Iterator[list]:
    import thunder

    recorded: list = []
    original = thunder.jit

    def jit(*args: Any, **kwargs: Any) -> Any:
        jitted = original(*args, **kwargs)
        recorded.append(jitted)
        return jitted

    thunder.jit = jit
    try:
        yield recorded
    finally:
        thunder.jit = original


# -- 7. autograd.Functions claimed whole ----------------------------------------------------------


def _autograd_function_apply(wrapped_cls: Any, *args: Any, **kwargs: Any) -> Any:
    from thunder.core.compile_data import get_compile_data

    cls = unwrap(wrapped_cls)
    compile_data = get_compile_data()
    name = f"{cls.__module__}.{cls.__qualname__}"
    claimed = compile_data is not None and any(
        name in getattr(ex, "whole_functions", ()) for ex in compile_data.executors_list
    )
    core = active_core_executor() if claimed else None
    if core is None:
        return _originals["Function.apply"](wrapped_cls, *args, **kwargs)
    from thunderplug.subclass_ops import subclass_op_symbol

    symbol = subclass_op_symbol(f"{cls.__name__}.apply", cls.apply, core.aten)
    return interpreter_needs_wrap(lambda *a, **k: symbol(*a, **k))(*args, **kwargs)


# -- 8. autograd_function_apply's non_differentiable_idx --------------------------------------------


def _higher_order_autograd_function_apply(fwd: Any, bwd: Any, *args: Any, **kwargs: Any) -> Any:
    result = _originals["autograd_function_apply"](fwd, bwd, *args, **kwargs)
    indices = tuple(unwrap(kwargs["non_differentiable_idx"]) or ()) if "non_differentiable_idx" in kwargs else ()
    if not indices or not hasattr(result, "value"):
        return result
    return interpreter_needs_wrap(_detach_outputs)(result, wrap_const(indices))


def _detach_outputs(output: Any, indices: tuple) -> Any:
    import thunder.torch as ltorch

    if isinstance(output, (tuple, list)):
        return type(output)(
            ltorch.detach(o) if i in indices and isinstance(o, TensorProxy) else o for i, o in enumerate(output)
        )
    return ltorch.detach(output) if 0 in indices and isinstance(output, TensorProxy) else output
