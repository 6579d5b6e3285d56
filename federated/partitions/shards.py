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
    deal: str = setting("balanced", "how labels are dealt to clients: balanced (least-held first, ties at "
                                    "random: every label held, label use within one) | niid-bench (client i "
                                    "gets label i mod C plus k - 1 other distinct labels at random, "
                                    "NIID-Bench's code)", choices=("balanced", "niid-bench"),
                        group="partition")


@PARTITIONS.register
class Shards(Partition):
    """#C = k: each client holds k distinct labels; a label's samples are split evenly among its holders.

    NIID-Bench label skew (#C = k): "we first randomly assign k different label IDs to each party. Then, for
    the samples of each label, we randomly and equally divide them into the parties which own the label"
    (§III-A). ``deal=niid-bench`` is that assignment as NIID-Bench's code makes it: client i gets label
    ``i mod C`` and k - 1 other distinct labels uniformly at random; a label no client drew is an error here
    (the code drops its samples, and fpsfl assigns every sample exactly once). ``deal=balanced`` (the
    default) deals labels least-held-first with random tie-breaking instead, so every present label is held
    (``clients * k >= classes`` suffices) and label use differs by at most one between labels: with
    10 clients, k = 2 and 10 classes the NIID-Bench deal leaves some labels to one client and others to
    three. Chen et al. use no #C = k partition.
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
        held = self._deal(clients, c, k, rng)  # (clients, classes)
        owner = np.empty(len(labels), np.int64)
        for label, idx in enumerate(groups):
            holders = np.flatnonzero(held[:, label])
            owner[rng.permutation(idx)] = np.repeat(holders, _even(len(idx), len(holders)))
        return _parts(owner, clients)

    def _deal(self, clients: int, c: int, k: int, rng: np.random.Generator) -> np.ndarray:
        """(clients, classes) bool: which labels each client holds, k each."""
        held = np.zeros((clients, c), bool)
        for client in range(clients):
            if self.cfg.deal == "niid-bench":
                others = np.delete(np.arange(c), client % c)
                pick = np.concatenate([[client % c], rng.choice(others, k - 1, replace=False)])
            else:
                pick = np.lexsort((rng.random(c), held.sum(0)))[:k]  # fewest holders first, ties at random
            held[client, pick] = True
        orphans = np.flatnonzero(~held.any(0))
        if len(orphans):
            raise PartitionError(f"deal=niid-bench left {len(orphans)} of {c} labels to no client "
                                 f"(NIID-Bench's code drops their samples); use at least {c} clients or "
                                 f"deal=balanced")
        return held
