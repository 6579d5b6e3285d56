"""Where every random draw of a federated run comes from, so that any engine reproduces it.

A round's server draws (which clients, FedVC's pools) come from (seed, round); a client's batch order and
augmentation from (seed, round, client) alone, so a Flower ClientApp in another process computes exactly
what the in-process loop computes (supervised ``federate`` and ``federate self-pretrain`` alike). McMahan
et al. 2017, Algorithm 1: a uniform sample of max(C K, 1) clients a round.
"""

from __future__ import annotations

import numpy as np
import torch

from fpsfl.base.seeds import seed_of


def round_rng(seed: int, rnd: int) -> np.random.Generator:
    """The server's generator of round ``rnd`` (0-based)."""
    return np.random.default_rng(np.random.SeedSequence([seed, rnd, 0]))


def client_generators(seed: int, rnd: int, client: int,
                      device: torch.device) -> tuple[torch.Generator, torch.Generator]:
    """(batch order on the CPU, augmentation on ``device``) of ``client`` in round ``rnd``."""
    order = torch.Generator().manual_seed(seed_of(seed, rnd, client, 1))
    aug = torch.Generator(device=device).manual_seed(seed_of(seed, rnd, client, 2))
    return order, aug


def sample_clients(rng: np.random.Generator, n: int, fraction: float) -> list[int]:
    """A uniform sample of round(fraction * n) of ``n`` clients (at least 1), sorted."""
    m = max(1, round(fraction * n))
    return sorted(range(n)) if m >= n else sorted(rng.choice(n, m, replace=False).tolist())
