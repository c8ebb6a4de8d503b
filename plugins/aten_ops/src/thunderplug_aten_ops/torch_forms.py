"""Arguments and forms of torch functions that thunder 0.2.6 refuses while tracing, with or without grad, run as
eager runs them, forward and backward: part of the ``eager_backward_kernels`` executor (once KI-10 of
docs/known-issues.md).

``torch.round``/``Tensor.round`` with ``decimals`` (``round() got an unexpected keyword argument 'decimals'``),
``index_add`` with ``alpha`` (the same for ``alpha``), ``torch.nan_to_num`` with its numbers as keywords
(``positional-only arguments passed as keyword arguments``), ``Tensor.unfold`` under grad (the automatic
registration runs ``F.unfold``'s fake kernel) and ``torch._weight_norm`` (``nn.utils.parametrizations.weight_norm``
and ``nn.utils.weight_norm`` call it: ``not yet supported``) and ``F.embedding``/``nn.Embedding`` with ``max_norm``
(``NotImplementedError``), and ``clone(memory_format=torch.contiguous_format)`` (``only preserve_format is currently
supported``; ``parametrizations.spectral_norm`` clones its ``u``/``v`` so): a clone made contiguous; ``torch.eye``
(not supported): :func:`_eye`; ``torch.empty_strided`` (not supported): the operator ``eager_empty_strided``, eager's
function (its strides are not a trace's to compute). For
``embedding``'s ``max_norm`` the rows read are renormalized in place under no_grad by eager's ``embedding_renorm_``
(the operator ``eager_embedding_renorm``, the identity for gradients, as eager's), then looked up by thunder's
embedding.

How: lookasides of the functions, and of thunder's symbols (what a proxy's method calls), in the compilations that
list the executor. A form thunder computes as eager (``decimals=0``, ``alpha=1``) stays thunder's symbol; nan_to_num's
keywords are passed to thunder's symbol positionally. The others are the operators ``eager_round_decimals``,
``eager_index_add``, ``eager_unfold`` and ``eager_weight_norm``: the torch function itself forward, eager's
autograd through it on the real tensors backward (as :mod:`thunderplug_aten_ops.avg_pool_forms`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import thunder.torch as ltorch
import torch
from thunder.core import devices, dtypes
from thunder.core.proxies import TensorProxy
from thunder.core.transforms import get_grad, put_grad
from thunder.extend import OperatorExecutor

from thunderplug.tracing.fake import to_torch_value


def _meta_tensor(a: Any) -> Any:
    if isinstance(a, TensorProxy):
        return torch.empty(tuple(a.shape), dtype=dtypes.to_torch_dtype(a.dtype), device="meta")
    return to_torch_value(a)


def _register_eager(executor: OperatorExecutor, name: str, fn: Callable[..., torch.Tensor],
                    differentiable: tuple[int, ...]) -> Callable[..., Any]:
    """An operator running ``fn`` (positional arguments) forward, eager's autograd through it backward for the
    tensors at ``differentiable``; the function that calls it with its gradient rule."""

    def meta(*args: Any) -> TensorProxy:
        found = fn(*(_meta_tensor(a) for a in args))
        return TensorProxy(like=args[0], shape=tuple(found.shape))

    def backward_run(grad: torch.Tensor, *args: Any) -> tuple[torch.Tensor, ...]:
        with torch.enable_grad():
            args = list(args)
            leaves = []
            for i in differentiable:
                args[i] = args[i].detach().requires_grad_()
                leaves.append(args[i])
            return tuple(torch.autograd.grad(fn(*args), leaves, grad))

    def backward_meta(grad: TensorProxy, *args: Any) -> tuple[TensorProxy, ...]:
        return tuple(TensorProxy(like=args[i], requires_grad=False) for i in differentiable)

    forward = executor.register_operator(name, meta=meta, fn=fn)
    backward = executor.register_operator(f"{name}_backward", meta=backward_meta, fn=backward_run)

    def grad(*args: Any) -> Any:
        out = forward(*args)
        for i, found in zip(differentiable, backward(get_grad(out), *args)):
            put_grad(args[i], found)
        return out

    executor.register_implementation(forward, execution_transform=lambda *args: forward(*args), grad_transform=grad)
    return forward


def _round_decimals(a: torch.Tensor, decimals: int) -> torch.Tensor:
    return torch.round(a, decimals=decimals)


def _index_add_eager(a: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, alpha: Any):
    return torch.index_add(a, dim, index, source, alpha=alpha)


def _unfold(a: torch.Tensor, dimension: int, size: int, step: int) -> torch.Tensor:
    return a.unfold(dimension, size, step)


def _weight_norm(v: torch.Tensor, g: torch.Tensor, dim: int) -> torch.Tensor:
    return torch._weight_norm(v, g, dim)


def _embedding_renorm(weight: torch.Tensor, indices: torch.Tensor, max_norm: float, norm_type: float) -> torch.Tensor:
    """Eager's ``F.embedding(max_norm=...)``: the rows ``indices`` reads renormalized in place, without grad."""
    with torch.no_grad():
        torch.embedding_renorm_(weight, indices, max_norm, norm_type)
    return weight


