"""Random ops under grad draw eager's random numbers, and their backward reuses them: part of the
``eager_backward_kernels`` executor (issue 42, silently wrong before).

Why: with gradients enabled thunder 0.2.6 differentiates ``F.dropout`` (``nn.Dropout``) through its decomposition,
``uniform < p``, which draws other numbers than eager's ``bernoulli_`` (another mask for the same seed); ``SDPA`` with
``dropout_p > 0`` likewise; and ``F.dropout1d``/``2d``/``3d``, ``F.alpha_dropout``, ``F.feature_alpha_dropout``,
``torch.dropout`` & co. (thunder's automatic registrations) run eager's function forward but differentiate it by
running it again in the backward: a second mask, so the gradient is not the forward's, and the generator is left two
draws ahead of eager's.

How: the op runs as the torch function itself, forward, on the real tensors (with eager's ``requires_grad`` flags, so
that eager's kernel choice is the same), and returns with its output the state of the generator it draws from (torch's
CPU generator or the tensors' CUDA device's), taken just before. Its backward sets that generator to the saved state,
runs the function again under eager's autograd (the same numbers, so the same mask: the forward's), differentiates it,
and puts the generator back as it found it, as ``torch.utils.checkpoint`` does with ``preserve_rng_state``. Forward and
backward are then eager's bit for bit, and the generator ends where eager leaves it. Without grad the op is the torch
function itself. Declined (thunder's as before): dropout that is not random (``training=False``, ``p == 0``), inputs
off CPU and CUDA, tensor subclasses.

Samplers (:func:`register_samplers`): thunder 0.2.6 has no ``Tensor.bernoulli_``/``normal_``/``uniform_``/
``random_``/``geometric_``/``log_normal_``/``cauchy_`` (``Unknown attribute bernoulli_``: torchvision's stochastic
depth, Swin, EfficientNet), no ``torch.randperm``, and its ``exponential_`` (``-log(uniform)``) and, in reduced
precision, ``torch.bernoulli`` (``uniform < p``) draw other numbers than eager's kernels. Each is an operator running
the torch function itself, at its place in the trace, so that it draws what eager draws where eager draws it; an
in-place sampler fills a fresh tensor like its target, which thunder's ``copy_`` then updates (a buffer, a view of
one, a fresh tensor). An explicit ``generator=`` (of these and of ``torch.randn``/``rand``/``randint``/
``multinomial``, which thunder refuses) cannot be a trace value: the graph breaks at the call, so Dynamo runs it with
the user's generator (:func:`_break_at_generator`). ``torch.bernoulli(p)`` of probabilities requiring grad gets
eager's zero gradient (its own grad rule). ``F.dropout(a, inplace=True)`` (thunder: ``Only inplace=False``)
is the out-of-place rule's result written into ``a`` by ``copy_``, as eager's ``dropout_`` computes it.
``torch.normal(mean, std)`` with a tensor mean or std (thunder has no ``torch.normal``) is eager's function, with
eager's zero gradients to mean and std; with numbers for both it is refused by name and line.
Refused by name and line: an in-place sampler of a tensor computed under
grad from one requiring grad (eager's zero gradient through it, which thunder's in-place handling drops) and
``bernoulli(a, p)`` with a number ``p`` of such a tensor (eager's backward raises: no derivative).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import thunder.torch as ltorch
import torch
import torch.nn.functional as F
from thunder.core import devices, dtypes, prims
from thunder.core.compile_data import get_compile_data
from thunder.core.jit_ext import get_jit_ctx
from thunder.core.proxies import ProxyTag, TensorProxy
from thunder.core.pytree import tree_flatten, tree_map
from thunder.core.transforms import get_grad, put_grad
from thunder.extend import OperatorExecutor

from thunderplug.eager.output_grads import requires_grad
from thunderplug.thunder_compat import torch_to_thunder_function_map
from thunderplug.tracing.aten import DataDependentShapeError, user_location
from thunderplug.tracing.fake import to_torch_value

#: the tags of the operators that draw: kept where their result is unused (eager draws, and later draws depend on it),
#: in the forward where only the backward reads it, never recomputed (``RANDOM_OP``: rematerialization leaves them)
DRAWS = [prims.OpTags.DONT_DCE, prims.OpTags.RANDOM_OP]

#: thunder's automatic registrations of random torch functions (their backward runs the function again)
_REGISTERED = (
    F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout, F.gumbel_softmax,
    torch.dropout, torch.alpha_dropout, torch.feature_dropout, torch.feature_alpha_dropout,
)


def _generator(device: torch.device) -> torch.Generator:
    """The generator eager's kernels on ``device`` draw from."""
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return torch.default_generator


