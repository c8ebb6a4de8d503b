"""torchvision: detection ops (roi_align, focal and box losses), stochastic depth, Swin and
EfficientNet blocks (tiny), and the full swin_t / efficientnet_b0 (heavy)."""

from __future__ import annotations

import torch
import torchvision
from torch import nn
from torchvision import ops
from torchvision.models.efficientnet import MBConv, MBConvConfig
from torchvision.models.swin_transformer import SwinTransformerBlock

from .program import Program, idiom


class _RoIHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4 * 2 * 2, 2)

    def forward(self, images, boxes):
        features = self.backbone(images)
        pooled = ops.roi_align(features, boxes, output_size=(2, 2), spatial_scale=1.0, sampling_ratio=2)
        return self.head(pooled.flatten(1))


@idiom("roi_align")
def _roi_align() -> Program:
    boxes = [torch.tensor([[0.0, 0.0, 4.0, 4.0], [1.0, 2.0, 6.0, 7.0]]), torch.tensor([[2.0, 1.0, 5.5, 5.0]])]
    return Program(_RoIHead(), (torch.randn(2, 3, 8, 8), boxes))


class _DetectionLosses(nn.Module):
    def __init__(self):
        super().__init__()
        self.cls, self.box = nn.Linear(6, 3), nn.Linear(6, 4)

    def forward(self, x, labels, targets):
        raw = self.box(x)
        boxes = torch.cat([raw[:, :2], raw[:, :2] + raw[:, 2:].exp()], 1)
        focal = ops.sigmoid_focal_loss(self.cls(x), labels, reduction="mean")
        return focal + ops.generalized_box_iou_loss(boxes, targets, reduction="mean")


@idiom("sigmoid_focal_loss-generalized_box_iou_loss")
def _detection_losses() -> Program:
    targets = torch.tensor([[0.0, 0.0, 1.0, 2.0], [0.5, 0.5, 2.0, 1.5], [1.0, 0.0, 2.0, 1.0], [0.0, 1.0, 3.0, 2.0]])
    return Program(_DetectionLosses(), (torch.randn(4, 6), torch.rand(4, 3).round(), targets))


class _StochasticDepth(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Conv2d(3, 3, 3, padding=1), nn.ReLU())
        self.drop = ops.StochasticDepth(0.5, "row")

    def forward(self, x):
        return x + self.drop(self.block(x))


@idiom("torchvision-StochasticDepth-row")
def _stochastic_depth() -> Program:
    return Program(_StochasticDepth(), (torch.randn(4, 3, 4, 4),))


@idiom("swin-block-shifted-window")
def _swin_block() -> Program:
    block = SwinTransformerBlock(8, 2, [2, 2], [1, 1], mlp_ratio=2.0, stochastic_depth_prob=0.3)
    return Program(block, (torch.randn(2, 4, 4, 8),))


@idiom("efficientnet-MBConv-block")
def _mbconv() -> Program:
    config = MBConvConfig(4, 3, 1, 8, 8, 1)
    return Program(MBConv(config, 0.3, nn.BatchNorm2d), (torch.randn(2, 8, 6, 6),))


@idiom("torchvision-swin_t", heavy=True, steps=2)
def _swin_t() -> Program:
    return Program(torchvision.models.swin_t(num_classes=4), (torch.randn(1, 3, 64, 64),))


@idiom("torchvision-efficientnet_b0", heavy=True, steps=2)
def _efficientnet() -> Program:
    return Program(torchvision.models.efficientnet_b0(num_classes=4), (torch.randn(2, 3, 32, 32),))
