"""The centralised baseline: plain SGD on the union of the clients' data (the CL of ΔCL-FL, Chen et al.,
ICLR 2023, §4.2 and Table 1's CL rows).

One "round" is ``local_epochs`` epochs over the pooled data with one optimiser for the whole run (its state
is saved with the round state) and the federated runs' learning-rate schedule, so a CL run and an FL run of
the same flags see the same number of epochs and the same schedule. The algorithm's client and server
steps do not apply: the model trains with plain FedAvg's (no-op) hooks.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from .algorithms import ALGORITHMS, ClientContext, FedAvg
from .experiment import FederateConfig
from .local import epoch_batches, local_train, make_optimizer
from .rounds import local_momentum, lr_at, precision, test_metrics
from .seeding import client_generators
from .setup import Setup


class Centralised:
    """The round loop's work for ``federate --centralized`` (see :class:`federated.rounds.Federated`)."""

    desc = "centralised"

    def __init__(self, s: Setup, cfg: FederateConfig, device: torch.device):
        self.s, self.cfg, self.device = s, cfg, device
        self.optimizer = make_optimizer(s.model, cfg.resolved_optimizer(), cfg.resolved_lr(), cfg.momentum,
                                        cfg.weight_decay)

    def notes(self, engine: str) -> list[str]:
        if ALGORITHMS[self.cfg.algo] is FedAvg:
            return []
        return [f"--centralized trains plain SGD on the pooled data; {self.cfg.algo}'s client and server "
                f"steps do not apply to it"]

    def round(self, rnd: int, bar: tqdm | None) -> dict:
        """Round ``rnd`` (0-based): the epochs, then the test metrics."""
        s, cfg = self.s, self.cfg
        lr = lr_at(cfg, rnd)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        pool = torch.cat(s.parts)
        ctx = ClientContext(-1, s.model, lr, local_momentum(cfg), {})
        order_gen, aug_gen = client_generators(cfg.seed, rnd, 0, self.device)
        batches = epoch_batches([pool] * cfg.local_epochs, cfg.resolved_batch(), order_gen)
        with precision(s):
            loss = local_train(s.model, self.optimizer, s.algo, ctx, s.task, s.data.train_x, s.data.train_y,
                               batches, aug_gen)
        return {"round": rnd + 1, "lr": lr, **test_metrics(s), "train_loss": loss}

    def extra_state(self) -> dict:
        return {"optimizer": self.optimizer.state_dict()}

    def load_extra_state(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
