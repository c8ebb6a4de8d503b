"""functorch transforms (``torch.vmap``, ``torch.func.grad``, ...) called inside a jitted function.

thunder 0.2.6 interprets the transform's Python code: it enters a functorch level for real, then hands a
proxy to ``torch._C._functorch._add_batch_dim`` (``TypeError: incompatible function arguments``), and the
level is never left: eager code run next in the process fails too (``vmap: called random operation while
in randomness error mode``). Inside discover() compilations a transform is refused when it is called, with
the user's line and what to do, before any level is entered; and any functorch level a failed compilation
entered is left, so the process stays usable whatever failed.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
import torch.func
from thunder.core.interpreter import do_raise

from thunderplug.aten import user_location

_NAMES = ("grad", "grad_and_value", "vjp", "jvp", "jacrev", "jacfwd", "hessian", "functionalize", "linearize")
#: the public entry points of functorch's transforms, by the name users call them with
TRANSFORMS: dict[str, Callable[..., Any]] = {
    "torch.vmap": torch.vmap,
    **{f"torch.func.{name}": getattr(torch.func, name)
       for name in ("grad", "grad_and_value", "vjp", "jvp", "jacrev", "jacfwd", "hessian", "functionalize", "linearize")
       if hasattr(torch.func, name)},
}


def refusal(
    name: str, interpret: Callable[..., Any], active: Callable[[], bool]
) -> Callable[[Any], Callable[..., Any]]:
    """A lookaside for the transform ``name``: outside discover() compilations thunder interprets it as before."""

    transform = TRANSFORMS[name]
    # the same code as another function object, which has no lookaside: thunder interprets it as it did before
    unlooked = types.FunctionType(transform.__code__, transform.__globals__, transform.__name__,
                                  transform.__defaults__, transform.__closure__)
    unlooked.__kwdefaults__ = transform.__kwdefaults__

    def make(_no_lookaside: Any) -> Callable[..., Any]:
        def lookaside(*args: Any, **kwargs: Any) -> Any:
            if not active():
                return interpret(unlooked, *args, **kwargs)
            return do_raise(NotImplementedError(
                f"`{name}` is called inside a function compiled by thunder.jit{user_location()}: thunder cannot "
                "trace functorch transforms (they run the function on batched or functional tensor wrappers, which "
                "thunder's proxies are not). Apply the transform outside the jitted function, or write the "
                "computation without it (broadcasting, torch.autograd). Hugging Face transformers 4.x builds "
                "attention masks with torch.vmap; transformers 5 does not."
            ))

        return lookaside

    return make


def levels_left_on_failure(original: Callable[..., Any], active: Callable[[], bool]) -> Callable[..., Any]:
    """The interpretation of a jitted function, leaving every functorch level it entered if it fails."""

    def replacement(*args: Any, **kwargs: Any) -> Any:
        if not active():
            return original(*args, **kwargs)
        depth = _depth()
        try:
            return original(*args, **kwargs)
        except BaseException:
            while _depth() > depth:
                _leave_innermost_level()
            raise

    return replacement


def _depth() -> int:
    level = torch._C._functorch.maybe_current_level()
    return 0 if level is None else int(level)


def _leave_innermost_level() -> None:
    functorch = torch._C._functorch
    kind = functorch.peek_interpreter_stack().key()
    leave = {
        functorch.TransformType.Vmap: functorch._vmap_decrement_nesting,
        functorch.TransformType.Grad: functorch._grad_decrement_nesting,
        functorch.TransformType.Jvp: functorch._jvp_decrement_nesting,
        functorch.TransformType.Functionalize: functorch._func_decrement_nesting,
    }[kind]
    leave()
