"""``torch._grouped_mm`` as eager runs it: ATen's kernel with ATen's arguments, and eager's derivative.

Why: thunder 0.2.6's ``torch._grouped_mm`` symbol takes ``offsets``/``dtype`` where ATen's schema says
``offs``/``out_dtype`` (transformers' grouped experts, Mixtral's and every MoE model's since transformers 5,
call ``torch._grouped_mm(x, w, offs=offsets)``: ``TypeError``), refuses ``bias``, has no gradient, and only
thunder's torch executor runs it, for bf16 alone. torch's own fake kernel is CUDA's (bf16 only), while eager on
CPU runs the float32 composite kernel.

How: an operator of the ``eager_backward_kernels`` executor with ATen's signature, ``_grouped_mm(self, mat2,
offs=None, bias=None, out_dtype=None)``, reached through a lookaside of ``torch._grouped_mm``; it runs the ATen
overload (the kernel eager picks; what the kernel refuses, eager's refuses too, with the same error) and its
output's shape follows ATen's rules (2-D x 3-D and 3-D x 2-D: one group per ``offs`` entry; 2-D x 2-D: ``(groups,
m, n)``; 3-D x 3-D: a batch). Its gradient is derivatives.yaml's ``_grouped_mm_mat1_backward`` /
``_grouped_mm_mat2_backward`` (FunctionsManual.cpp): ``_grouped_mm`` of the cotangent and the other operand,
transposed when the operand was column-major in the forward. The layout decides which product is computed, and
the two differ in bits (transformers passes ``weight.transpose(-2, -1)``, a column-major view): thunder's
proxies have no strides, so each backward operator reads the layout of the real tensors it is given at run time,
the views the forward computed. ``bias`` has no derivative in eager (an error when it requires grad); neither
here.
"""

from __future__ import annotations

import torch
from thunder.core import dtypes
from thunder.core.proxies import TensorProxy
from thunder.core.transforms import get_grad, put_grad
from thunder.extend import OperatorExecutor

from thunderplug.tracing.fake import to_torch_value

aten = torch.ops.aten


def _output_shape(a: TensorProxy, b: TensorProxy, offs: TensorProxy | None) -> tuple[int, ...]:
    """ATen's output shape of ``_grouped_mm(a, b, offs)`` (its meta kernel's rules, without its bf16 check)."""
    if a.ndim not in (2, 3) or b.ndim not in (2, 3):
        raise RuntimeError(f"grouped gemm takes 2-D or 3-D operands, got {a.ndim}-D and {b.ndim}-D")
    if (a.ndim == 3 and b.ndim == 3) != (offs is None):
        raise RuntimeError("_grouped_mm: `offs` is required unless both operands are 3-D (and then it is not taken)")
    if a.shape[-1] != b.shape[-2]:
        raise RuntimeError(f"_grouped_mm: contraction dimension mismatch: {tuple(a.shape)} and {tuple(b.shape)}")
    if a.ndim == 2 and b.ndim == 2:
        return (offs.shape[0], a.shape[0], b.shape[1])
    if a.ndim == 3 and b.ndim == 3:
        return (a.shape[0], a.shape[1], b.shape[2])
    return (a.shape[-2], b.shape[-1])


def _column_major(t: torch.Tensor) -> bool:
    """FunctionsManual's test of an operand's layout: its last two dims stored column by column."""
    return t.stride(-2) == 1 and t.stride(-1) == t.shape[-2]


def _mat1_backward(grad: torch.Tensor, mat2: torch.Tensor, mat1: torch.Tensor, offs: torch.Tensor | None):
    """``_grouped_mm_mat1_backward(grad, mat2, mat1's sizes and strides, offs)``."""
    if _column_major(mat1):
        return aten._grouped_mm(mat2, grad.transpose(-2, -1), offs).transpose(-2, -1)
    return aten._grouped_mm(grad, mat2.transpose(-2, -1), offs)


def _mat2_backward(grad: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, offs: torch.Tensor | None):
    """``_grouped_mm_mat2_backward(grad, mat1, mat2's sizes and strides, offs)``."""
    if _column_major(mat2):
        return aten._grouped_mm(grad.transpose(-2, -1), mat1, offs).transpose(-2, -1)
    return aten._grouped_mm(mat1.transpose(-2, -1), grad, offs)


def _arguments(self, mat2, offs=None, bias=None, out_dtype=None):
    """The call's arguments in ATen's order (the lookaside records them as the user passed them)."""
    return self, mat2, offs, bias, out_dtype


def _like(t: TensorProxy) -> TensorProxy:
    return TensorProxy(shape=tuple(t.shape), dtype=t.dtype, device=t.device, requires_grad=False)


class GroupedMM:
    """The operators and rules of ``_grouped_mm`` on one executor (:func:`register`)."""

    def __init__(self, executor: OperatorExecutor):
        def meta(self, mat2, offs=None, bias=None, out_dtype=None):
            dtype = dtypes.to_dtype(out_dtype) if out_dtype is not None else self.dtype
            return TensorProxy(shape=_output_shape(self, mat2, offs), dtype=dtype, device=self.device,
                               requires_grad=self.requires_grad or mat2.requires_grad)

        def run(self, mat2, offs=None, bias=None, out_dtype=None):
            return aten._grouped_mm(self, mat2, offs, bias, to_torch_value(out_dtype))

        #: what ``torch._grouped_mm`` records (the operator is its lookaside, called with the user's arguments);
        #: its rule (below) is the executor's grad transform
        self.grouped_mm = executor.register_operator(
            "eager_grouped_mm", meta=meta, fn=run, replaces=torch._grouped_mm
        )
        #: the same kernel recorded by the rule in the forward trace (no rule of its own)
        self.kernel = executor.register_operator("eager_grouped_mm_forward", meta=meta, fn=run)
        self.mat1_backward = executor.register_operator(
            "eager_grouped_mm_mat1_backward", meta=lambda grad, mat2, mat1, offs: _like(mat1), fn=_mat1_backward
        )
        self.mat2_backward = executor.register_operator(
            "eager_grouped_mm_mat2_backward", meta=lambda grad, mat1, mat2, offs: _like(mat2), fn=_mat2_backward
        )

    @staticmethod
    def checker(*args, **kwargs) -> bool:
        a, b, offs, bias, _ = _arguments(*args, **kwargs)
        return all(type(t) is TensorProxy for t in (a, b)) and all(
            t is None or type(t) is TensorProxy for t in (offs, bias)
        )

    def grad(self, *args, **kwargs):
        a, b, offs, bias, out_dtype = _arguments(*args, **kwargs)
        if isinstance(bias, TensorProxy) and bias.requires_grad:  # eager's words (its forward raises them)
            raise RuntimeError(
                "The function '_grouped_mm' is not differentiable with respect to argument 'bias'. "
                "This input cannot have requires_grad True."
            )
        out = self.kernel(a, b, offs, bias, out_dtype)
        grad = get_grad(out)  # a gradient nobody reads is dropped with its operator (thunder's DCE)
        put_grad(a, self.mat1_backward(grad, b, a, offs))
        put_grad(b, self.mat2_backward(grad, a, b, offs))
        return out


def register(executor: OperatorExecutor) -> GroupedMM:
    """``torch._grouped_mm`` on ``executor``: its lookaside, operators and grad rule."""
    rules = GroupedMM(executor)
    executor.register_implementation(
        rules.grouped_mm, rules.grouped_mm, checker=rules.checker, grad_transform=rules.grad
    )
    return rules