@contextlib.contextmanager
def generator_replayed(generator: torch.Generator | None, state: torch.Tensor | None) -> Iterator[None]:
    """``generator`` set to the forward's ``state`` inside, its own state back after: a backward that runs the
    function again draws the forward's numbers (dropout masks) and leaves the stream where eager's is.
    ``None``: the function drew nothing."""
    if generator is None:
        yield
        return
    now = generator.get_state()
    generator.set_state(state)
    try:
        yield
    finally:
        generator.set_state(now)


def input_grads(outputs: Sequence[torch.Tensor], leaves: Sequence[torch.Tensor],
                cotangents: Sequence[torch.Tensor | None]) -> tuple[torch.Tensor, ...]:
    """Each leaf's gradient from eager's engine, given each output's cotangent (``None``: none flows from that
    output); zeros for a leaf no cotangent reaches, as a thunder backward expects a tensor."""
    pairs = [(o, g) for o, g in zip(outputs, cotangents) if g is not None and o.requires_grad]
    found = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs],
                                allow_unused=True) if pairs else (None,) * len(leaves)
    return tuple(torch.zeros_like(leaf) if g is None else g for leaf, g in zip(leaves, found))


def _device(args: tuple, kwargs: dict) -> torch.device | None:
    for a in tree_flatten((args, kwargs))[0]:
        if isinstance(a, TensorProxy):
            return devices.to_torch_device(a.device)
        if isinstance(a, torch.Tensor):
            return a.device
    return None


def _plain(args: tuple, kwargs: dict) -> bool:
    """Plain tensors (no subclass) on CPU or CUDA."""
    tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, TensorProxy)]
    return bool(tensors) and all(
        type(t) is TensorProxy and devices.to_torch_device(t.device).type in ("cpu", "cuda") for t in tensors
    )


def _leaves(args: tuple, kwargs: dict) -> tuple[tuple[int | str, ...], ...]:
    """The positions (and keywords) of the float tensors the trace's data flow says may require grad, grouped by
    tensor (one passed twice, SDPA's ``q, q, q``, is one leaf, as in eager)."""
    found: dict[str, list[int | str]] = {}
    for key, a in (*enumerate(args), *kwargs.items()):
        if isinstance(a, TensorProxy) and dtypes.is_float_dtype(a.dtype) and requires_grad(a) is not False:
            found.setdefault(a.name, []).append(key)
    return tuple(tuple(keys) for keys in found.values())


def _get(args: tuple, kwargs: dict, key: int | str) -> Any:
    return args[key] if isinstance(key, int) else kwargs[key]


def _call(fn: Callable[..., Any], leaves: tuple, args: tuple, kwargs: dict) -> tuple[torch.Tensor, list]:
    """``fn`` on the real tensors under eager's autograd, with the tensors at each group of ``leaves`` one detached
    leaf."""
    args, kwargs, found = list(args), dict(kwargs), []
    for keys in leaves:
        leaf = _get(args, kwargs, keys[0]).detach().requires_grad_()
        for key in keys:
            if isinstance(key, int):
                args[key] = leaf
            else:
                kwargs[key] = leaf
        found.append(leaf)
    with torch.enable_grad():
        return fn(*args, **kwargs), found


