"""Multi-label fractal pre-training (Anderson & Farrell 2022), a baseline of Chen et al., ICLR 2023, Table 6.

Each image shows several of J = 1,000 fractal codes; a linear head predicts which, with binary
cross-entropy over the J outputs. The head is dropped from the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from fpsfl.base.settings import setting

from . import METHODS
from .base import CROP_FLIP, Method, MethodConfig, feature_std


@dataclass(frozen=True)
class MultiLabelConfig(MethodConfig):
    lr: float = setting(0.1, "per 256 samples, scaled linearly (the standard supervised recipe, Goyal et al. "
                             "2017; not the paper's: Chen et al. give no multi-label recipe)",
                        within="(0, inf)")


@METHODS.register
class MultiLabel(Method):
    name = "multilabel"
    Config = MultiLabelConfig
    n_views = 1
    labels = "multihot"
    augment = CROP_FLIP

    def __init__(self, backbone: nn.Module, cfg: MultiLabelConfig, n_classes: int | None = None):
        super().__init__(backbone, cfg)
        if not n_classes:
            raise ValueError("multilabel needs the number of classes J")
        self.head = nn.Linear(backbone.feature_dim, n_classes)

    def forward(self, views: Tensor, labels: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        h = self.backbone(views[0])
        logits = self.head(h)
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float()), {"z_std": feature_std(h)}
