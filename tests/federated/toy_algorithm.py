"""A new algorithm as a user writes it: one file, one hook. FedAvg whose clients add an L2 pull towards
zero, (lam / 2) sum ||w||^2, to their loss. ``functional_loss`` is the only hook: the one-client loop and
``--client-batch`` both run it (tests/federated/test_plugins.py)."""

from __future__ import annotations

from dataclasses import dataclass

from federated.algorithms import AlgoConfig, FedAvg
from fpsfl.base.settings import setting


@dataclass(frozen=True)
class ShrinkConfig(AlgoConfig):
    lam: float = setting(0.5, "weight of the L2 pull towards zero", within="[0, inf)")


class Shrink(FedAvg):
    name = "shrink"
    Config = ShrinkConfig

    def functional_loss(self, fm, params, buffers, x, y, client, shared):
        loss = super().functional_loss(fm, params, buffers, x, y, client, shared)
        return loss + 0.5 * self.cfg.lam * sum((p ** 2).sum() for p in params.values())