def _meta(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """The outputs' metadata (a tensor, or a tuple of tensors and ``None``) from ``fn`` on meta tensors."""

    def meta(a: Any) -> Any:
        if isinstance(a, TensorProxy):
            return torch.empty(tuple(a.shape), dtype=dtypes.to_torch_dtype(a.dtype), device="meta")
        return to_torch_value(a)

    with torch.no_grad():
        out = fn(*tree_map(meta, args), **tree_map(meta, kwargs))
    like = next(a for a in tree_flatten((args, kwargs))[0] if isinstance(a, TensorProxy))

    def proxy(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        return TensorProxy(like=like, shape=tuple(t.shape), dtype=dtypes.to_dtype(t.dtype), requires_grad=False)

    return tuple(proxy(t) for t in out) if isinstance(out, tuple) else proxy(out)


def _register(executor: OperatorExecutor, name: str, fn: Callable[..., Any]) -> tuple[Any, Callable[..., Any]]:
    """The operators ``eager_random_<name>`` (no grad), ``..._forward`` (with the generator's state) and
    ``..._backward``; returns the first and the gradient rule calling the other two."""

    def state_meta(args: tuple, kwargs: dict) -> TensorProxy:
        state = _generator(_device(args, kwargs)).get_state()
        return TensorProxy(shape=tuple(state.shape), device=devices.cpu, dtype=dtypes.uint8, requires_grad=False)

    def forward_meta(leaves: tuple, *args: Any, **kwargs: Any) -> tuple[TensorProxy, TensorProxy]:
        return _meta(fn, args, kwargs), state_meta(args, kwargs)

    def forward_run(leaves: tuple, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        state = _generator(_device(args, kwargs)).get_state()
        out, _ = _call(fn, leaves, args, kwargs)
        return out.detach(), state

    def backward_meta(leaves: tuple, state: Any, grad: Any, *args: Any, **kwargs: Any) -> tuple[TensorProxy, ...]:
        return tuple(TensorProxy(like=_get(args, kwargs, keys[0]), requires_grad=False) for keys in leaves)

    def backward_run(leaves: tuple, state: torch.Tensor, grad: torch.Tensor, *args: Any, **kwargs: Any) -> tuple:
        with generator_replayed(_generator(_device(args, kwargs)), state):
            out, found = _call(fn, leaves, args, kwargs)
            return input_grads((out,), found, (grad,))

    plain = executor.register_operator(f"eager_random_{name}", meta=lambda *a, **k: _meta(fn, a, k), fn=fn,
                                       tags=DRAWS)
    forward = executor.register_operator(f"eager_random_{name}_forward", meta=forward_meta, fn=forward_run,
                                         tags=DRAWS)
    backward = executor.register_operator(f"eager_random_{name}_backward", meta=backward_meta, fn=backward_run)

    def grad(*args: Any, **kwargs: Any) -> Any:
        leaves = _leaves(args, kwargs)
        if not leaves:
            return plain(*args, **kwargs)
        out, state = forward(leaves, *args, **kwargs)
        for keys, found in zip(leaves, backward(leaves, state, get_grad(out), *args, **kwargs)):
            put_grad(_get(args, kwargs, keys[0]), found)
        return out

    return plain, grad


def _dropout_random(a: Any, p: Any = 0.5, training: bool = True, inplace: bool = False) -> bool:
    return training and not inplace and p != 0


def _sdpa_random(q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0, *_: Any, **__: Any) -> bool:
    return dropout_p != 0.0


def _rrelu_random(a: Any, lower: float = 0.125, upper: float = 1 / 3, training: bool = False,
                  inplace: bool = False) -> bool:
    return training and not inplace


def register(executor: OperatorExecutor) -> None:
    """The rules above on ``executor``: for ``ltorch.dropout``, ``ltorch.scaled_dot_product_attention`` and
    ``ltorch.rrelu`` where they draw random numbers, and for thunder's registrations of :data:`_REGISTERED`."""
    symbols = torch_to_thunder_function_map()
    cases: list[tuple[Any, str, Callable[..., Any], Callable[..., bool]]] = [
        (ltorch.dropout, "dropout", F.dropout, _dropout_random),
        (ltorch.scaled_dot_product_attention, "sdpa", F.scaled_dot_product_attention, _sdpa_random),
        (ltorch.rrelu, "rrelu", F.rrelu, _rrelu_random),
    ]
    for function in _REGISTERED:
        symbol = symbols.get(function)
        if symbol is not None:
            cases.append((symbol, f"{function.__module__.rsplit('.', 1)[-1]}_{function.__name__}", function,
                          lambda *a, **k: True))
    for symbol, name, fn, random in cases:
        plain, grad = _register(executor, name, fn)

        def checker(*args: Any, _random: Callable[..., bool] = random, **kwargs: Any) -> bool:
            return _plain(args, kwargs) and _random(*args, **kwargs)

        executor.register_implementation(
            symbol, checker=checker, execution_transform=lambda *a, _p=plain, **k: _p(*a, **k), grad_transform=grad
        )


# -- samplers thunder lacks or draws otherwise: in-place random methods, torch.bernoulli, torch.randperm ----------

#: ``torch.Tensor``'s in-place random methods: thunder has none but ``exponential_`` (which draws other numbers
#: than eager's: ``-log(uniform)``, eager's kernel another transformation)
INPLACE_SAMPLERS = ("bernoulli_", "normal_", "uniform_", "exponential_", "random_", "geometric_", "log_normal_",
                    "cauchy_")


def _break_at_generator(op: str, generator: Any) -> None:
    """A ``torch.Generator`` object cannot be a value of a thunder trace (its state is the program's): the
    compilation breaks the graph at the call (``wiring.graph_breaks``), so Dynamo runs it eagerly with the
    user's generator, thunder compiling the graphs around it."""
    if generator is not None:
        location = user_location()
        raise DataDependentShapeError(
            f"{op}(..., generator=...){location}: a torch.Generator cannot be a value of a thunder trace",
            op=f"{op}(generator=...)", location=location,
            why="draws from a torch.Generator object, which cannot be a value of a thunder 0.2.6 trace",
            advice="For one trace, draw from the default generator (torch.manual_seed).",
        )


#: symbols reading only their tensor argument's metadata: their results do not require grad, as in eager
_METADATA_ONLY = frozenset({
    "empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like", "new_empty",
    "new_zeros", "new_ones", "new_full", "new_tensor",
})


def _follow(bsyms: list, derived: set[str]) -> None:
    """Adds to ``derived`` the names of the floating values ``bsyms`` compute from a tensor requiring grad (or
    from one in ``derived``), except through :data:`_METADATA_ONLY` and ``detach``/``no_grad`` results."""
    for bsym in bsyms:
        if bsym.sym.name in _METADATA_ONLY:
            continue
        if not any(p.requires_grad or p.name in derived for p in bsym.flat_proxy_args if isinstance(p, TensorProxy)):
            continue
        derived.update(
            o.name for o in bsym.flat_proxy_outs
            if isinstance(o, TensorProxy) and dtypes.is_inexact_dtype(o.dtype)
            and ProxyTag.DETACHED_AUTOGRAD_GRAPH not in o.tags and bsym.sym.name != "detach"
        )


def _refuse_grad(op: str, a: Any, *, inputs: bool = False) -> None:
    """``a`` computed, under grad, from a tensor requiring grad: eager's sampler gives it a zero gradient (its
    output requires grad), which thunder 0.2.6's autodiff drops (the output would not require grad, the tensors
    before it would get no gradient instead of zeros, and AdamW would skip them): refused by name and line. An
    input requiring grad too with ``inputs``; without, it is left to the in-place check, which raises eager's leaf
    error."""
    compile_data = get_compile_data()
    if not isinstance(a, TensorProxy) or compile_data is None or not compile_data.is_grad_enabled:
        return
    if a.requires_grad and not inputs:
        return
    derived: set[str] = set()
    for scope in get_jit_ctx().computation_trace.scopes:
        _follow(scope, derived)
    if a.requires_grad or a.name in derived:
        raise NotImplementedError(
            f"thunderplug: {op} of a tensor that requires grad{user_location()}: eager gives it a zero gradient "
            "(the result requires grad), which thunder 0.2.6 cannot reproduce; apply it to a detached tensor "
            "(`t.detach()`) or under torch.no_grad()."
        )


def _sample_meta(a: TensorProxy, *args: Any, **kwargs: Any) -> TensorProxy:
    return TensorProxy(like=a, requires_grad=False)


def _register_sampler(executor: OperatorExecutor, name: str, fn: Callable[..., torch.Tensor],
                      meta: Callable[..., TensorProxy]) -> Any:
    """The operator ``eager_random_<name>`` running ``fn`` (which draws from the generator at its place in the
    trace, as eager's op at its place in the program); no gradient flows through it (:func:`_refuse_grad` refuses
    where eager's zero gradient would matter)."""
    op = executor.register_operator(f"eager_random_{name}", meta=meta, fn=fn, tags=DRAWS)
    executor.register_implementation(op, execution_transform=op, grad_transform=op)
    return op


def _inplace_sample(name: str) -> Callable[..., torch.Tensor]:
    def sample(a: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``a.<name>(...)`` on a fresh tensor like ``a`` (its shape, dtype, device and strides: the same draws)."""
        return getattr(torch.empty_like(a), name)(*args, **kwargs)

    sample.__name__ = f"eager_{name}"
    return sample


def _bernoulli(a: torch.Tensor, *args: Any) -> torch.Tensor:
    return torch.bernoulli(a, *args)


def _normal(mean: Any, std: Any) -> torch.Tensor:
    return torch.normal(mean, std)


def _unsupported_normal(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError(
        f"thunderplug: torch.normal with numbers for both mean and std, a size or out={user_location()} is not "
        "supported inside a thunder.jit function (thunder 0.2.6 has no torch.normal): draw it outside the function "
        "and pass it in"
    )


def _multinomial_meta(a: TensorProxy, num_samples: int, replacement: bool) -> TensorProxy:
    return TensorProxy(like=a, shape=(*a.shape[:-1], num_samples), dtype=dtypes.int64, requires_grad=False)


def _randperm(n: int, dtype: Any, device: Any) -> torch.Tensor:
    return torch.randperm(n, dtype=dtypes.to_torch_dtype(dtype), device=devices.to_torch_device(device))


def _randperm_meta(n: int, dtype: Any, device: Any) -> TensorProxy:
    return TensorProxy(shape=(n,), device=devices.to_device(device), dtype=dtypes.to_dtype(dtype),
                       requires_grad=False)


def register_samplers(executor: OperatorExecutor) -> None:
    """Lookasides on ``executor`` for :data:`INPLACE_SAMPLERS` (``t.bernoulli_(p)`` is ``t.copy_(s)`` of the
    operator ``s`` drawing like eager's ``bernoulli_`` on a tensor like ``t``; thunder's in-place handling then
    updates ``t``, a fresh tensor or a buffer, and its aliases), for ``torch.bernoulli``/``Tensor.bernoulli``
    (thunder's ``uniform < p`` draws other numbers than eager's kernel in reduced precision) and for
    ``torch.randperm`` (thunder: ``not yet supported``), each the torch function itself at its place in the trace.
    With a ``generator=`` argument these and ``torch.randn``/``rand``/``randint``/``multinomial`` break the graph."""
    for name in INPLACE_SAMPLERS:
        sample = _register_sampler(executor, name, _inplace_sample(name), _sample_meta)

        def inplace(a: Any, *args: Any, _name: str = name, _sample: Any = sample, generator: Any = None,
                    **kwargs: Any) -> Any:
            _break_at_generator(f"Tensor.{_name}", generator)
            _refuse_grad(f"Tensor.{_name}", a)
            return ltorch.copy_(a, _sample(a, *args, **kwargs))

        executor._lookasides[getattr(torch.Tensor, name)] = inplace
        symbol = getattr(ltorch, name, None)
        if symbol is not None:
            executor._lookasides[symbol] = inplace

    bernoulli_op = executor.register_operator("eager_random_bernoulli", meta=_sample_meta, fn=_bernoulli, tags=DRAWS)

    def bernoulli_grad(a: Any, *args: Any) -> Any:
        """eager's ``BernoulliBackward0``: a zero gradient to the probabilities (so the result of probabilities
        requiring grad requires grad, and the tensors before it get zeros, not ``None``). With a number ``p``
        eager has no derivative: the lookaside refuses that under grad."""
        out = bernoulli_op(a, *args)
        put_grad(a, ltorch.zeros_like(get_grad(out)))
        return out

    executor.register_implementation(bernoulli_op, execution_transform=bernoulli_op, grad_transform=bernoulli_grad)

    def bernoulli(a: Any, *args: Any, generator: Any = None, out: Any = None) -> Any:
        if not _plain((a, *args), {}):  # a tensor subclass: thunder's symbol, which the subclass core unrolls
            return ltorch.bernoulli(a, *args, generator=generator)
        _break_at_generator("torch.bernoulli", generator)
        if args:  # bernoulli(a, p): eager's backward raises (no derivative of aten::bernoulli.p)
            _refuse_grad("torch.bernoulli", a, inputs=True)
        if out is not None:
            return ltorch.copy_(out, bernoulli_op(a, *args))
        return bernoulli_op(a, *args)

    for function in (torch.bernoulli, torch.Tensor.bernoulli, ltorch.bernoulli):
        executor._lookasides[function] = bernoulli

    randperm_op = _register_sampler(executor, "randperm", _randperm, _randperm_meta)

    def randperm(n: Any, *, generator: Any = None, out: Any = None, dtype: Any = None, layout: Any = None,
                 device: Any = None, pin_memory: bool = False, requires_grad: bool = False) -> Any:
        _break_at_generator("torch.randperm", generator)
        if out is not None or requires_grad or pin_memory or layout not in (None, torch.strided):
            raise NotImplementedError(
                f"thunderplug: torch.randperm with out=, requires_grad=True, pin_memory=True or a layout other than "
                f"torch.strided{user_location()} is not supported inside a thunder.jit function"
            )
        device = torch.get_default_device() if device is None else torch.device(device)
        return randperm_op(int(n), dtypes.to_dtype(torch.int64 if dtype is None else dtype), devices.to_device(device))

    executor._lookasides[torch.randperm] = randperm

    multinomial_op = _register_sampler(executor, "multinomial", torch.multinomial, _multinomial_meta)

    def multinomial(a: Any, num_samples: Any, replacement: bool = False, *, generator: Any = None,
                    out: Any = None) -> Any:
        _break_at_generator("torch.multinomial", generator)
        if out is not None or not _plain((a,), {}):
            return ltorch.multinomial(a, num_samples, replacement, out=out)
        return multinomial_op(a, int(num_samples), bool(replacement))  # integer indices: no gradient in eager

    for function in (torch.multinomial, torch.Tensor.multinomial, ltorch.multinomial):
        executor._lookasides[function] = multinomial

    normal_op = executor.register_operator(
        "eager_random_normal", meta=lambda mean, std: _meta(torch.normal, (mean, std), {}), fn=_normal, tags=DRAWS)

    def normal_grad(mean: Any, std: Any) -> Any:
        """eager's ``NormalBackward``: zero gradients to a tensor mean and std (their result requires grad)."""
        out = normal_op(mean, std)
        cotangent = get_grad(out)  # asked for, so the result requires grad as eager's
        for a in (mean, std):
            if isinstance(a, TensorProxy):
                put_grad(a, ltorch.zeros_like(cotangent if a.shape == out.shape else a))
        return out

    executor.register_implementation(normal_op, execution_transform=normal_op, grad_transform=normal_grad)

    def normal(mean: Any, std: Any = 1.0, *args: Any, generator: Any = None, **kwargs: Any) -> Any:
        """``torch.normal(mean, std)`` with a tensor mean or std (thunder: ``not yet supported``): eager's function
        at its place in the trace, so it draws eager's numbers; other forms are thunder's."""
        _break_at_generator("torch.normal", generator)
        tensors = [a for a in (mean, std) if isinstance(a, TensorProxy)]
        if args or kwargs or not tensors or not _plain((mean, std), {}):
            return _unsupported_normal(mean, std, *args, **kwargs)
        return normal_op(mean, std)

    executor._lookasides[torch.normal] = normal

    def dropout(a: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        """``F.dropout(a, inplace=True)`` (``nn.Dropout(inplace=True)``; thunder: ``Only inplace=False is currently
        supported``) is eager's ``dropout_``: the same draws and product as the out-of-place dropout (which the rule
        above runs as eager's), written into ``a`` by thunder's ``copy_``; ``a`` itself where nothing is dropped."""
        if not inplace or not _plain((a,), {}):
            return ltorch.dropout(a, p, training, inplace)
        if not training or p == 0:
            return a
        return ltorch.copy_(a, ltorch.dropout(a, p, training))

    for function in (F.dropout, ltorch.dropout):
        executor._lookasides[function] = dropout

    for function, symbol in ((torch.randn, ltorch.randn), (torch.rand, ltorch.rand), (torch.randint, ltorch.randint)):
        def generating(*args: Any, _symbol: Any = symbol, _name: str = function.__name__, generator: Any = None,
                       **kwargs: Any) -> Any:
            _break_at_generator(f"torch.{_name}", generator)
            return _symbol(*args, **kwargs)

        executor._lookasides[function] = generating
