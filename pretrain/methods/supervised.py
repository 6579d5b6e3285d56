"""Supervised pre-training on a labelled image folder: the real-data rows of Chen et al., ICLR 2023, §4.5.

Cross-entropy with a linear head over the folder's classes, e.g. ImageNet-32 for the paper's ResNet20
baseline or a Places365 stand-in. The head is dropped from the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from fpsfl.base.settings import setting

from . import METHODS
from .base import CROP_FLIP, Method, MethodConfig, feature_std


@dataclass(frozen=True)
class SupervisedConfig(MethodConfig):
    lr: float = setting(0.1, "per 256 samples, scaled linearly (Goyal et al. 2017)", within="(0, inf)")
    label_smoothing: float = setting(0.0, "label smoothing of the cross-entropy (0: plain)", within="[0, 1)")


@METHODS.register
class Supervised(Method):
    name = "supervised"
    Config = SupervisedConfig
    n_views = 1
    labels = "class"
    augment = CROP_FLIP

    def __init__(self, backbone: nn.Module, cfg: SupervisedConfig, n_classes: int | None = None):
        super().__init__(backbone, cfg)
        if not n_classes or n_classes < 2:
            raise ValueError("supervised pre-training needs at least 2 classes")
        self.head = nn.Linear(backbone.feature_dim, n_classes)

    def forward(self, views: Tensor, labels: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        h = self.backbone(views[0])
        logits = self.head(h).float()
        loss = F.cross_entropy(logits, labels, label_smoothing=self.cfg.label_smoothing)
        acc = (logits.argmax(1) == labels).float().mean()
        return loss, {"z_std": feature_std(h), "acc": acc.detach()}