def register(executor: OperatorExecutor) -> None:
    """The operators and lookasides above on ``executor``."""
    round_decimals = _register_eager(executor, "eager_round_decimals", _round_decimals, (0,))
    index_add_eager = _register_eager(executor, "eager_index_add", _index_add_eager, (0, 3))
    unfold = _register_eager(executor, "eager_unfold", _unfold, (0,))
    weight_norm = _register_eager(executor, "eager_weight_norm", _weight_norm, (0, 1))

    def round_(a: Any, *, decimals: int = 0) -> Any:
        if decimals == 0 or not isinstance(a, TensorProxy):
            return ltorch.round(a)
        return round_decimals(a, decimals)

    def index_add(a: Any, dim: int, index: Any, source: Any, *, alpha: Any = 1) -> Any:
        if not isinstance(a, TensorProxy):
            return ltorch.index_add(a, dim, index, source)
        return index_add_eager(a, dim, index, source, alpha)

    def nan_to_num(a: Any, nan: Any = 0.0, posinf: Any = None, neginf: Any = None, *, out: Any = None) -> Any:
        return ltorch.nan_to_num(a, nan, posinf, neginf, out=out)

    def unfold_(a: Any, dimension: int, size: int, step: int) -> Any:
        if not isinstance(a, TensorProxy):
            return ltorch.unfold(a, dimension, size, step)
        return unfold(a, dimension, size, step)

    def weight_norm_(v: Any, g: Any, dim: int = 0) -> Any:
        return weight_norm(v, g, dim)

    executor._lookasides[torch._weight_norm] = weight_norm_

    def renorm_meta(weight: Any, indices: Any, max_norm: float, norm_type: float) -> TensorProxy:
        return TensorProxy(like=weight)

    renorm = executor.register_operator("eager_embedding_renorm", meta=renorm_meta, fn=_embedding_renorm)

    def renorm_grad(weight: Any, indices: Any, max_norm: float, norm_type: float) -> Any:
        out = renorm(weight, indices, max_norm, norm_type)
        put_grad(weight, get_grad(out))  # eager renormalizes under no_grad: the gradient is the embedding's
        return out

    executor.register_implementation(renorm, execution_transform=renorm, grad_transform=renorm_grad)
    original_embedding = executor._lookasides.get(torch.nn.functional.embedding, ltorch.embedding)

    def embedding(a: Any, weight: Any, padding_idx: Any = None, max_norm: Any = None, norm_type: float = 2.0,
                  scale_grad_by_freq: bool = False, sparse: bool = False) -> Any:
        if max_norm is not None and isinstance(weight, TensorProxy):
            weight = renorm(weight, a, float(max_norm), float(norm_type))
        return original_embedding(a, weight, padding_idx, None, norm_type, scale_grad_by_freq, sparse)

    executor._lookasides[torch.nn.functional.embedding] = embedding

    def clone(a: Any, *, memory_format: torch.memory_format = torch.preserve_format) -> Any:
        if memory_format is torch.contiguous_format and isinstance(a, TensorProxy):
            return ltorch.contiguous(ltorch.clone(a))
        return ltorch.clone(a, memory_format=memory_format)

    for function in (torch.clone, torch.Tensor.clone, ltorch.clone):
        executor._lookasides[function] = clone
    executor._lookasides[torch.eye] = _eye
    empty_strided = executor.register_operator("eager_empty_strided", meta=_empty_strided_meta,
                                               fn=torch.empty_strided)

    def empty_strided_(size: Any, stride: Any, *, dtype: torch.dtype | None = None, layout: Any = None,
                       device: Any = None, pin_memory: bool = False, requires_grad: bool = False) -> Any:
        """``torch.empty_strided`` (thunder 0.2.6: ``not yet supported``): eager's function at its place in the trace,
        so the tensor has eager's strides; other layouts, pinned memory and ``requires_grad`` stay refused."""
        if layout not in (None, torch.strided) or pin_memory or requires_grad:
            raise NotImplementedError(
                "torch.empty_strided: only strided tensors without pin_memory or requires_grad are supported under "
                "discover()"
            )
        dtype = torch.get_default_dtype() if dtype is None else dtype
        device = torch.get_default_device() if device is None else torch.device(device)
        return empty_strided(tuple(int(n) for n in size), tuple(int(n) for n in stride), dtype=dtype, device=device)

    executor._lookasides[torch.empty_strided] = empty_strided_

    for function, symbol, lookaside in (
            (torch.round, ltorch.round, round_), (torch.index_add, ltorch.index_add, index_add),
            (torch.nan_to_num, ltorch.nan_to_num, nan_to_num), (torch.Tensor.unfold, ltorch.unfold, unfold_)):
        executor._lookasides[function] = lookaside
        executor._lookasides[symbol] = lookaside
        method = getattr(torch.Tensor, function.__name__, None)
        if method is not None:
            executor._lookasides[method] = lookaside


def _empty_strided_meta(size: tuple[int, ...], stride: tuple[int, ...], *, dtype: torch.dtype,
                        device: torch.device) -> TensorProxy:
    return TensorProxy(shape=size, device=devices.to_device(device), dtype=dtypes.to_dtype(dtype),
                       requires_grad=False)


def _eye(n: int, m: int | None = None, *, dtype: torch.dtype | None = None, layout: Any = None, device: Any = None,
         pin_memory: bool = False, requires_grad: bool = False) -> Any:
    """``torch.eye`` (thunder 0.2.6 has none: ``not yet supported``; ``parametrizations.orthogonal``'s Cayley map):
    the comparison of a column of row indices with a row of column indices, in eager's dtype; other layouts, pinned
    memory and ``requires_grad`` stay refused."""
    if layout not in (None, torch.strided) or pin_memory or requires_grad:
        raise NotImplementedError("torch.eye: only strided tensors without pin_memory or requires_grad are supported "
                                  "under discover()")
    m = n if m is None else m
    rows = ltorch.unsqueeze(ltorch.arange(n, device=device), 1)
    return ltorch.to(ltorch.eq(rows, ltorch.unsqueeze(ltorch.arange(m, device=device), 0)),
                     dtype if dtype is not None else torch.get_default_dtype())
