"""Attention functions run as eager runs them, forward and backward: part of the ``eager_backward_kernels``
executor (issue 42: ``nn.MultiheadAttention``, ``nn.TransformerEncoder``/``nn.Transformer`` and SDPA's
``enable_gqa``).

Why: thunder 0.2.6 traces ``F.multi_head_attention_forward`` op by op and differentiates it by its own rules,
whose sums run in other orders than eager's kernels (``in_proj_bias`` 1 ulp off, which AdamW amplifies to 4.5e-2
in three steps on a gradient that is mathematically zero); with a ``key_padding_mask`` or an ``attn_mask`` it fails
("Exception encountered when doing automatic registration for <function multi_head_attention_forward>"). The eval
fast paths of ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` (``torch._native_multi_head_attention``,
``torch._transformer_encoder_layer_fwd``) are "not yet supported". ``F.scaled_dot_product_attention(...,
enable_gqa=True)`` is refused by thunder's symbol; repeating the key and value heads computes eager's values, but
``repeat_interleave``'s backward sums each group of heads in another order than eager's kernel (key and value
weight gradients 1 ulp off, a key bias AdamW turned 5.3e-3 off).

How: each of these calls is one operator calling the torch function itself on the real tensors (its metadata from
the same call on meta tensors); under grad, its backward runs the function again on detached copies of the tensors
that require grad (one per tensor: a self-attention's ``x, x, x`` is one leaf, as in eager, so ``query is key``
holds inside) and asks eager's engine for their gradients, every output's cotangent given: eager's kernels, their
order of sums and their derivative formulas, bit for bit. With dropout (``dropout_p > 0`` in training) the forward
returns the state of the generator it draws from, taken just before, and the backward draws again from that state
and puts the generator back (:mod:`thunderplug_aten_ops.random_ops`): the same mask forward and backward, and the
generator where eager leaves it. SDPA without ``enable_gqa`` (or with as many key as query heads) stays thunder's
symbol and the rules for it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import thunder.torch as ltorch
import torch
import torch.nn.functional as F
from thunder.core import devices, dtypes
from thunder.core.proxies import TensorProxy
from thunder.core.transforms import get_grad, put_grad
from thunder.extend import OperatorExecutor

from thunderplug.tracing.aten import user_location
from thunderplug_aten_ops.random_ops import (
    _call,
    _device,
    _generator,
    _get,
    _leaves,
    _meta,
    _plain,
    generator_replayed,
    input_grads,
)


def _native_mha_meta(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, embed_dim: int, num_head: int,
                     qkv_weight: torch.Tensor, qkv_bias: torch.Tensor, proj_weight: torch.Tensor,
                     proj_bias: torch.Tensor, mask: torch.Tensor | None = None, need_weights: bool = True,
                     average_attn_weights: bool = True, mask_type: int | None = None) -> tuple:
    """``torch._native_multi_head_attention``'s outputs on meta tensors (it has no meta kernel): the attention in
    the query's shape, the weights (averaged over the heads or not) where asked for."""
    out = torch.empty_like(query)
    if not need_weights:
        return out, None
    b, length, source = query.shape[0], query.shape[1], key.shape[1]
    shape = (b, length, source) if average_attn_weights else (b, num_head, length, source)
    return out, query.new_empty(shape)


