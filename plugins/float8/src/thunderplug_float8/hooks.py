"""Entry point of the float8 plugin."""

from __future__ import annotations

from thunderplug import Claim, Priority, Stage, hookimpl
from thunderplug.availability import missing_package_reason


@hookimpl
def unavailable_reason() -> str | None:
    return missing_package_reason("torchao", "pip install torchao==0.14.1")


@hookimpl
def register_claims(register) -> None:
    from torchao.float8.float8_linear import matmul_with_hp_or_float8_args

    from thunderplug_float8 import rules

    # Float8Linear's autograd.Function as one op: traced on fakes (its forward and its own
    # backward) instead of thunder interpreting torchao's Python line by line (tens of seconds).
    register(
        Claim(
            executor="float8",
            stage=Stage.BEFORE_AUTODIFF,
            target=matmul_with_hp_or_float8_args,
            checker=lambda *args, **kwargs: None,
        )
    )

    register(
        Claim(
            executor="float8",
            stage=Stage.BEFORE_AUTODIFF,
            target=rules.TARGET,
            checker=rules.float8_mm_checker,
            forward=rules.float8_mm_forward,
            backward=rules.float8_mm_backward,
            priority=Priority.BEFORE_AUTODIFF,
        )
    )
