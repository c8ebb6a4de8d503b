"""Recurrent layers (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``: layered, bidirectional, with inter-layer dropout) run as
eager runs them, forward and backward: part of the ``eager_backward_kernels`` executor (issue 42).

Why: tracing ``nn.RNNBase.forward`` failed in thunder 0.2.6 ("KeyError: None while tracing LSTM(...)"): its
``_update_flat_weights`` compares ``weakref.ref(w)()`` with ``getattr(self, name)``, which under thunder is a proxy,
never the parameter, so it rebuilds ``self._flat_weights`` with ``weakref.ref`` of proxies, an opaque builtin
whose ``__module__`` is None. thunder's automatic registration of ``torch.lstm``/``gru``/``rnn_tanh``/``rnn_relu``
would then run the function outside grad mode, where CPU picks another oneDNN primitive than eager's training one
(outputs 1.5e-8 off), and its backward would not replay inter-layer dropout's mask.

How: ``_update_flat_weights`` is skipped in the interpreted program where the module's ``_flat_weights`` are its
parameters (otherwise, a parametrized layer, the layer is refused by name and line: :func:`_update_flat_weights`);
thunder proxies the list's tensors as inputs. Each call of those torch functions (the padded form: ``input, hx,
params, has_biases, ...``) is one operator calling the function itself on the real tensors, under grad mode where
eager computes gradients (its metadata from the input's and the hidden state's shapes); under grad its backward
runs the function again on detached copies of the tensors that require grad (the flat weights, the input, the
initial state) and asks eager's engine for their gradients, every output's cotangent given. With dropout between
layers (``dropout > 0``, ``train``, more than one layer) the forward returns the generator's state taken just
before, and the backward draws again from it and puts the generator back (:mod:`thunderplug_aten_ops.random_ops`):
eager's mask forward and backward, the generator where eager leaves it.

Packed sequences: ``pack_padded_sequence`` (``pack_sequence``, ``torch._pack_padded_sequence``) makes tensors whose
shapes are the lengths' values (``batch_sizes``, the packed data's length), which a thunder 0.2.6 trace cannot
hold; the graph breaks at the packing (``wiring.graph_breaks``), thunder compiling the code before it. Dynamo
itself runs the rest of that frame eagerly ("Dynamo does not support RNN, GRU, or LSTM"): the packing, the layer and
``pad_packed_sequence`` are eager's. A ``PackedSequence`` passed into a jitted layer breaks the graph at the layer's
call the same way (:func:`_break_at_packed_input`); the packed form of ``torch.lstm`` called directly stays thunder's
error (loud).
"""

from __future__ import annotations

from typing import Any

import torch
from thunder.core import devices, dtypes
from thunder.core.compile_data import get_compile_data
from thunder.core.interpreter import get_interpreterruntimectx, unwrap
from thunder.core.proxies import TensorProxy
from thunder.core.transforms import get_grad, put_grad
from thunder.extend import OperatorExecutor
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils import rnn as rnn_utils

from thunderplug.eager.output_grads import requires_grad
from thunderplug.thunder_compat import torch_to_thunder_function_map
from thunderplug.tracing.aten import DataDependentShapeError
from thunderplug_aten_ops.random_ops import DRAWS, _generator, generator_replayed, input_grads

#: the torch functions of ``nn.RNNBase``'s modes
FUNCTIONS = (torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu)

#: a position in the call's arguments: an index, or an index and the index inside a list/tuple argument
Path = tuple[int, ...]


def _options(args: tuple) -> tuple[int, float, bool, bool]:
    """``num_layers, dropout, train, bidirectional`` of ``input, hx, params, has_biases, num_layers, ...``."""
    num_layers, dropout, train, bidirectional = args[4:8]
    return num_layers, dropout, train, bidirectional


def _hidden(args: tuple) -> list:
    hx = args[1]
    return list(hx) if isinstance(hx, (list, tuple)) else [hx]


def _draws(args: tuple) -> bool:
    num_layers, dropout, train, _ = _options(args)
    return bool(train) and dropout > 0 and num_layers > 1


def _shapes(args: tuple) -> list[tuple[tuple[int, ...], Any]]:
    """The outputs' shapes and dtypes: the output (the input's leading dimensions, the hidden size times the
    directions), then one tensor like each initial state."""
    _, _, _, bidirectional = _options(args)
    data, hidden = args[0], _hidden(args)
    width = hidden[0].shape[-1] * (2 if bidirectional else 1)
    return [((*data.shape[:-1], width), data.dtype), *((tuple(h.shape), h.dtype) for h in hidden)]


