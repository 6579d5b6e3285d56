"""Seeds mixed from tuples of integers: every random stream of a run (pre-training's epochs, a federated
round's server and clients) is seeded from (run seed, where, what), so that streams never overlap and any
process can rebuild any one of them alone."""

from __future__ import annotations

import numpy as np


def seed_of(*parts: int) -> int:
    """A 63-bit seed mixed from ``parts`` (numpy's SeedSequence: nearby tuples give unrelated seeds)."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1, np.uint64)[0] >> 1)