def _encoder_layer_meta(src: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``torch._transformer_encoder_layer_fwd``'s output on meta tensors (it has no meta kernel): the source's."""
    return torch.empty_like(src)


def _tensors(out: Any) -> list:
    return [o for o in (out if isinstance(out, tuple) else (out,)) if isinstance(o, (torch.Tensor, TensorProxy))]


def _detached(out: Any) -> Any:
    if isinstance(out, tuple):
        return tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in out)
    return out.detach()


class _EagerFunction:
    """The operators of one torch function: ``eager_<name>`` (the call as it is), ``..._forward`` (with the
    generator's state where the call draws random numbers) and ``..._backward`` (eager's autograd of the call)."""

    def __init__(self, executor: OperatorExecutor, name: str, fn: Callable[..., Any],
                 random: Callable[..., bool], meta: Callable[..., Any] | None = None) -> None:
        self.random = random
        meta = meta or fn

        def state_meta(args: tuple, kwargs: dict) -> TensorProxy:
            state = _generator(_device(args, kwargs)).get_state()
            return TensorProxy(shape=tuple(state.shape), device=devices.cpu, dtype=dtypes.uint8, requires_grad=False)

        def forward_meta(leaves: tuple, drawn: bool, *args: Any, **kwargs: Any) -> tuple:
            return _meta(meta, args, kwargs), state_meta(args, kwargs) if drawn else None

        def forward_run(leaves: tuple, drawn: bool, *args: Any, **kwargs: Any) -> tuple:
            state = _generator(_device(args, kwargs)).get_state() if drawn else None
            out, _ = _call(fn, leaves, args, kwargs)
            return _detached(out), state

        def backward_meta(leaves: tuple, state: Any, grads: tuple, *args: Any, **kwargs: Any) -> tuple:
            return tuple(TensorProxy(like=_get(args, kwargs, keys[0]), requires_grad=False) for keys in leaves)

        def backward_run(leaves: tuple, state: Any, grads: tuple, *args: Any, **kwargs: Any) -> tuple:
            with generator_replayed(_generator(_device(args, kwargs)) if state is not None else None, state):
                out, found = _call(fn, leaves, args, kwargs)
                return input_grads(_tensors(out), found, grads)

        self.plain = executor.register_operator(f"eager_{name}", meta=lambda *a, **k: _meta(meta, a, k), fn=fn)
        self.forward = executor.register_operator(f"eager_{name}_forward", meta=forward_meta, fn=forward_run)
        self.backward = executor.register_operator(f"eager_{name}_backward", meta=backward_meta, fn=backward_run)
        executor.register_implementation(self.plain, execution_transform=lambda *a, **k: self.plain(*a, **k),
                                         grad_transform=self.grad)

    def grad(self, *args: Any, **kwargs: Any) -> Any:
        leaves = _leaves(args, kwargs)
        if not leaves:
            return self.plain(*args, **kwargs)
        out, state = self.forward(leaves, bool(self.random(*args, **kwargs)), *args, **kwargs)
        grads = tuple(get_grad(o) if dtypes.is_float_dtype(o.dtype) else None for o in _tensors(out))
        for keys, found in zip(leaves, self.backward(leaves, state, grads, *args, **kwargs)):
            put_grad(_get(args, kwargs, keys[0]), found)
        return out


def _mha_random(*args: Any, **kwargs: Any) -> bool:
    bound = _MHA_SIGNATURE.bind(*args, **kwargs)
    bound.apply_defaults()
    return bool(bound.arguments["training"]) and bound.arguments["dropout_p"] > 0.0


def _sdpa_random(q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0, *_: Any, **__: Any) -> bool:
    return dropout_p > 0.0


def _never(*args: Any, **kwargs: Any) -> bool:
    return False


_MHA_SIGNATURE = inspect.signature(F.multi_head_attention_forward)


def _refuse_subclasses(name: str, args: tuple, kwargs: dict) -> None:
    """A tensor subclass (or a device other than CPU and CUDA) in the call: refused by name and line, never traced
    by other rules than eager's."""
    if not _plain(args, kwargs):
        raise NotImplementedError(
            f"{name}{user_location()}: discover() runs it as eager's own function, on plain CPU or CUDA tensors "
            "only; a tensor subclass or another device reached it; compute it outside the jitted function")


def register(executor: OperatorExecutor) -> None:
    """The lookasides above on ``executor``: ``F.multi_head_attention_forward``, the two eval fast-path functions and
    ``F.scaled_dot_product_attention`` with ``enable_gqa``."""
    for function, name, random, meta in (
            (F.multi_head_attention_forward, "multi_head_attention_forward", _mha_random, None),
            (torch._native_multi_head_attention, "native_multi_head_attention", _never, _native_mha_meta),
            (torch._transformer_encoder_layer_fwd, "transformer_encoder_layer_fwd", _never, _encoder_layer_meta)):
        ops = _EagerFunction(executor, name, function, random, meta)

        def lookaside(*args: Any, _ops: _EagerFunction = ops, _name: str = name, **kwargs: Any) -> Any:
            _refuse_subclasses(_name, args, kwargs)
            return _ops.plain(*args, **kwargs)

        executor._lookasides[function] = lookaside

    gqa = _EagerFunction(executor, "sdpa_enable_gqa", F.scaled_dot_product_attention, _sdpa_random)
    original = executor._lookasides.get(F.scaled_dot_product_attention, ltorch.scaled_dot_product_attention)

    def sdpa(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
             is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:
        grouped = (enable_gqa and isinstance(query, TensorProxy) and isinstance(key, TensorProxy)
                   and key.ndim >= 3 and key.shape[-3] != query.shape[-3])
        if not grouped:  # as many key and value heads as query heads: enable_gqa changes nothing
            return original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale)
        args = (query, key, value, attn_mask, dropout_p, is_causal)
        _refuse_subclasses("scaled_dot_product_attention(enable_gqa=True)", args, {})
        return gqa.plain(*args, scale=scale, enable_gqa=True)

    executor._lookasides[F.scaled_dot_product_attention] = sdpa
