"""SimSiam (Chen & He 2021) on FPS pairs: Chen et al., ICLR 2023, §4.2, Eq. 7.

The two views go through backbone f and projector g; a predictor h maps one view's projection onto the
other's, which is held fixed (stop-gradient). The loss is symmetric:
L = D(h(z1), sg(z2)) / 2 + D(h(z2), sg(z1)) / 2, with D the negative cosine similarity.
Heads and D come from lightly; their sizes are the official FPS code's by default (andytu28/FPS_Pre-training,
``main_simsiam.py``: projector f -> f -> f -> 512 and predictor 512 -> 128 -> 512 at 32 px, f the backbone's
feature width; 2048/512 outputs at 224 px), ``heads=imagenet`` gives SimSiam's ImageNet heads (2048 wide).
Under torchrun every BatchNorm is synchronised over the processes, as the
SimSiam reference does, so the loss and the gradients are those of one process with the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightly.loss import NegativeCosineSimilarity
from lightly.models.modules import SimSiamPredictionHead, SimSiamProjectionHead
from torch import Tensor, nn

from fpsfl.base.settings import setting

from . import METHODS
from .base import HEADS, IMAGENET_HIDDEN, Method, ViewsConfig, feature_std, filled, split_head

_criterion = NegativeCosineSimilarity()


def simsiam_loss(p1: Tensor, p2: Tensor, z1: Tensor, z2: Tensor) -> Tensor:
    """Symmetric SimSiam loss (paper Eq. 7) of predictions p and projections z, all (B, D)."""
    return 0.5 * (_criterion(p1, z2.detach()) + _criterion(p2, z1.detach()))


@dataclass(frozen=True)
class SimSiamConfig(ViewsConfig):
    lr: float = setting(0.05, "per 256 samples, scaled linearly (SimSiam §4: lr = 0.05 * B / 256)",
                        within="(0, inf)")
    heads: str = setting("official", "head sizes: official (the FPS code's: hidden layers as wide as the "
                                     "backbone's features, 512/128 at 32 px, 2048/512 above) or imagenet "
                                     "(SimSiam §3: 2048-wide hidden layers, 2048/512)", choices=HEADS)
    hidden_dim: int | None = setting(None, "projector hidden width (default: the backbone's feature width, "
                                           "official; 2048, imagenet)", within="[1, inf)")
    proj_dim: int | None = setting(None, "projector output width (default: 512 at 32 px, 2048 above, "
                                         "official main_simsiam.py; 2048, imagenet)", within="[1, inf)")
    pred_dim: int | None = setting(None, "predictor bottleneck width (default: 128 at 32 px, 512 above, "
                                         "official; 512, imagenet)", within="[1, inf)")
    fixed_predictor_lr: bool = True  # SimSiam §4.1: the predictor's lr is not decayed

    def resolve(self, feature_dim: int, size: int = 32) -> SimSiamConfig:
        if self.heads == "imagenet":
            return filled(self, hidden_dim=IMAGENET_HIDDEN, proj_dim=2048, pred_dim=512)
        small = size <= 32  # the FPS code overrides SimSiam's 2048/512 with 512/128 at CIFAR scale
        return filled(self, hidden_dim=feature_dim, proj_dim=512 if small else 2048,
                      pred_dim=128 if small else 512)


@METHODS.register
class SimSiam(Method):
    name = "simsiam"
    Config = SimSiamConfig
    sync_bn = True  # SimSiam §4.1 / Appendix A: BN over the whole batch of all devices (SyncBN)

    def __init__(self, backbone: nn.Module, cfg: SimSiamConfig, n_classes: int | None = None):
        cfg = cfg.resolve(backbone.feature_dim)  # a no-op when built by the training loop, which resolves
        super().__init__(backbone, cfg)
        # projector Linear(f, h) BN ReLU, Linear(h, h) BN ReLU, Linear(h, d) BN(affine=False);
        # predictor d -> p (BN ReLU) -> d: the official heads
        self.projector = SimSiamProjectionHead(backbone.feature_dim, cfg.hidden_dim, cfg.proj_dim)
        self.predictor = SimSiamPredictionHead(cfg.proj_dim, cfg.pred_dim, cfg.proj_dim)

    def forward(self, views: Tensor, labels: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        # one pass per view, as the SimSiam reference: BatchNorm statistics are per view
        (pre1, z1), (_, z2) = (split_head(self.projector, self.backbone(v)) for v in views[:2])
        p1, p2 = self.predictor(z1), self.predictor(z2)
        # z_std before the projector's affine-free BatchNorm, where a collapse shows (issue 38)
        return simsiam_loss(p1, p2, z1, z2), {"z_std": feature_std(pre1)}

    def param_groups(self) -> list[dict]:
        pred = list(self.predictor.parameters())
        ids = {id(q) for q in pred}
        rest = [q for q in self.parameters() if id(q) not in ids]
        return [{"params": rest, "fixed_lr": False},
                {"params": pred, "fixed_lr": self.cfg.fixed_predictor_lr}]
