"""The interface every federated self-supervised method implements (Chen et al., ICLR 2023, §5).

A method builds the model whose whole state the server averages (the backbone, its heads, and whatever the
clients read, such as Orchestra's global centroids), turns a batch of a client's images into a loss, and may
add a client step after local training (a payload for the server) and a server step after the FedAvg
average of the states (McMahan et al. 2017). Clients are stateless: everything a client needs arrives
with the global state each round, and what it computes beyond its model travels back in
:attr:`ClientUpdate.extra`. The round loop (:mod:`federated.selfsup.rounds`) knows nothing else.

Labels never reach a method: a client's round (:class:`ClientRun`) holds its images only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from fpsfl.base.settings import check

from ..aggregate import State
from ..local import DivergenceError, make_optimizer


@dataclass(frozen=True)
class SSLConfig:
    """A method's hyperparameters (``--set KEY=VALUE``); fields made with :func:`fpsfl.base.settings.setting`
    declare their range, checked here."""

    def __post_init__(self) -> None:
        check(self, style="key")


@dataclass
class ClientRun:
    """One client's part of a round: its own images (never labels), its steps and its randomness."""

    rnd: int  # the round (0: a method's warm-up round, see FederatedSSL.warmup_rounds)
    client: int
    images: Tensor  # uint8 (n, S, S, 3), the client's training images, on the training device
    batches: list[Tensor]  # positions in ``images``, one entry per local step (all local epochs)
    aug_gen: torch.Generator  # the augmentations' draws (on the training device)
    gen: torch.Generator  # the method's other draws (Orchestra: the first local centroids), CPU
    lr: float
    momentum: float
    weight_decay: float
    size: int  # px side the model sees
    noise: float = 0.0  # Gaussian noise sigma of this client's images ([0, 1] px units; the noise partition)
    scratch: dict[str, Any] = field(default_factory=dict)  # the method's working memory for this round


@dataclass
class ClientUpdate:
    """What a client sends back: its model state, its FedAvg weight, the method's payload, statistics."""

    client: int
    state: State
    n_samples: int
    extra: dict[str, Tensor] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)


class FederatedSSL:
    """FedAvg over a self-supervised loss. Subclasses set ``name`` and ``Config`` and implement :meth:`build`
    and :meth:`loss`; Orchestra also overrides :meth:`client_round` and :meth:`server_update`."""

    name: ClassVar[str]
    Config: ClassVar[type[SSLConfig]] = SSLConfig
    warmup_rounds: ClassVar[int] = 0  # rounds before the first training round (Orchestra: its centroids)

    def __init__(self, cfg: SSLConfig):
        self.cfg = cfg

    def build(self, backbone: nn.Module, size: int) -> nn.Module:
        """The federated model around ``backbone`` (kept as its ``backbone`` attribute: the checkpoint), for
        inputs of ``size`` px."""
        raise NotImplementedError

    def loss(self, model: nn.Module, images: Tensor, run: ClientRun) -> tuple[Tensor, dict[str, Tensor]]:
        """uint8 images (B, S, S, 3) of the client -> (scalar loss, detached statistics)."""
        raise NotImplementedError

    # ---- client ------------------------------------------------------------------------------------
    def client_round(self, model: nn.Module, run: ClientRun) -> tuple[dict[str, Tensor], dict[str, float]]:
        """The client's work in round ``run.rnd`` on ``model`` (the global model, trained in place):
        (payload for the server, statistics). Default: local SGD, no payload."""
        return {}, self.local_train(model, run)

    def local_train(self, model: nn.Module, run: ClientRun) -> dict[str, float]:
        """SGD with momentum and weight decay over ``run.batches`` (a fresh optimiser each round: the
        clients are stateless); returns the mean of the loss and of every statistic."""
        model.train()
        optimizer = make_optimizer(model, "sgd", run.lr, run.momentum, run.weight_decay)
        totals: dict[str, Tensor] = {}
        for batch in run.batches:
            loss, stats = self.loss(model, run.images[batch.to(run.images.device)], run)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            for key, value in {"loss": loss.detach(), **stats}.items():
                totals[key] = totals.get(key, 0.0) + value.float()
        means = {k: float(v) / max(len(run.batches), 1) for k, v in totals.items()}
        if not math.isfinite(means.get("loss", 0.0)):
            raise DivergenceError(f"client {run.client}: the local loss became {means['loss']}")
        return means

    # ---- server ------------------------------------------------------------------------------------
    def server_update(self, state: State, updates: list[ClientUpdate]) -> tuple[State, dict[str, float]]:
        """After the FedAvg average ``state`` of the clients' states: the new global state and the server's
        statistics. Default: the average itself."""
        return state, {}
