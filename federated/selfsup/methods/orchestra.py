"""Orchestra (Lubana, Tang, Kawsar & Mathur, ICML 2022): unsupervised federated learning by globally
consistent clustering, the self-pre-training of Chen et al., ICLR 2023, §5 and App. B.3.

The model is an online network (backbone + projector) and an EMA target copy of it, a rotation head (the
degeneracy regulariser) and the global centroids. Each local step (official ``orchestra.forward``):

- view 1 through the target, after the target moved towards the online network (EMA, decay 0.996), gives
  the target's soft assignment to the global centroids; view 2 through the online network gives the
  online assignment; L_cluster is their cross-entropy (:func:`.clustering.cluster_loss`);
- view 3, rotated by a random quarter turn, through the online network and the rotation head gives
  L_deg, the cross-entropy of the predicted turn: it keeps the representations from collapsing;
- the target's view-1 representations enter the client's memory (the last ``memory`` of them).

After local training the client clusters its memory into ``local_clusters`` equal-size clusters and sends
their centroids with its model; the server averages the models (FedAvg over every entry, target included:
the *stateless* configuration Chen et al. use, where clients keep nothing between rounds) and clusters all
local centroids into ``global_clusters`` global centroids, which the next round's clients read. Round 0
trains nothing: the clients fill their memory and cluster it, so that round 1 starts with global centroids
(the official code runs ``--rounds`` + 1 rounds for this).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fpsfl.base.images import AugmentConfig
from fpsfl.base.settings import setting

from ...aggregate import State
from .. import FED_SSL
from ..base import ClientRun, ClientUpdate, FederatedSSL, SSLConfig
from ..clustering import cluster_loss, ema_, global_clustering, local_clustering
from ..views import rotate, rotations, views

LOCAL_ITERS = 5  # K-means iterations of the local clustering (official local_clustering: local_iters)
LOCAL_SK_ITERS = 10  # Sinkhorn-Knopp iterations inside each of them (official: sknopp(..., max_iters=10))
QUARTER_TURNS = 4  # classes of the rotation head (official deg_layer: Linear(512, 4))

# The official OrchestraTransform: view 1 (and view 3 before its rotation) and view 2, at scale (0.5, 1) with
# BYOL's colour and blur settings (jitter 0.4/0.4/0.2/0.1 with p 0.8, grayscale 0.2, 3 px blur), view 2
# with less blur and with solarisation; normalised with ImageNet's statistics as every fpsfl stage
VIEW = AugmentConfig(crop_scale=(0.5, 1.0), jitter=(0.4, 0.4, 0.2, 0.1), blur_p=0.5, blur_kernel=3)
VIEW_PRIME = AugmentConfig(crop_scale=(0.5, 1.0), jitter=(0.4, 0.4, 0.2, 0.1), blur_p=0.1, blur_kernel=3)
SOLARIZE_P = (0.0, 0.2, 0.0)  # per view (official Solarization(p=0.2) in view 2 only)


@dataclass(frozen=True)
class OrchestraConfig(SSLConfig):
    local_clusters: int = setting(32, "equal-size clusters of each client's representations (App. B.3: 32 "
                                      "on CIFAR-10; Tiny-ImageNet's preset: 256)", within="[1, inf)")
    global_clusters: int = setting(8, "the server's clusters of all local centroids (App. B.3: 8 on "
                                      "CIFAR-10; Tiny-ImageNet's preset: 32)", within="[1, inf)")
    memory: int = setting(128, "target representations a client clusters, its last ones (official "
                               "config.py: cluster_m_size)", within="[1, inf)")
    temperature: float = setting(0.1, "softmax temperature of the cluster assignments (official main_T)",
                                 within="(0, inf)")
    ema: float = setting(0.996, "decay of the target network (official ema_value)", within="[0, 1]")
    hidden_dim: int = setting(512, "projector hidden width (official projection_MLP_orchestra)",
                              within="[1, inf)")
    proj_dim: int = setting(512, "projector output width, the space of the centroids (official)",
                            within="[1, inf)")
    server_steps: int = setting(500, "SGD steps of the server's clustering each round (official "
                                     "global_clustering: total_rounds)", within="[1, inf)")
    server_lr: float = setting(0.01, "lr of the server's clustering SGD, momentum 0.9, weight decay 1e-4 "
                                     "(official)", within="(0, inf)")


def projector(in_dim: int, hidden: int, out: int) -> nn.Sequential:
    """Linear-BN-ReLU-Linear-BN without biases, the last BatchNorm without affine parameters (official
    projection_MLP_orchestra)."""
    return nn.Sequential(nn.Linear(in_dim, hidden, bias=False), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True),
                         nn.Linear(hidden, out, bias=False), nn.BatchNorm1d(out, affine=False))


class OrchestraModel(nn.Module):
    """Online network, EMA target network (no gradients), rotation head and global centroids (G, D), a
    buffer: the clients read it, only the server changes it."""

    def __init__(self, backbone: nn.Module, cfg: OrchestraConfig):
        super().__init__()
        self.backbone = backbone
        self.projector = projector(backbone.feature_dim, cfg.hidden_dim, cfg.proj_dim)
        self.target_backbone = copy.deepcopy(backbone).requires_grad_(False)
        self.target_projector = copy.deepcopy(self.projector).requires_grad_(False)
        self.deg_layer = nn.Linear(cfg.proj_dim, QUARTER_TURNS)
        bound = 1 / math.sqrt(cfg.proj_dim)  # nn.Linear's default init, as the official centroids layer
        centroids = torch.empty(cfg.global_clusters, cfg.proj_dim).uniform_(-bound, bound)
        self.register_buffer("centroids", centroids)

    def online(self, x: Tensor) -> Tensor:
        return self.projector(self.backbone(x))

    def target(self, x: Tensor) -> Tensor:
        return self.target_projector(self.target_backbone(x))

    @torch.no_grad()
    def update_target(self, decay: float) -> None:
        online = [*self.backbone.parameters(), *self.projector.parameters()]
        target = [*self.target_backbone.parameters(), *self.target_projector.parameters()]
        ema_(target, online, decay)


@FED_SSL.register
class Orchestra(FederatedSSL):
    name = "orchestra"
    Config = OrchestraConfig
    warmup_rounds = 1  # round 0: memories and local clusters only, to initialise the global centroids

    def build(self, backbone: nn.Module, size: int) -> nn.Module:
        return OrchestraModel(backbone, self.cfg)

    def loss(self, model: OrchestraModel, images: Tensor, run: ClientRun) -> tuple[Tensor, dict[str, Tensor]]:
        cfg = self.cfg
        x1, x2, x3 = views(images, (VIEW, VIEW_PRIME, VIEW), run.aug_gen, run.size, SOLARIZE_P, run.noise)
        turns = rotations(images.shape[0], run.aug_gen, x3.device)
        x3 = rotate(x3, turns)
        centroids = model.centroids.detach()
        z2 = F.normalize(model.online(x2), dim=1)
        model.update_target(cfg.ema)  # before the target's forward, as the official step
        with torch.no_grad():
            t1 = F.normalize(model.target(x1), dim=1)
        l_cluster = cluster_loss(z2, t1, centroids, cfg.temperature)
        logits = model.deg_layer(model.online(x3))
        l_deg = F.cross_entropy(logits, turns)
        run.scratch.setdefault("memory", []).append(t1.detach())
        stats = {"loss_cluster": l_cluster.detach(), "loss_deg": l_deg.detach(),
                 "deg_acc": (logits.argmax(1) == turns).float().mean().detach(),
                 "z_std": z2.detach().float().std(dim=0).mean()}  # ~1/sqrt(D) spread, 0 collapsed
        return l_cluster + l_deg, stats

    def client_round(self, model: OrchestraModel, run: ClientRun) -> tuple[dict[str, Tensor],
                                                                           dict[str, float]]:
        if run.rnd < self.warmup_rounds:
            memory, stats = self._first_memory(model, run), {}
        else:
            stats = self.local_train(model, run)
            bank = run.scratch.pop("memory", [])
            # a client too small for one step (natural partitions allow 1 sample) clusters as in round 0
            memory = torch.cat(bank)[-self.cfg.memory:] if bank else self._first_memory(model, run)
        centroids = local_clustering(memory.float(), self.cfg.local_clusters, run.gen, LOCAL_ITERS,
                                     LOCAL_SK_ITERS)
        return {"local_centroids": centroids.cpu()}, stats

    @torch.no_grad()
    def _first_memory(self, model: OrchestraModel, run: ClientRun) -> Tensor:
        """The target's representations of the client's first ``memory`` images in a shuffled order (view
        1), in training mode with the BatchNorm statistics left as they were (official reset_memory)."""
        model.train()
        buffers = {k: v.clone() for k, v in model.named_buffers()}
        bank, seen = [], 0
        for batch in run.batches:
            if seen >= self.cfg.memory:
                break
            (x1,) = views(run.images[batch.to(run.images.device)], (VIEW,), run.aug_gen, run.size,
                         noise=run.noise)
            bank.append(F.normalize(model.target(x1), dim=1))
            seen += len(batch)
        model.load_state_dict(buffers, strict=False)
        return torch.cat(bank)[: self.cfg.memory]

    def server_update(self, state: State, updates: list[ClientUpdate]) -> tuple[State, dict[str, float]]:
        points = torch.cat([u.extra["local_centroids"] for u in updates]).to(state["centroids"])
        centroids = global_clustering(points, state["centroids"], self.cfg.temperature, self.cfg.server_steps,
                                      self.cfg.server_lr)
        used = (points @ centroids.T).argmax(1).unique().numel()  # a collapse signal: 1 means all in one
        return {**state, "centroids": centroids}, {"global_clusters_used": float(used)}
