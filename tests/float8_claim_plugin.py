"""A real claim plugin for the tests: takes ``torch.mm`` of two float8 training tensors before
autodiff, with its own forward and backward written in torch. Unlike the float8 plugin's rule
(e5m2 gradients through ``_scaled_mm``) its backward works in high precision, so the tests can
tell the rules apart. It counts how often its rule is traced."""

import torch
from torchao.float8.float8_training_tensor import Float8TrainingTensor

from thunderplug import SubclassOpClaim, hookimpl
from thunderplug.subclass.values import SubclassTensorProxy

calls = {"forward": 0, "backward": 0}


def float8_mm_checker(a, b):
    for value in (a, b):
        if not (isinstance(value, SubclassTensorProxy) and value.subclass_type is Float8TrainingTensor):
            return "needs two Float8TrainingTensor operands"
    if a.shape[-1] % 16:
        return f"K (= {a.shape[-1]}) not divisible by 16"
    return None


def float8_mm_forward(a, b):
    calls["forward"] += 1
    return torch.mm(a, b)


def float8_mm_backward(a, b, grad):
    calls["backward"] += 1
    a_hp, b_hp = a.to_original_precision(), b.to_original_precision()
    return grad @ b_hp.t(), a_hp.t() @ grad


class EagerFloat8MM(torch.autograd.Function):
    """The same rule in eager PyTorch: the reference the compiled numbers are checked against."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return torch.mm(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return float8_mm_backward(a, b, grad)


def plugin(executor_name: str):
    class Float8ClaimPlugin:
        @hookimpl
        def register_claims(self, register):
            register(
                SubclassOpClaim(
                    executor=executor_name,
                    target="Float8TrainingTensor.torch.mm",
                    checker=float8_mm_checker,
                    forward=float8_mm_forward,
                    backward=float8_mm_backward,
                )
            )

    return Float8ClaimPlugin()
