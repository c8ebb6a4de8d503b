"""A custom forward/backward rule for ``torch.mm`` of two float8 training tensors.

eager PyTorch cannot differentiate a bare ``torch.mm(a8, b8)`` (torchao's mm needs both operands
float8, and the autograd formula feeds it a plain gradient). This rule, claimed before autodiff,
does what torchao's ``Float8Linear`` does in its own autograd.Function: the gradient is cast to
float8 e5m2 once, and grad_input and grad_weight are two ``_scaled_mm`` calls in the layouts they
need (torchao's dispatch makes the first operand row-major and the second column-major).
"""

from __future__ import annotations

import torch
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


class EagerFloat8MM(torch.autograd.Function):
    """The same rule as an eager autograd.Function: the reference the tests compare against."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return float8_mm_forward(a, b)

    @staticmethod
    def backward(ctx, grad):
        return float8_mm_backward(*ctx.saved_tensors, grad)
