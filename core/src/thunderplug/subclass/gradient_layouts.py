"""Gradients with eager's layouts when a cotangent arrives with another context than assumed.

A backward is traced before any gradient exists, so the gradient of each subclass output is
assumed to have the output's layout (AOTAutograd's guess, ``autodiff.tangent_layout``). For a
DTensor output the real gradient often has other placements: ``out.sum().backward()`` on a
``Shard(1)`` output sends a ``Replicate`` gradient, ``out.to_local()``'s backward one with the
output's own ``Partial`` placements where the guess is ``Replicate``. ``subclass_flatten``
converts it to the assumed placements (a redistribute), so the values are right, but eager
autograd converts nothing: each backward op takes the gradient as it comes, DTensor's sharding
propagation picks its output placements from that, and the parameters' gradients end with other
placements than the traced backward gives them (a ``Shard(0)`` weight's gradient ``Replicate()``
in eager, ``Shard(0)`` here).

So when a compiled backward ends in gradients of such types, it gets two kinds of ops:
``gradient_context`` after each subclass cotangent (``None`` at run time when it arrives as
assumed, else a fake copy of it) and one ``eager_gradient_layouts`` before it returns. When every
cotangent arrived as assumed, that op returns the gradients as they are. Otherwise the backward's
subclass ops (kept from before unrolling) are traced again on fakes for the real cotangents, as
eager's autograd would run them; the layouts of the gradients that come out (cached per set of
cotangent layouts) are the ones eager gives, and each gradient is converted to its layout with
the subclass's ``__coerce_same_metadata_as_tangent__``. Full values are eager's (a redistribute
preserves them); where eager's layout is ``Partial`` the split of the value between ranks may
differ from eager's. A replay that fails raises what eager raises for those placements.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from thunder.core.compile_data import compile_data_and_stats
from thunder.core.prims import OpTags
from thunder.core.proxies import AnyProxy, TensorProxy, tensorproxy, variableify
from thunder.core.symbol import BoundSymbol, BoundSymbolTag
from thunder.core.trace import TraceCtx, from_trace, tracectx
from thunder.executors.pythonex import ex as pythonex
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from thunderplug.fake import fake_mode, set_memory_order, strides_in_order, tensor_memory_order
from thunderplug.subclass.values import SubclassLayout, SubclassTensorProxy


def _converts(layout: SubclassLayout) -> bool:
    return hasattr(layout.cls, "__coerce_same_metadata_as_tangent__")


class GradientLayouts:
    """The backward's subclass ops, its cotangents and its gradients, to find eager's layouts of
    the gradients for cotangents that arrive with other contexts. Passed by reference in traces."""

    def __init__(
        self,
        bsyms: list[BoundSymbol],
        trace: TraceCtx,
        cotangents: list[SubclassTensorProxy],
        grads: list[Any],
        compile_data: Any,
        retrace: Callable[[list[BoundSymbol], TraceCtx, dict], list[BoundSymbol]],
    ):
        self.bsyms, self.trace, self.cotangents, self.grads = bsyms, trace, cotangents, grads
        self.compile_data, self.retrace = compile_data, retrace
        self.assumed = [c.layout for c in cotangents]
        self._known: list[tuple[tuple, list[SubclassLayout | None] | Exception]] = []

    def __repr__(self) -> str:
        return f"GradientLayouts({len(self.cotangents)} cotangents, {len(self.grads)} gradients)"

    def context(self, index: int, cotangent: torch.Tensor | None) -> Any:
        """``None`` when cotangent ``index`` has the layout the backward assumed, else its description."""
        if cotangent is None or not is_traceable_wrapper_subclass(cotangent):
            return None
        if self.assumed[index].same_as(SubclassLayout.of(cotangent)):
            return None
        return _Cotangent(cotangent)

    def eager_layouts(self, contexts: tuple) -> list[SubclassLayout | None]:
        """The layout eager gives each gradient when the cotangents arrive as ``contexts`` say."""
        key = tuple(None if c is None else c.key for c in contexts)
        for known, result in self._known:
            if known == key:
                break
        else:
            try:
                result = self._replay(contexts)
            except Exception as error:  # noqa: BLE001 - raised below, and again for the same contexts
                result = error
            self._known.append((key, result))
        if isinstance(result, Exception):
            raise result
        return result

    def _replay(self, contexts: tuple) -> list[SubclassLayout | None]:
        trace = from_trace(self.trace)
        with compile_data_and_stats(self.compile_data, None), tracectx(trace):
            swap = {
                variableify(cotangent): _proxy_of(context.fake())
                for cotangent, context in zip(self.cotangents, contexts)
                if context is not None
            }
            self.retrace(self.bsyms, trace, swap)
        layouts: list[SubclassLayout | None] = []
        for grad in self.grads:
            grad = swap.get(variableify(grad), grad) if isinstance(grad, TensorProxy) else grad
            layouts.append(grad.layout if isinstance(grad, SubclassTensorProxy) else None)
        return layouts


class _Cotangent:
    """A cotangent's layout and its inner tensors' metadata, recursively (no tensor is kept):
    what the backward traced for it depends on."""

    __slots__ = ("layout", "inner", "key")

    def __init__(self, tensor: torch.Tensor):
        self.layout = SubclassLayout.of(tensor)
        self.inner: list[_Cotangent | tuple] = []
        for name in self.layout.attrs:
            value = getattr(tensor, name)
            if is_traceable_wrapper_subclass(value):
                self.inner.append(_Cotangent(value))
            else:
                self.inner.append((tuple(value.shape), value.dtype, value.device, tensor_memory_order(value)))
        layout = self.layout
        inner_keys = tuple(part.key if isinstance(part, _Cotangent) else part for part in self.inner)
        self.key = (layout.cls, layout.attrs, layout.ctx, layout.outer_size, layout.outer_stride, inner_keys)

    def fake(self) -> torch.Tensor:
        values = {}
        for name, part in zip(self.layout.attrs, self.inner):
            if isinstance(part, _Cotangent):
                values[name] = part.fake()
                continue
            shape, dtype, device, order = part
            with fake_mode():
                values[name] = torch.empty_strided(shape, strides_in_order(shape, order), dtype=dtype, device=device)
        with fake_mode():
            return self.layout.unflatten(values)


def _proxy_of(tensor: torch.Tensor) -> SubclassTensorProxy:
    """A proxy for a (fake) subclass tensor, in the trace being recorded."""
    layout = SubclassLayout.of(tensor)
    inner: dict[str, TensorProxy] = {}
    for attr in layout.attrs:
        value = getattr(tensor, attr)
        if is_traceable_wrapper_subclass(value):
            inner[attr] = _proxy_of(value)
        else:
            inner[attr] = tensorproxy(value, name=None)
            set_memory_order(inner[attr], tensor_memory_order(value))
    return SubclassTensorProxy(layout, inner, outer=tensor)


# -- the ops ---------------------------------------------------------------------------------------


def _context_meta(plan: GradientLayouts, index: int, cotangent: TensorProxy) -> AnyProxy:
    return AnyProxy(None, prefix="ctx")


gradient_context = pythonex.register_operator(
    "gradient_context",
    meta=_context_meta,
    fn=lambda plan, index, cotangent: plan.context(index, cotangent),
    tags=(OpTags.DONT_DCE,),
)


def _conform_meta(plan: GradientLayouts, contexts: tuple, *grads: Any) -> tuple:
    return tuple(type(g)(like=g) if isinstance(g, TensorProxy) else g for g in grads)


def _conform(plan: GradientLayouts, contexts: tuple, *grads: Any) -> tuple:
    if all(c is None for c in contexts):
        return grads
    layouts = plan.eager_layouts(contexts)
    return tuple(_converted(g, layout) for g, layout in zip(grads, layouts))


def _converted(grad: Any, layout: SubclassLayout | None) -> Any:
    if grad is None or layout is None or not is_traceable_wrapper_subclass(grad):
        return grad
    if type(grad) is not layout.cls or layout.same_as(SubclassLayout.of(grad)):
        return grad
    from torch.distributed.tensor import DTensor

    if layout.cls is DTensor:  # eager's can be Partial, which the protocol's redistribute refuses
        from thunderplug.distributed import redistributed

        return redistributed(grad, layout.ctx[0])
    return grad.__coerce_same_metadata_as_tangent__(layout.ctx)


eager_gradient_layouts = pythonex.register_operator(
    "eager_gradient_layouts", meta=_conform_meta, fn=_conform, tags=(OpTags.DONT_DCE,)
)


def with_eager_gradient_layouts(
    joint: TraceCtx,
    backward_bsyms: list[BoundSymbol],
    unrolled: TraceCtx,
    compile_data: Any,
    retrace: Callable[[list[BoundSymbol], TraceCtx, dict], list[BoundSymbol]],
) -> TraceCtx:
    """``joint`` (the unrolled joint trace) with the two kinds of ops above, when its backward
    ends in gradients of a type that converts between contexts and takes such cotangents."""
    ret = joint.bound_symbols[-1]
    grads = ret.args[0].get("output") if isinstance(ret.args[0], dict) else None
    if not grads or not any(isinstance(g, SubclassTensorProxy) and _converts(g.layout) for g in grads):
        return joint
    cotangent_defs = [
        (i, bsym)
        for i, bsym in enumerate(joint.bound_symbols)
        if bsym.sym.name == "get_grad" and isinstance(bsym.output, SubclassTensorProxy) and _converts(bsym.output.layout)
    ]
    if not cotangent_defs:
        return joint
    cotangents = [bsym.output for _, bsym in cotangent_defs]
    plan = GradientLayouts(backward_bsyms, unrolled, cotangents, list(grads), compile_data, retrace)
    result = from_trace(joint)
    contexts = []
    bsyms = list(joint.bound_symbols[:-1])
    with tracectx(result):
        for n, (i, _) in enumerate(reversed(cotangent_defs)):
            index = len(cotangent_defs) - 1 - n
            result.push_scope([])
            context = gradient_context(plan, index, cotangents[index])
            (bound,) = result.pop_scope()
            bound.tags.add(BoundSymbolTag.BACKWARD)
            bsyms.insert(i + 1, bound)
            contexts.insert(0, context)
        result.push_scope([])
        new_grads = eager_gradient_layouts(plan, tuple(contexts), *grads)
        (bound,) = result.pop_scope()
        bound.tags.add(BoundSymbolTag.BACKWARD)
    bsyms.append(bound)
    new_return_args = {**ret.args[0], "output": tuple(new_grads)}
    bsyms.append(ret.from_bsym(args=(new_return_args, *ret.args[1:])))
    result.bound_symbols = bsyms
    return result
