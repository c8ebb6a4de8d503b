"""Entry point of the float8 plugin.

torchao is imported only when a claim is first used: importing it costs about 1.5 s, and
``discover()`` must stay cheap.
"""

from __future__ import annotations

from typing import Any

import torch

from thunderplug import AtenKernelClaim, FunctionClaim, SubclassOpClaim, hookimpl
from thunderplug.plugin_api.availability import missing_package_reason
from thunderplug_float8 import cpu_scaled_mm

FLOAT8_LINEAR_FUNCTION = "torchao.float8.float8_linear.matmul_with_hp_or_float8_args"


@hookimpl
def unavailable_reason() -> str | None:
    return missing_package_reason("torchao", "pip install torchao==0.14.1")


def _rule(name: str):
    def call(*args: Any, **kwargs: Any) -> Any:
        from thunderplug_float8 import rules

        return getattr(rules, name)(*args, **kwargs)

    call.__name__ = name
    return call


_matmul_on_rows = _rule("matmul_on_rows")  # one function, so its traced graphs are cached across discover() lists


@hookimpl
def register_claims(register) -> None:
    # Float8Linear's autograd.Function as one op: traced on fakes (its forward and its own
    # backward) instead of thunder interpreting torchao's Python line by line (tens of seconds).
    register(FunctionClaim("float8", FLOAT8_LINEAR_FUNCTION, replacement=_matmul_on_rows))
    register(
        SubclassOpClaim(
            executor="float8",
            target="Float8TrainingTensor.torch.mm",
            checker=_rule("float8_mm_checker"),
            forward=_rule("float8_mm_forward"),
            backward=_rule("float8_mm_backward"),
        )
    )
    # the unrolled float8 matmuls on CPU: torch's emulation, without its copies (bit-identical)
    register(
        AtenKernelClaim(
            "float8", torch.ops.aten._scaled_mm.default, kernel=cpu_scaled_mm.scaled_mm,
            checker=cpu_scaled_mm.scaled_mm_checker,
        )
    )
