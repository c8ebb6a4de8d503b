"""Training-loop idioms: gradient clipping, common losses, normalization layers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .program import Program, idiom


def _mlp(n_out: int = 3) -> nn.Sequential:
    return nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Linear(12, n_out))


@idiom("clip_grad_norm_")
def _clip_norm() -> Program:
    return Program(
        _mlp(), (torch.randn(5, 6) * 10,), after_backward=lambda m: nn.utils.clip_grad_norm_(m.parameters(), 0.5)
    )


@idiom("clip_grad_value_")
def _clip_value() -> Program:
    return Program(
        _mlp(), (torch.randn(5, 6) * 10,), after_backward=lambda m: nn.utils.clip_grad_value_(m.parameters(), 0.1)
    )


class _Loss(nn.Module):
    def __init__(self, loss, n_out: int = 3):
        super().__init__()
        self.net, self.loss = _mlp(n_out), loss

    def forward(self, x, target):
        return self.loss(self.net(x), target)


_CLASSES = torch.tensor([0, 2, 1, 2, 0])


@idiom("cross_entropy-label_smoothing-ignore_index")
def _cross_entropy() -> Program:
    loss = lambda out, t: F.cross_entropy(out, t, label_smoothing=0.1, ignore_index=1)  # noqa: E731
    return Program(_Loss(loss), (torch.randn(5, 6), _CLASSES))


@idiom("cross_entropy-class-weights-probabilities")
def _cross_entropy_soft() -> Program:
    weights = torch.tensor([1.0, 2.0, 0.5])
    loss = lambda out, t: F.cross_entropy(out, t.softmax(-1), weight=weights)  # noqa: E731
    return Program(_Loss(loss), (torch.randn(5, 6), torch.randn(5, 3)))


@idiom("bce_with_logits-pos_weight")
def _bce() -> Program:
    loss = lambda out, t: F.binary_cross_entropy_with_logits(out, t, pos_weight=torch.tensor([2.0, 1.0, 0.5]))  # noqa: E731
    return Program(_Loss(loss), (torch.randn(5, 6), torch.rand(5, 3).round()))


@idiom("smooth_l1-huber-mse")
def _regression() -> Program:
    loss = lambda out, t: F.smooth_l1_loss(out, t, beta=0.5) + F.huber_loss(out, t, delta=0.3) + F.mse_loss(out, t)  # noqa: E731
    return Program(_Loss(loss), (torch.randn(5, 6), torch.randn(5, 3)))


@idiom("kl_div-log_softmax-batchmean")
def _kl() -> Program:
    loss = lambda out, t: F.kl_div(F.log_softmax(out, -1), t.softmax(-1), reduction="batchmean")  # noqa: E731
    return Program(_Loss(loss), (torch.randn(5, 6), torch.randn(5, 3)))


@idiom("nll-ctc-loss")
def _ctc() -> Program:
    class _CTC(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = _mlp(5)

        def forward(self, x, targets):
            log_probs = self.net(x).log_softmax(-1)  # (time, batch, classes)
            return F.ctc_loss(log_probs, targets, torch.tensor([6, 6]), torch.tensor([3, 2]))

    return Program(_CTC(), (torch.randn(6, 2, 6), torch.tensor([[1, 2, 3], [4, 1, 0]])))


@idiom("LayerNorm-GroupNorm-RMSNorm")
def _norms() -> Program:
    model = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.Flatten(2), nn.LayerNorm(16), nn.RMSNorm(16)
    )
    return Program(model, (torch.randn(2, 2, 4, 4),))


class _Accumulate(nn.Module):
    """Two micro-batches per step, the loss of each scaled (gradient accumulation in one forward)."""

    def __init__(self):
        super().__init__()
        self.net = _mlp()

    def forward(self, x):
        return sum(self.net(part).pow(2).mean() / 2 for part in x.chunk(2))


@idiom("micro-batches-in-forward")
def _accumulate() -> Program:
    return Program(_Accumulate(), (torch.randn(6, 6),))
