"""torch's own test subclasses (``torch.testing._internal``) in mixed programs, forward and
backward, as inputs that require grad, as frozen parameters and as buffers."""

from __future__ import annotations

import torch
from torch.testing._internal.common_subclass import SubclassWithTensorFactory
from torch.testing._internal.custom_tensor import ConstantExtraMetadataTensor, CustomTensorPlainOut
from torch.testing._internal.subclasses import WrapperSubclass
from torch.testing._internal.two_tensor import TwoTensor

from real_programs.case import Case, Program, case


def _two(*shape: int, requires_grad: bool = True) -> TwoTensor:
    return TwoTensor(torch.randn(*shape), torch.randn(*shape)).requires_grad_(requires_grad)


def _mixed(x, w, b):
    """matmul, softmax, views, indexing, reductions and cat, mixing a subclass with plain tensors."""
    h = torch.softmax(x @ w, dim=-1)  # (4, 6)
    v = h.view(2, 2, 6).transpose(1, 2).reshape(4, 6)
    picked = v[1:3, ::2] * b[:3]
    both = torch.cat([picked, h[:2, :3]], dim=0)
    return both.sum(dim=0).mean(), both.amax(dim=1), h.flatten()[5]


@case("TwoTensor/mixed-program")
def _two_tensor_mixed() -> Program:
    return Program(_mixed, (_two(4, 5), torch.randn(5, 6, requires_grad=True), torch.randn(6, requires_grad=True)))


@case("TwoTensor/mixed-program/plain-input-subclass-weight")
def _two_tensor_weight() -> Program:
    return Program(_mixed, (torch.randn(4, 5, requires_grad=True), _two(5, 6), torch.randn(6, requires_grad=True)))


def _wrapped(wrap, *shape: int):
    return wrap(torch.randn(*shape)).requires_grad_(True)


def _elementwise_and_matmul(x, w):
    y = (x * 2 + 1).sin()
    return (y @ w).relu().sum(dim=0), y.t().contiguous().mean()


@case("WrapperSubclass/fwd+bwd")
def _wrapper_subclass() -> Program:
    return Program(_elementwise_and_matmul, (_wrapped(WrapperSubclass, 4, 5), torch.randn(5, 3, requires_grad=True)))


@case("ConstantExtraMetadataTensor/fwd+bwd")
def _constant_extra_metadata() -> Program:
    x = _wrapped(ConstantExtraMetadataTensor, 4, 5)
    return Program(_elementwise_and_matmul, (x, torch.randn(5, 3, requires_grad=True)))


@case("ConstantExtraMetadataTensor/method-and-ctx-read")
def _constant_extra_metadata_method() -> Program:
    def fn(x):
        meta = x.get_complicated_metadata()
        return x * meta.foo + x.constant_attribute

    return Program(fn, (_wrapped(ConstantExtraMetadataTensor, 3, 4),))


@case("CustomTensorPlainOut/fwd+bwd/inner-tensor-output")
def _custom_plain_out_inner() -> Program:
    def fn(x, w):
        return (x @ w).relu(), x.get_elem().cos()

    x = CustomTensorPlainOut(torch.randn(4, 5), torch.randn(4, 5)).requires_grad_(True)
    return Program(fn, (x, torch.randn(5, 3, requires_grad=True)))


@case("CustomTensorPlainOut/fwd+bwd")
def _custom_plain_out() -> Program:
    """Every non-view op returns a plain tensor (elem1 op + elem2 op): torchao's quantized tensors in miniature."""

    def fn(x, w):
        return (x @ w).relu(), (x * 3).sum(), x.get_elem().cos() * w.sum()

    x = CustomTensorPlainOut(torch.randn(4, 5), torch.randn(4, 5)).requires_grad_(True)
    return Program(fn, (x, torch.randn(5, 3, requires_grad=True)))


@case("CustomTensorPlainOut/views-then-plain")
def _custom_plain_out_views() -> Program:
    def fn(x):
        return x.view(2, 10).t().sum(dim=1)

    return Program(fn, (CustomTensorPlainOut(torch.randn(4, 5), torch.randn(4, 5)).requires_grad_(True),))


@case("SubclassWithTensorFactory/fwd+bwd")
def _subclass_with_factory() -> Program:
    """Its dispatch calls the factory ``torch.ones`` on every op."""

    def fn(x, y):
        return (x * y + x).sin().sum(dim=1)

    x = SubclassWithTensorFactory(torch.randn(3, 4)).requires_grad_(True)
    return Program(fn, (x, torch.randn(3, 4, requires_grad=True)))


class _SubclassWeights(torch.nn.Module):
    """A frozen subclass Parameter, a subclass buffer and a trainable plain Parameter."""

    def __init__(self, make):
        super().__init__()
        self.frozen = torch.nn.Parameter(make(8, 16), requires_grad=False)
        self.register_buffer("offset", make(16))
        self.linear = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.linear(torch.tanh(x @ self.frozen + self.offset)).sum(dim=-1)


def _frozen_and_buffer(make, name: str) -> Case:
    return Case(name, lambda: Program(_SubclassWeights(make), (torch.randn(3, 8),)), trains="adamw")


@case("TwoTensor/plain@frozen-subclass-then-mul-by-subclass-requiring-grad")
def _two_tensor_mixed_grads() -> Program:
    """The gradient of ``x * 2`` is a TwoTensor here: thunder's rule for mul computes ``mul(2, g)``."""

    def fn(x, w, y, z):
        return ((x * 2) @ w * y + z).sum()

    frozen = TwoTensor(torch.randn(4, 4), torch.randn(4, 4))
    return Program(fn, (torch.randn(4, 4, requires_grad=True), frozen, _two(4, 4), torch.randn(4, 4)))


CASES: list[Case] = [
    _two_tensor_mixed_grads,
    _two_tensor_mixed,
    _two_tensor_weight,
    _wrapper_subclass,
    _constant_extra_metadata,
    _constant_extra_metadata_method,
    _custom_plain_out,
    _custom_plain_out_inner,
    _custom_plain_out_views,
    _subclass_with_factory,
    _frozen_and_buffer(
        lambda *s: TwoTensor(torch.randn(*s), torch.randn(*s)), "TwoTensor/frozen-param+buffer/training"
    ),
    _frozen_and_buffer(lambda *s: WrapperSubclass(torch.randn(*s)), "WrapperSubclass/frozen-param+buffer/training"),
    _frozen_and_buffer(
        lambda *s: ConstantExtraMetadataTensor(torch.randn(*s)),
        "ConstantExtraMetadataTensor/frozen-param+buffer/training",
    ),
    _frozen_and_buffer(
        lambda *s: CustomTensorPlainOut(torch.randn(*s), torch.randn(*s)),
        "CustomTensorPlainOut/frozen-param+buffer/training",
    ),
]
