"""IID: every client gets a uniformly random, near-equal share (the homogeneous baseline of NIID-Bench)."""

from __future__ import annotations

import numpy as np

from .base import PARTITIONS, Partition
from .common import _even, _parts


@PARTITIONS.register
class IID(Partition):
    """A random permutation cut into ``clients`` parts whose sizes differ by at most one."""

    name = "iid"

    def split(self, labels: np.ndarray, clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        owner = np.empty(len(labels), np.int64)
        owner[rng.permutation(len(labels))] = np.repeat(np.arange(clients), _even(len(labels), clients))
        return _parts(owner, clients)
