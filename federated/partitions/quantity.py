"""Quantity skew: client sizes ~ Dir(beta), labels spread at random (NIID-Bench, Li et al. ICDE 2022)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fpsfl.base.settings import setting

from .base import PARTITIONS, Partition, PartitionSettings
from .common import _parts, _proportional


@dataclass(frozen=True)
class QuantityConfig(PartitionSettings):
    beta: float = setting(0.5, "Dirichlet concentration of the client sizes; smaller is more unequal "
                          "(NIID-Bench quantity skew, beta = 0.5)", within="(0, inf)", group="partition")


@PARTITIONS.register
class Quantity(Partition):
    """Quantity skew: a random permutation cut at Dir(beta) proportions (NIID-Bench, quantity skew)."""

    name = "quantity"
    Config = QuantityConfig
    hint = "use a larger beta, fewer clients or a smaller min_size"

    def split(self, labels: np.ndarray, clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        sizes = _proportional(rng.dirichlet(np.full(clients, self.cfg.beta)), len(labels))
        owner = np.empty(len(labels), np.int64)
        owner[rng.permutation(len(labels))] = np.repeat(np.arange(clients), sizes)
        return _parts(owner, clients)
