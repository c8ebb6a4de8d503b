"""DTensor gradients with eager's placements when a cotangent arrives placed otherwise than assumed.

A backward is traced before any gradient exists, so the gradient of each DTensor output is
assumed to have the output's placements (AOTAutograd's guess, ``autodiff.tangent_layout``:
``Partial`` becomes ``Replicate``). The real gradient often differs: ``out.sum().backward()`` on a
``Shard(1)`` output sends a ``Replicate`` gradient, ``out.to_local()``'s backward one with the
output's own ``Partial`` placements. ``subclass_flatten`` redistributes it to the assumed ones, so
the values are right, but eager autograd converts nothing: each backward op takes the gradient as
it comes, DTensor's sharding propagation picks the placements of what it computes from that, and
the gradients that reach the inputs end with other placements than the traced backward gives them
(a ``Shard(0)`` weight of ``F.linear``: ``Replicate()`` in eager, ``Shard(0)`` traced).

So a compiled backward that takes DTensor cotangents and ends in DTensor gradients gets two kinds
of ops: ``gradient_context`` for each DTensor cotangent (``None`` at run time when it arrives
placed as assumed, else a description of it, no tensor kept) and one ``eager_gradient_layouts``
before it returns. When every cotangent arrived as assumed, that op returns the gradients as they
are. Otherwise the backward's subclass ops, kept from before unrolling, are traced again on fakes
for the real cotangents (``executor._retrace_stale``: each op for the placements its gradient
then has, as eager's autograd runs them), once per set of cotangent layouts; the gradients'
placements that come out are eager's, and each gradient is redistributed to them. Full values
stay those the compiled backward computed (a redistribute preserves them); where eager's
placement is ``Partial``, the split of the value between ranks can differ from eager's. A replay
that fails raises what eager raises for those placements (DTensor cannot redistribute ``Shard``
to ``Partial``, say).
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

from thunderplug.subclass.values import SubclassLayout, SubclassTensorProxy, is_dtensor, subclass_flatten
from thunderplug.tracing.fake import fake_mode, set_memory_order, strides_in_order, tensor_memory_order

#: ``retrace(bsyms, trace, swap)``: ``executor._retrace_stale``
Retrace = Callable[[list[BoundSymbol], TraceCtx, dict], list[BoundSymbol]]


class GradientLayouts:
    """One compiled backward's DTensor cotangents, its gradients, and its subclass ops from before
    unrolling, to find eager's placements of the gradients for cotangents placed otherwise.
    Passed by reference in traces."""

    def __init__(
        self,
        bsyms: list[BoundSymbol],
        trace: TraceCtx,
        cotangents: list,
        grads: list,
        compile_data: Any,
        retrace: Retrace,
    ):
        # only what a replay reads: the ops' flattens (their staleness) and a trace to name proxies in
        self.bsyms = [_with_flattens_only(b) for b in bsyms]
        self.trace = from_trace(trace)
        self.cotangents, self.grads = cotangents, grads
        self.compile_data, self.retrace = compile_data, retrace
        self.assumed = [c.layout for c in cotangents]
        self._known: list[tuple[tuple, list[SubclassLayout | None] | Exception]] = []

    def __repr__(self) -> str:
        return f"GradientLayouts({len(self.cotangents)} cotangents, {len(self.grads)} gradients)"

    def context(self, index: int, cotangent: torch.Tensor | None) -> _Cotangent | None:
        """``None`` when cotangent ``index`` is placed as the backward assumed, else its description."""
        if cotangent is None or not is_dtensor(type(cotangent)):
            return None  # another type: subclass_flatten converts it or says why not
        if self.assumed[index].places_like(SubclassLayout.of(cotangent)):
            return None
        return _Cotangent(cotangent)

    def eager_layouts(self, contexts: tuple) -> list[SubclassLayout | None]:
        """The layout eager gives each gradient when the cotangents arrive as ``contexts`` say."""
        key = tuple(None if c is None else c.key for c in contexts)
        found = next((result for known, result in self._known if known == key), None)
        if found is None:
            try:
                found = self._replay(contexts)
            except Exception as error:  # noqa: BLE001 - raised below, and again for the same placements
                found = error
            self._known.append((key, found))
        if isinstance(found, Exception):
            raise found
        return found

    def _replay(self, contexts: tuple) -> list[SubclassLayout | None]:
        trace = from_trace(self.trace)
        with compile_data_and_stats(self.compile_data, None), tracectx(trace):
            swap = {
                variableify(cotangent): _proxy_of(context.fake())
                for cotangent, context in zip(self.cotangents, contexts)
                if context is not None
            }
            self.retrace(self.bsyms, trace, swap)
        grads = [swap.get(variableify(g), g) if isinstance(g, TensorProxy) else g for g in self.grads]
        return [g.layout if isinstance(g, SubclassTensorProxy) else None for g in grads]


def _with_flattens_only(bsym: BoundSymbol) -> BoundSymbol:
    """``bsym`` without the decomposition a replay does not read (``_retrace_stale`` reads only the
    ``subclass_flatten``s of an op, to see whether it is stale, and traces stale ops afresh)."""
    if not bsym.subsymbols:
        return bsym
    return bsym.from_bsym(subsymbols=[sub for sub in bsym.subsymbols if sub.sym == subclass_flatten])


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


# -- the ops, run by thunder's python executor ----------------------------------------------------


gradient_context = pythonex.register_operator(
    "gradient_context",
    meta=lambda plan, index, cotangent: AnyProxy(None, prefix="placed"),
    fn=lambda plan, index, cotangent: plan.context(index, cotangent),
    tags=(OpTags.DONT_DCE,),
)


def _conform(plan: GradientLayouts, contexts: tuple, *grads: Any) -> tuple:
    if all(c is None for c in contexts):
        return grads
    return tuple(_converted(g, layout) for g, layout in zip(grads, plan.eager_layouts(contexts)))


def _converted(grad: Any, layout: SubclassLayout | None) -> Any:
    if layout is None or type(grad) is not layout.cls or layout.places_like(SubclassLayout.of(grad)):
        return grad
    from thunderplug.subclass.distributed import redistributed

    return redistributed(grad, layout.ctx[0])


eager_gradient_layouts = pythonex.register_operator(
    "eager_gradient_layouts",
    meta=lambda plan, contexts, *grads: tuple(type(g)(like=g) if isinstance(g, TensorProxy) else g for g in grads),
    fn=_conform,
    tags=(OpTags.DONT_DCE,),
)


def with_eager_gradient_layouts(
    joint: TraceCtx, before_unrolling: list[BoundSymbol], unrolled: TraceCtx, compile_data: Any, retrace: Retrace
) -> TraceCtx:
    """``joint`` (the joint trace, unrolled) with the ops above, when its backward takes DTensor
    cotangents and ends in DTensor gradients. ``before_unrolling`` is the same trace's bound symbols
    before unrolling, in ``unrolled``'s names."""
    grads = _returned_grads(before_unrolling[-1])
    cotangents = [b.output for b in before_unrolling if b.sym.name == "get_grad" and _is_dtensor_proxy(b.output)]
    if not cotangents or not any(_is_dtensor_proxy(g) for g in grads):
        return joint
    at = {b.output.name: i for i, b in enumerate(joint.bound_symbols) if b.sym.name == "get_grad"}
    if len(_returned_grads(joint.bound_symbols[-1])) != len(grads) or any(c.name not in at for c in cotangents):
        return joint  # not the trace it was unrolled from (nothing else makes these)
    plan = GradientLayouts(before_unrolling, unrolled, cotangents, grads, compile_data, retrace)
    result = from_trace(joint)
    inserted: dict[int, BoundSymbol] = {}
    contexts = []
    with tracectx(result):
        for index, cotangent in enumerate(cotangents):
            result.push_scope([])
            contexts.append(gradient_context(plan, index, cotangent))
            inserted[at[cotangent.name]] = _backward(result.pop_scope())
        result.push_scope([])
        new_grads = eager_gradient_layouts(plan, tuple(contexts), *_returned_grads(joint.bound_symbols[-1]))
        conform = _backward(result.pop_scope())
    bsyms = []
    for i, bsym in enumerate(joint.bound_symbols[:-1]):
        bsyms.append(bsym)
        if i in inserted:
            bsyms.append(inserted[i])
    ret = joint.bound_symbols[-1]
    bsyms += [conform, ret.from_bsym(args=({**ret.args[0], "output": tuple(new_grads)}, *ret.args[1:]))]
    result.bound_symbols = bsyms
    return result


def _returned_grads(ret: BoundSymbol) -> list:
    """The gradients a joint trace's return gives its inputs (thunder's ``output`` entry)."""
    return list(ret.args[0]["output"]) if ret.args and isinstance(ret.args[0], dict) else []


def _is_dtensor_proxy(value: Any) -> bool:
    return isinstance(value, SubclassTensorProxy) and is_dtensor(value.layout.cls)


def _backward(scope: list[BoundSymbol]) -> BoundSymbol:
    (bsym,) = scope
    bsym.tags.add(BoundSymbolTag.BACKWARD)
    return bsym
