"""FedAvg over SimSiam (Chen & He 2021): the simpler federated self-supervised baseline beside Orchestra
(Chen et al., ICLR 2023, §5), without its clustering, target network or rotation head.

Each client trains pre-training's own SimSiam (:class:`pretrain.methods.simsiam.SimSiam`: the FPS code's
projector and predictor heads, the symmetric negative-cosine loss) on two views of its images with the
MoCo-v2 / SimSiam augmentations of pre-training; the server averages every entry, heads included (as the
official Orchestra code's SimSiam baseline does without its divergence-aware update). Loading it loads
lightly (its heads and loss), which federate's own start-up never does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from fpsfl.base.settings import setting
from pretrain.methods.base import HEADS
from pretrain.methods.simsiam import SimSiam, SimSiamConfig

from .. import FED_SSL
from ..base import ClientRun, FederatedSSL, SSLConfig
from ..views import views


@dataclass(frozen=True)
class FedSimSiamConfig(SSLConfig):
    heads: str = setting("official", "SimSiam head sizes, as pretrain's: official (the FPS code's) or "
                                     "imagenet (SimSiam §3)", choices=HEADS)


@FED_SSL.register
class FedSimSiam(FederatedSSL):
    name = "fedsimsiam"
    Config = FedSimSiamConfig

    def build(self, backbone: nn.Module, size: int) -> nn.Module:
        return SimSiam(backbone, SimSiamConfig(heads=self.cfg.heads).resolve(backbone.feature_dim, size))

    def loss(self, model: SimSiam, images: Tensor, run: ClientRun) -> tuple[Tensor, dict[str, Tensor]]:
        pair = views(images, (model.augment, model.augment), run.aug_gen, run.size, noise=run.noise)
        loss, stats = model(torch.stack(pair))
        return loss, {k: v.detach() for k, v in stats.items()}
