"""Natural clients: the dataset's own per-sample client ids (e.g. FEMNIST writers, iNat-Geo regions)."""

from __future__ import annotations

import numpy as np

from .base import PARTITIONS, Partition
from .common import _parts


@PARTITIONS.register
class Natural(Partition):
    """One part per distinct client id, in sorted id order; ``clients`` and ``rng`` are ignored.

    Receives the per-sample client ids (not the labels) from :func:`federated.partitions.partition`, and is
    never redrawn. Its clients are data, not a draw (a city with few images is still a city), so a run asks
    for min_size 1 by default rather than NIID-Bench's 10.
    """

    name = "natural"
    by_id = True
    default_min_size = 1

    def split(self, ids: np.ndarray, clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        unique, owner = np.unique(ids, return_inverse=True)
        return _parts(owner.reshape(-1), len(unique))
