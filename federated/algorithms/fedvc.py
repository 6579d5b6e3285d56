"""FedVC (Hsu et al. 2020, §3.2): virtual clients of a fixed size.

Clients are selected with probability proportional to their size, and every selected client trains on the
same number of examples k per local epoch, so that a round processes E * k examples on every client
whatever its size. Each local epoch is a fresh draw of k of the client's examples: without replacement
when it holds at least k, with replacement when it holds fewer (``replacement=auto``). A client of exactly
k examples therefore trains as in FedAvg. All virtual clients weigh the same in the average. The ΔL/ΔG
analysis (Eq. 3) still weighs clients by their real data sizes (the round loop records those).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fpsfl.base.settings import setting

from ..aggregate import State, weighted_average
from . import ALGORITHMS
from .base import AlgoConfig, ClientResult, FedAvg


@dataclass(frozen=True)
class FedVCConfig(AlgoConfig):
    examples: int = setting(0, "examples per client per local epoch; 0: the mean client size (the balanced "
                               "setting)", within="[0, inf)")
    replacement: str = setting("auto", "draw with replacement: auto (only from a smaller client) | always | "
                                       "never", choices=("auto", "always", "never"))


@ALGORITHMS.register
class FedVC(FedAvg):
    name = "fedvc"
    Config = FedVCConfig

    def virtual_size(self) -> int:
        return self.cfg.examples or round(float(np.mean(self.sizes)))

    def select(self, rng: np.random.Generator, fraction: float) -> list[int]:
        n = len(self.sizes)
        m = max(1, round(fraction * n))
        if m >= n:
            return list(range(n))
        p = np.asarray(self.sizes, dtype=np.float64) / sum(self.sizes)
        return sorted(rng.choice(n, m, replace=False, p=p).tolist())

    def epoch_pools(self, client: int, indices: Tensor, epochs: int,
                    rng: np.random.Generator) -> list[Tensor]:
        k, n = self.virtual_size(), len(indices)
        replace = self.cfg.replacement == "always" or (self.cfg.replacement == "auto" and n < k)
        if k == n and not replace:
            return [indices] * epochs  # nothing to draw: exactly FedAvg's data
        if not replace and k > n:
            raise ValueError(f"fedvc: client {client} has {n} < {k} examples and replacement=never")
        return [indices[torch.as_tensor(rng.choice(n, k, replace=replace), dtype=torch.long)]
                for _ in range(epochs)]

    def server_update(self, global_params: State, params: list[State], results: list[ClientResult]) -> State:
        return weighted_average(params, [1.0] * len(params))
