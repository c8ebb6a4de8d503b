"""torch.distributions inside forward: a VAE (Normal.rsample, kl_divergence), Categorical policies."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributions import Categorical, Normal, kl_divergence

from .program import Program, idiom


class _VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(8, 8)
        self.decoder = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8))

    def forward(self, x):
        mean, log_scale = self.encoder(x).chunk(2, -1)
        posterior = Normal(mean, log_scale.exp())
        z = posterior.rsample()
        recon = self.decoder(z)
        kl = kl_divergence(posterior, Normal(torch.zeros_like(mean), torch.ones_like(mean))).sum(-1)
        return ((recon - x) ** 2).sum(-1).mean() + kl.mean()


@idiom("vae-Normal-rsample-kl")
def _vae() -> Program:
    return Program(_VAE(), (torch.randn(4, 8),))


class _NormalLogProb(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 4)

    def forward(self, x, target):
        mean, log_scale = self.net(x).chunk(2, -1)
        dist = Normal(mean, log_scale.exp())
        return -dist.log_prob(target).mean() + dist.entropy().mean()


@idiom("Normal-log_prob-entropy")
def _normal_log_prob() -> Program:
    return Program(_NormalLogProb(), (torch.randn(5, 4), torch.randn(5, 2)))


class _Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 3)

    def forward(self, state, actions, advantages):
        dist = Categorical(logits=self.net(state))
        return -(dist.log_prob(actions) * advantages).mean() - 0.01 * dist.entropy().mean()


@idiom("Categorical-policy-gradient")
def _policy() -> Program:
    return Program(_Policy(), (torch.randn(6, 4), torch.tensor([0, 2, 1, 1, 0, 2]), torch.randn(6)))
