"""#C = k label shards: each client holds k distinct labels (NIID-Bench, Li et al. ICDE 2022, label skew)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fpsfl.base.settings import setting

from .base import PARTITIONS, Partition, PartitionError, PartitionSettings
from .common import _by_class, _even, _parts


@dataclass(frozen=True)
class ShardsConfig(PartitionSettings):
    labels_per_client: int = setting(2, "distinct labels each client holds, #C = k (NIID-Bench label skew "
                                     "uses 1, 2, 3)", within="[1, inf)", group="partition")


@PARTITIONS.register
class Shards(Partition):
    """#C = k: each client holds k distinct labels; a label's samples are split evenly among its holders.

    NIID-Bench label skew (#C = k). Labels are dealt least-used-first with random tie-breaking, so every
    present label is held by someone (``clients * k >= classes`` is required) and label use differs by at
    most one between labels; NIID-Bench's code instead gives client i label ``i mod C`` plus k - 1 random
    others, which drops labels when clients < classes.
    """

    name = "shards"
    Config = ShardsConfig
    hint = "use a larger labels_per_client, fewer clients or a smaller min_size"

    def split(self, labels: np.ndarray, clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        groups = _by_class(labels)
        c, k = len(groups), self.cfg.labels_per_client
        if k > c:
            raise PartitionError(f"labels_per_client={k} but the data has only {c} classes")
        if clients * k < c:
            raise PartitionError(f"{clients} clients x {k} labels cannot cover {c} classes; "
                                 f"use more clients or a larger labels_per_client")
        held = np.zeros((clients, c), bool)  # (clients, classes)
        for client in range(clients):
            pick = np.lexsort((rng.random(c), held.sum(0)))[:k]  # fewest holders first, ties at random
            held[client, pick] = True
        owner = np.empty(len(labels), np.int64)
        for label, idx in enumerate(groups):
            holders = np.flatnonzero(held[:, label])
            owner[rng.permutation(idx)] = np.repeat(holders, _even(len(idx), len(holders)))
        return _parts(owner, clients)
