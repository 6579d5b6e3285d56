"""FedAvg (McMahan et al. 2017) and the hooks every FedAvg-family algorithm overrides.

Chen et al., ICLR 2023, §4.3 and Table 9 compare FedAvg with FedProx, FedDyn, MOON, SCAFFOLD and FedNova
(here also FedAvgM, FedVC and FedIR). Like Flower's strategies, the round loop
(:mod:`federated.rounds`) owns the orchestration and calls these hooks; an algorithm overrides only what
it changes. Per-client and server state lives in the algorithm object and is saved with the round
checkpoint through :meth:`FedAvg.state_dict`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from torch import Tensor, nn

from ..aggregate import State, weighted_average
from ..task import Task


@dataclass(frozen=True)
class AlgoConfig:
    """Hyperparameters of an algorithm; FedAvg has none."""


@dataclass
class ClientContext:
    """What one client's local training knows: the round's global model and its own persistent state."""

    client: int
    global_model: nn.Module  # frozen copy of the round's global model
    lr: float
    momentum: float
    state: dict[str, Any]  # this client's persistent state (owned by the algorithm)
    steps: int = 0  # optimiser steps taken so far in this round


@dataclass
class ClientResult:
    client: int
    state: State  # the local model's state_dict after training (CPU or device tensors)
    n_samples: int  # samples the client trained on (its aggregation weight in FedAvg)
    steps: int
    extra: dict[str, Any] = field(default_factory=dict)


class FedAvg:
    name: ClassVar[str] = "fedavg"
    Config: ClassVar[type[AlgoConfig]] = AlgoConfig
    requires: ClassVar[frozenset[str]] = frozenset()  # task capabilities it needs (see federated.task.Task)

    def __init__(self, cfg: AlgoConfig, client_sizes: list[int], class_counts: np.ndarray):
        self.cfg = cfg
        self.sizes = list(client_sizes)
        self.class_counts = np.asarray(class_counts, dtype=np.float64)  # (clients, classes)
        self.clients: list[dict[str, Any]] = [{} for _ in client_sizes]
        self.server: dict[str, Any] = {}

    # ---- model and sampling -------------------------------------------------------------------------
    def prepare_model(self, model: nn.Module) -> None:
        """Add algorithm-specific modules to the global model before training starts (MOON)."""

    def select(self, rng: np.random.Generator, fraction: float) -> list[int]:
        """Clients of this round: a uniform sample of round(fraction * N) (at least 1), sorted."""
        n = len(self.sizes)
        m = max(1, round(fraction * n))
        return sorted(range(n)) if m >= n else sorted(rng.choice(n, m, replace=False).tolist())

    def round_pool(self, client: int, indices: Tensor, rng: np.random.Generator) -> Tensor:
        """The sample indices the client trains on this round (all of them; FedVC resamples)."""
        return indices

    # ---- local training ------------------------------------------------------------------------------
    def local_loss(self, ctx: ClientContext, model: nn.Module, task: Task, inputs: Tensor,
                   targets: Tensor) -> Tensor:
        return task.loss(model(inputs), targets).mean()

    def before_step(self, ctx: ClientContext, model: nn.Module) -> None:
        """After backward, before the optimiser step (SCAFFOLD corrects the gradients here)."""

    def finish_client(self, ctx: ClientContext, model: nn.Module) -> dict[str, Any]:
        """After local training; returns extra payload for :meth:`aggregate`."""
        return {}

    # ---- server --------------------------------------------------------------------------------------
    def aggregate(self, global_state: State, results: list[ClientResult]) -> State:
        """The new global state: the sample-weighted average of the local states."""
        return weighted_average([r.state for r in results], [r.n_samples for r in results])

    # ---- persistence ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"server": self.server, "clients": self.clients}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.server, self.clients = state["server"], state["clients"]


def param_state(model: nn.Module) -> dict[str, Tensor]:
    """The model's trainable parameters by name (no buffers), detached."""
    return {k: p.detach() for k, p in model.named_parameters()}
