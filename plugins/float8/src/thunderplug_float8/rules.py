"""Rules for torchao's float8 training: ``torch.mm`` of two float8 training tensors, and
Float8Linear's matmul Function applied to the rows of its input.

eager PyTorch cannot differentiate a bare ``torch.mm(a8, b8)`` (torchao's mm needs both operands
float8, and the autograd formula feeds it a plain gradient). This rule, claimed before autodiff,
does what torchao's ``Float8Linear`` does in its own autograd.Function: the gradient is cast to
float8 e5m2 once, and grad_input and grad_weight are two ``_scaled_mm`` calls in the layouts they
need (torchao's dispatch makes the first operand row-major and the second column-major).
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from torchao.float8.config import Float8LinearConfig, ScalingGranularity
from torchao.float8.float8_linear import matmul_with_hp_or_float8_args
from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
from torchao.float8.float8_training_tensor import Float8TrainingTensor, GemmInputRole

from thunderplug.subclass.values import SubclassTensorProxy


def float8_mm_checker(a, b) -> str | None:
    for value in (a, b):
        if not (isinstance(value, SubclassTensorProxy) and value.subclass_type is Float8TrainingTensor):
            return "needs two Float8TrainingTensor operands"
    if a.ndim != 2 or b.ndim != 2:
        return "needs 2D operands"
    return None


def float8_mm_forward(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.mm(a, b)


def float8_mm_backward(a: torch.Tensor, b: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    grad8 = hp_tensor_to_float8_dynamic(
        grad, torch.float8_e5m2, a._linear_mm_config, gemm_input_role=GemmInputRole.GRAD_OUTPUT
    )
    grad_a = torch.mm(grad8, b.t())  # (GRAD_OUTPUT, WEIGHT) -> grad_input
    grad_b = torch.mm(grad8.t(), a).t()  # (GRAD_OUTPUT, INPUT) -> grad_weight
    return grad_a, grad_b


_CAST_CONFIGS = (
    "cast_config_input",
    "cast_config_input_for_grad_weight",
    "cast_config_weight",
    "cast_config_weight_for_grad_input",
    "cast_config_grad_output",
    "cast_config_grad_output_for_grad_weight",
)


def matmul_on_rows(input_hp: torch.Tensor, weight_hp_t: torch.Tensor, linear_mm_config, config) -> torch.Tensor:
    """``matmul_with_hp_or_float8_args.apply``, run on ``input_hp`` viewed as rows when every cast
    is tensorwise: the same values and gradients (one scale per tensor, the same elements cast),
    but the forward then casts exactly the tensor the backward casts again for grad_weight (torchao
    casts the N-D input forward, its 2-D view backward), so CSE keeps one cast and the float8 copy
    is what is saved. Other inputs (float8 already, DTensor, 2-D) and recipes go to torchao as is."""
    if input_hp.dim() > 2 and not is_traceable_wrapper_subclass(input_hp) and _tensorwise(config):
        rows = matmul_with_hp_or_float8_args.apply(
            input_hp.reshape(-1, input_hp.shape[-1]), weight_hp_t, linear_mm_config, config
        )
        return rows.reshape(*input_hp.shape[:-1], rows.shape[-1])
    return matmul_with_hp_or_float8_args.apply(input_hp, weight_hp_t, linear_mm_config, config)


def _tensorwise(config: Float8LinearConfig) -> bool:
    return all(getattr(config, name).scaling_granularity is ScalingGranularity.TENSORWISE for name in _CAST_CONFIGS)


class EagerFloat8MM(torch.autograd.Function):
    """The same rule as an eager autograd.Function: the reference the tests compare against."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return float8_mm_forward(a, b)

    @staticmethod
    def backward(ctx, grad):
        return float8_mm_backward(*ctx.saved_tensors, grad)
