"""CIFAR-style ResNets (He et al., CVPR 2016, §4.2), the backbones of Chen et al., ICLR 2023, §4.2.

A 3x3 convolution with 16 channels, then three stages of n basic blocks with 16, 32 and 64 channels (the
first block of stages 2 and 3 halves the side), global average pooling: 6n + 2 weighted layers counting the
classifier, so ResNet20/32/44/56 have n = 3/5/7/9. The shortcuts are option A of He et al. §3.3: identity,
and where a block downsamples, the input subsampled by 2 and zero-padded to the new channels, with no
parameters, which is what makes ResNet20 0.27M parameters (their Table 6). The classifier is not part of
the backbone: ``forward`` returns the pooled (B, 64·w) features.

``width`` multiplies every channel count (rounded, at least 1); width 1 is He et al.'s network.
"""

from __future__ import annotations

from functools import partial

import torch.nn.functional as F
from torch import Tensor, nn

from . import register_backbone

STAGE_CHANNELS = (16, 32, 64)  # channels of the three stages at width 1 (He et al. 2016, §4.2)
STAGE_STRIDES = (1, 2, 2)  # the first block of stages 2 and 3 halves the side: 32 -> 16 -> 8 px


def scaled(channels: int, width: float) -> int:
    """``channels`` times the width multiplier, rounded, at least 1."""
    return max(1, round(channels * width))


class ShortcutA(nn.Module):
    """Option-A shortcut (He et al. 2016, §3.3): subsample by ``stride``, zero-pad the new channels."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.extra = out_channels - in_channels  # channels appended as zeros after the input's
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:  # (B, C_in, H, W) -> (B, C_out, ceil(H/s), ceil(W/s))
        if self.stride > 1:
            # x[..., ::2, ::2] has ceil(H/2) rows, as many as a stride-2 3x3 convolution with padding 1
            x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, 0, self.extra)) if self.extra else x


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with a ReLU between and after the residual sum (He et al. 2016, Fig. 2)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        if stride == 1 and in_channels == out_channels:
            self.shortcut: nn.Module = nn.Identity()
        else:
            self.shortcut = ShortcutA(in_channels, out_channels, stride)

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for 32 px inputs without its classifier; any side >= 8 px works (8 -> 4 -> 2)."""

    def __init__(self, depth: int, width: float = 1.0):
        super().__init__()
        if depth < 8 or (depth - 2) % 6:
            raise ValueError(f"CIFAR ResNet depth must be 6n + 2 with n >= 1, got {depth}")
        if width <= 0:
            raise ValueError(f"width must be > 0, got {width}")
        blocks = (depth - 2) // 6
        channels = [scaled(c, width) for c in STAGE_CHANNELS]
        self.conv1 = nn.Conv2d(3, channels[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels[0])
        stages, in_channels = [], channels[0]
        for out_channels, stride in zip(channels, STAGE_STRIDES, strict=True):
            layers = []
            for i in range(blocks):
                layers.append(BasicBlock(in_channels, out_channels, stride if i == 0 else 1))
                in_channels = out_channels
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3 = stages
        self.feature_dim: int = channels[-1]
        for m in self.modules():
            if isinstance(m, nn.Conv2d):  # std sqrt(2 / fan_in): He et al. 2015 eq. 10, per He et al. 2016
                nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:  # (B, 3, S, S) -> (B, feature_dim)
        x = F.relu(self.bn1(self.conv1(x)))  # (B, 16w, S, S)
        x = self.layer3(self.layer2(self.layer1(x)))  # (B, 64w, S/4, S/4)
        return x.mean(dim=(2, 3))


def _register(depth: int, params: str) -> None:
    register_backbone(f"resnet{depth}", min_size=8, has_width=True,
                      description=f"CIFAR ResNet{depth}, option-A shortcuts, {params} params at width 1 "
                                  f"(He et al. 2016, §4.2)")(partial(CifarResNet, depth))


for _depth, _params in ((20, "0.27M"), (32, "0.46M"), (44, "0.66M"), (56, "0.85M")):
    _register(_depth, _params)
