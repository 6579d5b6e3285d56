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

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fpsfl.base.settings import setting

from ..tasks import Task
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

    @staticmethod
    def _z(model: nn.Module, inputs: Tensor) -> Tensor:
        return model.projector(model.features(inputs))

    def local_loss(self, ctx: ClientContext, model: nn.Module, task: Task, inputs: Tensor,
                   targets: Tensor) -> Tensor:
        z = self._z(model, inputs)
        loss = task.loss(model.head(z), targets).mean()
        prev = ctx.state.get("prev")
        with torch.no_grad():
            z_glob = self._z(ctx.global_model, inputs)
            if prev is None:  # first round of this client: its previous model is the global one
                z_prev = z_glob
            else:
                if "_prev_model" not in ctx.state:  # built once per client round, dropped in finish_client
                    ctx.state["_prev_model"] = copy.deepcopy(ctx.global_model)
                    ctx.state["_prev_model"].load_state_dict(prev)
                z_prev = self._z(ctx.state["_prev_model"], inputs)
        return loss + self.cfg.mu * moon_contrastive(z, z_glob, z_prev, self.cfg.tau).mean()

    def shared_tensors(self, ctx: ClientContext) -> dict:
        return {"global": {k: v.detach() for k, v in ctx.global_model.state_dict().items()}}

    def client_tensors(self, ctxs: list[ClientContext], model: nn.Module) -> dict:
        glob = {k: v.detach() for k, v in ctxs[0].global_model.state_dict().items()}
        prev = [{k: v.to(glob[k].device) for k, v in ctx.state["prev"].items()} if "prev" in ctx.state
                else glob for ctx in ctxs]  # a client's first round: its previous model is the global one
        return {"prev": {k: torch.stack([p[k] for p in prev]) for k in glob}}

    def functional_loss(self, fm, params, buffers, x, y, client, shared) -> Tensor:
        z, logits = fm(params, buffers, x, with_z=True)
        loss = fm.task.loss(logits, y).mean()
        with torch.no_grad():
            z_glob = fm.frozen(shared["global"], x, with_z=True)[0]
            z_prev = fm.frozen(client["prev"], x, with_z=True)[0]
        return loss + self.cfg.mu * moon_contrastive(z, z_glob, z_prev, self.cfg.tau).mean()

    @torch.no_grad()
    def finish_client(self, ctx: ClientContext, model: nn.Module) -> dict:
        ctx.state.pop("_prev_model", None)
        ctx.state["prev"] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        return {}
