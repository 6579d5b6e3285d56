"""One round of federated self-pre-training, in the three parts every engine shares (Chen et al., ICLR 2023,
§5; McMahan et al. 2017, Algorithm 1).

:func:`select_clients` (the server: which clients train, from (seed, round) as in supervised ``federate``),
:func:`client_run` + :func:`train_client` (a client: its steps, generators and local work, from (seed,
round, client) alone, so a Flower ClientApp computes exactly what the in-process loop computes), and
:func:`aggregate` (the server: FedAvg of the clients' states weighted by their sample counts, then the
method's server step). The samplers, batch orders and seeds are supervised federate's
(:mod:`federated.rounds`, :mod:`federated.local`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn
from tqdm import tqdm

from ..aggregate import State, weighted_average
from ..experiment import FederateConfig
from ..local import epoch_batches
from ..rounds import client_noise_for
from ..seeding import client_generators, round_rng, sample_clients, seed_of
from .base import ClientRun, ClientUpdate, FederatedSSL
from .config import SelfPretrainConfig

# A dispatcher trains round ``rnd``'s ``selected`` clients (of the partition's client ``sizes``) from the
# global state and returns their updates in the order of ``selected`` and notes for the metrics line: in
# this process (:class:`InProcess`) or through Flower messages (federated.flower.selfsup), which may leave
# out clients that did not reply (--min-replies) and say why in the notes.
Dispatch = Callable[[int, list[int], State, list[int]], tuple[list[ClientUpdate], dict]]


def select_clients(sizes: list[int], seed: int, rnd: int, participation: float) -> list[int]:
    """The clients of round ``rnd``: supervised federate's uniform draw (FedAvg.select) from (seed, rnd)."""
    return sample_clients(round_rng(seed, rnd), len(sizes), participation)


def client_run(fed: FederateConfig, sp: SelfPretrainConfig, rnd: int, client: int, images: Tensor,
               size: int) -> ClientRun:
    """Client ``client``'s round ``rnd`` on its ``images`` (uint8 (n, S, S, 3), on the training device): all
    its local epochs' batches and generators, derived from (seed, rnd, client) only."""
    order_gen, aug_gen = client_generators(fed.seed, rnd, client, images.device)
    pools = [torch.arange(len(images))] * sp.local_epochs
    batches = epoch_batches(pools, sp.batch_size, order_gen)
    gen = torch.Generator().manual_seed(seed_of(fed.seed, rnd, client, 3))
    return ClientRun(rnd, client, images, batches, aug_gen, gen, sp.lr, sp.momentum, sp.weight_decay, size,
                     client_noise_for(fed, client))


def train_client(method: FederatedSSL, local: nn.Module, global_state: State, run: ClientRun) -> ClientUpdate:
    """The client's work from the global state, in ``local`` (overwritten); returns what it sends back."""
    local.load_state_dict(global_state)
    extra, stats = method.client_round(local, run)
    state = {k: v.detach().clone() for k, v in local.state_dict().items()}
    return ClientUpdate(run.client, state, len(run.images), extra, stats)


def aggregate(method: FederatedSSL, updates: list[ClientUpdate]) -> tuple[State, dict[str, float]]:
    """The new global state: the sample-weighted average of every state entry (parameters, BatchNorm
    statistics, the target network), then the method's server step; and the server's statistics."""
    average = weighted_average([u.state for u in updates], [u.n_samples for u in updates])
    return method.server_update(average, updates)


def round_stats(updates: list[ClientUpdate]) -> dict[str, float]:
    """The mean over the round's clients of each client statistic (loss, ...)."""
    keys = sorted({k for u in updates for k in u.stats})
    return {k: float(np.mean([u.stats[k] for u in updates if k in u.stats])) for k in keys}


class InProcess:
    """The in-process engine: every client of the round trains in this process, one after another."""

    def __init__(self, method: FederatedSSL, model: nn.Module, fed: FederateConfig, sp: SelfPretrainConfig,
                 images: Tensor, parts: list[Tensor], size: int, bar: tqdm | None = None):
        self.method, self.fed, self.sp, self.size, self.bar = method, fed, sp, size, bar
        self.local = copy.deepcopy(model)
        self.images, self.parts = images, parts

    def __call__(self, rnd: int, selected: list[int], global_state: State,
                 sizes: list[int]) -> tuple[list[ClientUpdate], dict]:
        updates = []
        for i, client in enumerate(selected):
            run = client_run(self.fed, self.sp, rnd, client, self.images[self.parts[client]], self.size)
            updates.append(train_client(self.method, self.local, global_state, run))
            if self.bar is not None:
                self.bar.set_postfix_str(f"client {i + 1}/{len(selected)}")
        return updates, {}
