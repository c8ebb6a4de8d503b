"""torch.distributions' argument and sample validation in discover() compilations, checked on every call.

``Normal(loc, scale)`` (and every distribution, unless ``validate_args=False``) checks its parameters in
``Distribution.__init__``, and ``log_prob(value)`` its sample in ``Distribution._validate_sample``::

    valid = constraint.check(value)
    if not torch._is_all_true(valid):
        raise ValueError(f"Expected parameter {param} ... but found invalid values:\\n{value}")

thunder 0.2.6 has no symbol for ``torch._is_all_true`` (``NotImplementedError``), and the branch reads a tensor's
value, which a trace does not know. In those two functions the lookaside of ``torch._is_all_true``
(:func:`is_all_true`) answers True, so the trace is the valid path, and records :data:`check_distribution`, an
operator thunder's dead-code elimination never removes, that runs on the real ``valid`` at every call and raises
eager's ``ValueError`` (eager's message, built from the real values, and the user's line) when it is not all
true. Elsewhere ``torch._is_all_true`` of a tensor proxy is ``torch.all`` (the 0-dim bool tensor eager returns),
whose ``bool()`` then breaks the graph.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import thunder
import thunder.torch as ltorch
import torch
from thunder.core.interpreter import get_interpreterruntimectx, interpreter_needs_wrap, unwrap
from thunder.core.prims import OpTags
from thunder.core.proxies import TensorProxy
from thunder.executors.pythonex import ex as pythonex

#: the code of the two validations, by what they check: a parameter (``__init__``) or a sample
_VALIDATIONS = {
    torch.distributions.Distribution.__init__.__code__: "parameter",
    torch.distributions.Distribution._validate_sample.__code__: "sample",
}


def _check(valid: torch.Tensor, value: Any, scalars: tuple, kind: str, parts: tuple, location: str) -> None:
    """Eager's ``if not torch._is_all_true(valid): raise ValueError(...)``, its message made of the real values:
    ``parts`` are the static pieces (the parameter's name, the constraint, the distribution's name and each
    parameter printed by shape), ``scalars`` the one-element parameters eager's repr prints by value."""
    if torch._is_all_true(valid):
        return
    name, constraint, cls, printed = parts
    scalars_left = iter(scalars)
    arguments = ", ".join(f"{p}: {next(scalars_left) if shown is None else shown}" for p, shown in printed)
    shape = f"({type(value).__name__} of shape {tuple(value.shape)})"
    if kind == "parameter":
        message = (f"Expected parameter {name} {shape} of distribution {cls}({arguments}) to satisfy the constraint "
                   f"{constraint}, but found invalid values:\n{value}")
    else:
        message = (f"Expected value argument {shape} to be within the support ({constraint}) of the distribution "
                   f"{cls}({arguments}), but found invalid values:\n{value}")
    raise ValueError(f"{message}\n(torch.distributions argument validation{location}, checked at every call)")


#: the validation at run time; tagged DONT_DCE: it has no output, and must run anyway
check_distribution = pythonex.register_operator(
    "check_distribution",
    meta=lambda valid, value, scalars, kind, parts, location: None,
    fn=_check,
    tags=(OpTags.DONT_DCE,),
)
# under grad the check stays in the forward; it has no output, so nothing to differentiate
pythonex.register_implementation(check_distribution, execution_transform=check_distribution,
                                 grad_transform=check_distribution)


def _locals(frame: Any) -> dict[str, Any]:
    """The unwrapped local variables of an interpreter frame (unset ones left out)."""
    found = {}
    for index, slot in enumerate(frame.localsplus):
        value = unwrap(slot)
        if type(value).__name__ != "Py_NULL":
            found[frame.get_localsplus_name(index)] = value
    return found


def _recorded(valid: TensorProxy) -> bool:
    """Record :data:`check_distribution` for ``valid`` where the caller is one of the two validations (and
    say so); False elsewhere."""
    try:
        frame = get_interpreterruntimectx().frame_stack[-1]
    except Exception:  # noqa: BLE001 - not inside thunder's interpreter
        return False
    kind = _VALIDATIONS.get(frame.code)
    if kind is None:
        return False
    names = _locals(frame)
    self, value = names.get("self"), names.get("value")
    constraint = names.get("constraint" if kind == "parameter" else "support")
    if self is None or not isinstance(value, TensorProxy):
        return False
    printed, scalars = [], []
    for param in (p for p in type(self).arg_constraints if p in self.__dict__):
        held = self.__dict__[param]
        if isinstance(held, TensorProxy) and held.numel == 1:
            printed.append((param, None))
            scalars.append(held)
        else:
            printed.append((param, str(torch.Size(held.shape)) if isinstance(held, TensorProxy) else str(held)))
    parts = (names.get("param"), repr(constraint), type(self).__name__, tuple(printed))
    check_distribution(valid, value, tuple(scalars), kind, parts, _user_location())
    return True


#: frames of these packages are the library's, not the user's
_LIBRARIES = tuple(
    os.path.dirname(module.__file__) + os.sep for module in (torch, thunder, sys.modules["thunderplug"])
)


def _user_location() -> str:
    """`` (at file:line)`` of the innermost frame of the user's code (the call that built the distribution or
    asked for ``log_prob``), or ``""``."""
    for frame in reversed(get_interpreterruntimectx().frame_stack):
        if not frame.code.co_filename.startswith(_LIBRARIES):
            line = frame.positions.lineno if frame.positions else frame.code.co_firstlineno
            return f" (at {frame.code.co_filename}:{line})"
    return ""


def is_all_true(active: Callable[[], bool]) -> Callable[[Any], Callable]:
    """The lookaside of ``torch._is_all_true``: True with :data:`check_distribution` recorded where a
    distribution validates (the module's docstring), ``torch.all`` of another tensor proxy, eager's function
    for everything else."""

    def make(_no_lookaside: Any) -> Callable[..., Any]:
        def lookaside(valid: Any) -> Any:
            if not active() or not isinstance(valid, TensorProxy):
                return torch._is_all_true(valid)
            if _recorded(valid):
                return True
            return ltorch.all_tensor(valid)

        return interpreter_needs_wrap(lookaside)

    return make

