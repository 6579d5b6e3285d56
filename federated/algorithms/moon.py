"""MOON (Li, He & Song 2021): model-contrastive federated learning.

A projection head maps the backbone features h to z, and the classifier reads z, as in MOON's reference
model (features -> 2-layer MLP -> output layer). The local loss adds
mu * -log( exp(cos(z, z_glob)/tau) / (exp(cos(z, z_glob)/tau) + exp(cos(z, z_prev)/tau)) ),
pulling the local representation towards the global model's and away from the client's previous local
model's. Chen et al., ICLR 2023, §4.3 and Fig. 4 run it without stating its settings; tau = 0.5 is
MOON's. MOON's own default mu is 5 on CIFAR-10 and 1
on CIFAR-100 / Tiny-ImageNet (the cifar10 preset sets 5).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fpsfl.base.settings import setting

from . import ALGORITHMS
from .base import AlgoConfig, ClientContext, FedAvg


@dataclass(frozen=True)
class MoonConfig(AlgoConfig):
    mu: float = setting(1.0, "weight of the model-contrastive term (MOON: 1 for CIFAR-100/Tiny, 5 for "
                             "CIFAR-10)", within="[0, inf)")
    tau: float = setting(0.5, "temperature (MOON's default, Li, He & Song 2021)", within="(0, inf)")
    proj_dim: int = setting(256, "projection head output (MOON: 2-layer MLP, 256-d)", within="[1, inf)")


def moon_contrastive(z: Tensor, z_glob: Tensor, z_prev: Tensor, tau: float) -> Tensor:
    """Per-sample model-contrastive loss, (B,): the global representation is the positive."""
    pos = F.cosine_similarity(z, z_glob, dim=1) / tau
    neg = F.cosine_similarity(z, z_prev, dim=1) / tau
    return -pos + torch.logsumexp(torch.stack([pos, neg], 1), 1)


@ALGORITHMS.register
class Moon(FedAvg):
    name = "moon"
    Config = MoonConfig
    requires = frozenset({"features"})  # model.features(x), model.projector and model.head

    def prepare_model(self, model: nn.Module) -> None:
        dim = model.backbone.feature_dim
        model.projector = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(inplace=True),
                                        nn.Linear(dim, self.cfg.proj_dim))
        model.head = nn.Linear(self.cfg.proj_dim, model.head.out_features)

    def shared_tensors(self, ctx: ClientContext) -> dict:
        return {"global": {k: v.detach() for k, v in ctx.global_model.state_dict().items()}}

    def client_tensors(self, ctx: ClientContext, model: nn.Module) -> dict:
        # a client's first round: its previous model is the global one
        prev = ctx.state.get("prev") or ctx.global_model.state_dict()
        return {"prev": {k: v.detach() for k, v in prev.items()}}

    def functional_loss(self, fm, params, buffers, x, y, client, shared) -> Tensor:
        z, logits = fm(params, buffers, x, with_z=True)
        loss = fm.task.loss(logits, y).mean()
        with torch.no_grad():
            z_glob = fm.frozen(shared["global"], x, with_z=True)[0]
            z_prev = fm.frozen(client["prev"], x, with_z=True)[0]
        return loss + self.cfg.mu * moon_contrastive(z, z_glob, z_prev, self.cfg.tau).mean()

    @torch.no_grad()
    def finish_client(self, ctx: ClientContext, model: nn.Module) -> dict:
        ctx.state["prev"] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        return {}