def _tensor_leaves(args: tuple) -> tuple[Path, ...]:
    """The paths of the float tensors that may require grad, one per tensor (a tensor passed twice is one leaf)."""
    found: dict[str, Path] = {}
    for i, a in enumerate(args):
        items = [((i, j), b) for j, b in enumerate(a)] if isinstance(a, (list, tuple)) else [((i,), a)]
        for path, b in items:
            if isinstance(b, TensorProxy) and dtypes.is_float_dtype(b.dtype) and requires_grad(b) is not False:
                found.setdefault(b.name, path)
    return tuple(found.values())


def _at(args: Any, path: Path) -> Any:
    for i in path:
        args = args[i]
    return args


def _replace(args: tuple, replacements: dict[int, torch.Tensor]) -> tuple:
    """``args`` with every occurrence of a tensor (by identity) in ``replacements`` replaced."""

    def one(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return replacements.get(id(a), a)
        if isinstance(a, (list, tuple)):
            return type(a)(one(b) for b in a)
        return a

    return tuple(one(a) for a in args)


def _run(fn: Any, leaves: tuple, args: tuple) -> tuple[tuple, list]:
    """``fn`` on the real tensors under grad mode, the tensors at ``leaves`` detached leaves requiring grad."""
    found = [_at(args, path).detach().requires_grad_() for path in leaves]
    args = _replace(args, {id(_at(args, path)): leaf for path, leaf in zip(leaves, found)})
    with torch.enable_grad():
        return fn(*args), found


class _Recurrent:
    """The operators of one torch function: ``eager_<name>`` (the call, in the grad mode given), ``..._forward``
    (with the generator's state where it draws) and ``..._backward`` (eager's autograd of the call)."""

    def __init__(self, executor: OperatorExecutor, fn: Any) -> None:
        name = fn.__name__

        def outputs(args: tuple) -> tuple:
            like = args[0]
            return tuple(TensorProxy(like=like, shape=shape, dtype=dtype, requires_grad=False)
                         for shape, dtype in _shapes(args))

        def state_meta(args: tuple) -> TensorProxy:
            state = _generator(devices.to_torch_device(args[0].device)).get_state()
            return TensorProxy(shape=tuple(state.shape), device=devices.cpu, dtype=dtypes.uint8, requires_grad=False)

        def plain_run(grad_mode: bool, *args: Any) -> tuple:
            with torch.set_grad_enabled(grad_mode):
                return tuple(o.detach() for o in fn(*args))

        def forward_run(leaves: tuple, drawn: bool, *args: Any) -> tuple:
            state = _generator(args[0].device).get_state() if drawn else None
            out, _ = _run(fn, leaves, args)
            return tuple(o.detach() for o in out), state

        def backward_meta(leaves: tuple, state: Any, grads: tuple, *args: Any) -> tuple:
            return tuple(TensorProxy(like=_at(args, path), requires_grad=False) for path in leaves)

        def backward_run(leaves: tuple, state: Any, grads: tuple, *args: Any) -> tuple:
            with generator_replayed(_generator(args[0].device) if state is not None else None, state):
                out, found = _run(fn, leaves, args)
                return input_grads(out, found, grads)

        self.plain = executor.register_operator(
            f"eager_{name}", meta=lambda grad_mode, *args: outputs(args), fn=plain_run, tags=DRAWS)
        self.forward = executor.register_operator(
            f"eager_{name}_forward", fn=forward_run, tags=DRAWS,
            meta=lambda leaves, drawn, *args: (outputs(args), state_meta(args) if drawn else None))
        self.backward = executor.register_operator(f"eager_{name}_backward", meta=backward_meta, fn=backward_run)

    def execute(self, *args: Any) -> Any:
        """Without autodiff: in the grad mode of the compilation (eager's CPU kernel differs with it)."""
        compile_data = get_compile_data()
        return self.plain(bool(compile_data is not None and compile_data.is_grad_enabled), *args)

    def grad(self, *args: Any) -> Any:
        leaves = _tensor_leaves(args)
        if not leaves:
            return self.plain(True, *args)
        out, state = self.forward(leaves, _draws(args), *args)
        grads = tuple(get_grad(o) for o in out)
        for path, found in zip(leaves, self.backward(leaves, state, grads, *args)):
            put_grad(_at(args, path), found)
        return out


def _plain(*args: Any) -> bool:
    """Plain CPU or CUDA tensors of a floating dtype (no subclass)."""
    tensors = [a for a in args for a in (a if isinstance(a, (list, tuple)) else (a,)) if isinstance(a, TensorProxy)]
    return bool(tensors) and dtypes.is_float_dtype(args[0].dtype) and all(
        type(t) is TensorProxy and devices.to_torch_device(t.device).type in ("cpu", "cuda") for t in tensors)


def _padded_form(*args: Any, **kwargs: Any) -> bool:
    """The padded form (``input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first``)
    of plain tensors."""
    return not kwargs and len(args) == 9 and isinstance(args[3], bool) and _plain(*args)


def _caller_location() -> str:
    """`` (at file:line)`` of the innermost interpreted frame outside torch and thunder: the user's call of the
    layer (the refusal is raised inside ``nn.RNNBase.forward``)."""
    for frame in reversed(get_interpreterruntimectx().frame_stack):
        module = unwrap(frame.globals).get("__name__", "")
        if module.split(".")[0] not in ("torch", "thunder") and frame.positions is not None:
            return f" (at {frame.code.co_filename}:{frame.positions.lineno})"
    return ""


def _break_at_packed_input(module: nn.RNNBase) -> None:
    """A layer called with a ``PackedSequence`` it did not pack (an argument of the jitted function): its
    ``batch_sizes`` are the lengths' values, which the layer reads as sizes; the graph breaks at the layer's call, as
    at a packing (``RNNBase.forward`` calls ``_update_flat_weights`` first, with the input in its frame)."""
    frames = get_interpreterruntimectx().frame_stack
    frame = frames[-1] if frames else None
    if frame is None or "input" not in frame.code.co_varnames[:frame.code.co_argcount]:
        return
    value = unwrap(frame.localsplus[frame.code.co_varnames.index("input")])
    if isinstance(value, rnn_utils.PackedSequence):
        location = _caller_location()
        name = f"{type(module).__name__} of a PackedSequence"
        raise DataDependentShapeError(
            f"{name}{location}: the packed sequence's shapes are its lengths' values", op=name, location=location)


def _update_flat_weights(module: nn.RNNBase) -> None:
    """``nn.RNNBase._update_flat_weights`` in the interpreted program: nothing, where ``_flat_weights`` are the
    module's parameters (thunder then proxies that list's tensors as inputs). Where they are not (a weight of a
    parametrization, computed at each read, or one replaced past ``RNNBase.__setattr__``), eager rebuilds the list
    at each call: refused by name and line rather than computed from other weights."""
    _break_at_packed_input(module)
    if parametrize.is_parametrized(module):
        raise NotImplementedError(
            f"{type(module).__name__}{_caller_location()}: a recurrent layer with a parametrization on its weights "
            "is not supported under discover() (eager rebuilds its flat weights at each call); remove the "
            "parametrization or call the layer outside the jitted function")
    for flat, name in zip(module._flat_weights, module._flat_weights_names):
        if flat is not getattr(module, name, None):
            raise NotImplementedError(
                f"{type(module).__name__}{_caller_location()}: its flat weight {name} is not its parameter {name} "
                "(replaced past the module's __setattr__); discover() runs the layer with the flat weights only: "
                "call module._init_flat_weights() after replacing it, outside the jitted function")


def register(executor: OperatorExecutor) -> None:
    """The rules above on ``executor``: thunder's registrations of :data:`FUNCTIONS` and the lookaside of
    ``nn.RNNBase._update_flat_weights``."""
    symbols = torch_to_thunder_function_map()
    for fn in FUNCTIONS:
        ops = _Recurrent(executor, fn)
        executor.register_implementation(
            symbols[fn], checker=_padded_form, execution_transform=ops.execute, grad_transform=ops.grad)
    executor._lookasides[nn.RNNBase._update_flat_weights] = _update_flat_weights
    for fn, name in ((rnn_utils.pack_padded_sequence, "pack_padded_sequence"),
                     (rnn_utils.pack_sequence, "pack_sequence"),
                     (torch._pack_padded_sequence, "torch._pack_padded_sequence")):
        executor._lookasides[fn] = _break_at_packing(name)


def _break_at_packing(name: str) -> Any:
    """A lookaside of a packing function ``name``: the graph breaks at the call (see the module docstring)."""

    def lookaside(*args: Any, **kwargs: Any) -> Any:
        location = _caller_location()
        raise DataDependentShapeError(
            f"{name}{location}: the packed sequence's shapes are the lengths' values", op=name, location=location)

    return lookaside
