"""Which branch of ``if torch.compiler.is_compiling():`` a discover() compilation takes.

Libraries ask the flag two different questions, and the two answers give eager's values in different places:

* transformers asks "can tensor values be read here?". Its compiling branch computes the same values
  without data-dependent shortcuts: ``find_packed_sequence_indices`` returns the (all-zero) packed-sequence
  mask where eager returns ``None`` after reading the positions, ``_ignore_causal_mask_sdpa`` builds the
  causal mask where eager reads the padding mask and passes ``is_causal=True``. Its eager branch reads
  tensor values, which a trace over proxies cannot.
* torchao asks "does Inductor generate this code?". ``to_mx`` drops its clamp before the float8 cast
  (Inductor's cast saturates, eager's gives NaN past 448), ``intmm`` calls the ``out_dtype`` higher-order
  op. thunder runs eager kernels, so only the eager branch gives eager's values.

The rule: the answer is False (eager's branch, eager's values) unless that branch cannot be traced. When a
False answer leads to a tensor's value being read (``bool`` of a proxy, which fails), the innermost function
still running that asked is remembered and the function is interpreted again, this time answering True
to every question asked from inside it: the branch the library wrote for tracers. Remembered functions
(code objects) keep the answer True for the rest of the process, so the retry happens once per function.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

import thunder
import torch
from thunder.core.interpreter import get_interpreterruntimectx, interpreter_needs_wrap

from thunderplug.tracing.aten import DataDependentShapeError, user_location

#: at most this many functions are switched to the compiling branch for one compilation
RETRY_LIMIT = 8

#: frames of these packages never ask for themselves: their code is shared by every program (thunder's
#: wrappers, ``Module.__call__``), so the function remembered is the user's or the library's that called them
_MACHINERY = tuple(
    folder + os.sep
    for folder in (
        os.path.dirname(thunder.__file__),
        os.path.dirname(torch.__file__),
        os.path.dirname(os.path.dirname(__file__)),  # thunderplug's own folder: this file is in its eager/
    )
)

_compiling_branch: weakref.WeakSet[CodeType] = weakref.WeakSet()
_lock = threading.Lock()
_attempts = threading.local()


@dataclass
class _Attempt:
    """One interpretation: the interpreter frames that were running when False was answered, and the
    code of the innermost of them still running when a tensor's value was read."""

    asked_from: dict[int, Any] = field(default_factory=dict)  # id -> frame (held, so ids stay unique)
    reads_value_in: CodeType | None = None


def _frames() -> list[Any]:
    try:
        return list(get_interpreterruntimectx().frame_stack)
    except Exception:  # noqa: BLE001 - not inside thunder's interpreter: no frames
        return []


def _program_frames() -> list[Any]:
    """The interpreter's frames of the program's own code (the user's and its libraries'), outermost first."""
    return [frame for frame in _frames() if not frame.code.co_filename.startswith(_MACHINERY)]


def uses_compiling_branch(code: CodeType) -> bool:
    """Whether questions asked from inside ``code`` are answered True (it read a value on the eager branch)."""
    with _lock:
        return code in _compiling_branch


def answer() -> bool:
    """The answer for the question being asked now (inside a discover() compilation)."""
    frames = _program_frames()
    with _lock:
        if any(frame.code in _compiling_branch for frame in frames):
            return True
    attempt: _Attempt | None = getattr(_attempts, "current", None)
    if attempt is not None:
        attempt.asked_from.update((id(frame), frame) for frame in frames)
    return False


def note_value_read() -> None:
    """A tensor's value is being read (and the read will fail): remember which asking function led here."""
    attempt: _Attempt | None = getattr(_attempts, "current", None)
    if attempt is None or attempt.reads_value_in is not None:
        return
    for frame in reversed(_program_frames()):
        if id(frame) in attempt.asked_from:
            attempt.reads_value_in = frame.code
            return


def is_compiling_lookaside(active: Callable[[], bool]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The replacement of thunder's ``is_compiling`` lookaside (thunder answers True everywhere)."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        ours = interpreter_needs_wrap(answer)

        def replacement(*args: Any, **kwargs: Any) -> Any:
            return ours(*args, **kwargs) if active() else original(*args, **kwargs)

        return replacement

    return make


def value_read_lookaside(
    to_bool: Callable[[Any], bool], active: Callable[[], bool]
) -> Callable[[Any], Callable[..., Any]]:
    """A lookaside for ``TensorProxy.__bool__`` (``to_bool``, which raises thunder's data-dependency error;
    thunder has no lookaside for it): notes the read, then raises thunder's error with the user's line and
    what to do, as a :class:`DataDependentShapeError`: where no ``is_compiling()`` retry avoids the read, a
    discover() compilation breaks the graph there (``wiring.graph_breaks``), and Dynamo runs the branch with
    the tensor's value on every call (``if mask.any():``, ``bool(t)``: eager's branch, never the first call's)."""

    def make(_no_lookaside: Any) -> Callable[..., Any]:
        def read(proxy: Any) -> bool:
            if not active():
                return to_bool(proxy)
            note_value_read()
            try:
                return to_bool(proxy)
            except NotImplementedError as error:
                location = user_location()
                raise DataDependentShapeError(
                    f"{error}{_where_and_what_to_do()}", op="bool() of a tensor", location=location,
                    why="branches on a tensor's value, which a thunder 0.2.6 trace cannot hold",
                    advice="For one trace, express the branch with tensor ops (torch.where) or compute the condition "
                    "outside the jitted function.",
                ) from None  # fmt: skip

        return interpreter_needs_wrap(read)

    return make


def _where_and_what_to_do() -> str:
    for frame in reversed(_program_frames()):
        line = frame.positions.lineno if frame.positions else "?"
        return (
            f": `{frame.code.co_name}` ({frame.code.co_filename}:{line}) branches on a tensor's value. thunder "
            "traces one program for all input values, so the value is not known while tracing: compute the condition "
            "outside the jitted function and pass it in, or express the branch with tensor ops (torch.where)"
        )
    return ""


def interpreted_with_retries(active: Callable[[], bool]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The replacement of ``thunder_general_jit`` (the interpretation of a jitted function): interpreted
    again while a False answer led to a value read, with the function that asked switched to True."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def replacement(*args: Any, **kwargs: Any) -> Any:
            if not active() or getattr(_attempts, "current", None) is not None:
                return original(*args, **kwargs)
            try:
                for _ in range(RETRY_LIMIT):
                    attempt = _attempts.current = _Attempt()
                    try:
                        return original(*args, **kwargs)
                    except Exception:
                        code = attempt.reads_value_in
                        with _lock:
                            if code is None or code in _compiling_branch:
                                raise
                            _compiling_branch.add(code)
                _attempts.current = None
                return original(*args, **kwargs)
            finally:
                _attempts.current = None

        return replacement

    return make
