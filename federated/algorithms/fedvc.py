"""FedVC (Hsu et al. 2020, §5.3, Algorithm 1): virtual clients of a fixed size N_VC.

Clients are selected with probability proportional to their size (:func:`pps_systematic`: exactly
proportional inclusion, not numpy's sequential weighted draw), and "a random subset consisting of N_VC
examples is uniformly resampled from D_i for every round the client is selected" (§5.3): without
replacement when the client holds at least N_VC examples, with replacement when it holds fewer
(``replacement=auto``). N_VC is one number for the whole run (§6.3 fixes it; ``examples``, 0: the mean
client size). So every selected client trains on the same N_VC examples a round whatever its size; with E
local epochs (Chen et al.'s E = 5, §4.2) it makes E passes over its round's draw. A client of exactly N_VC
examples trains as in FedAvg. All virtual clients weigh the same in the average. The ΔL/ΔG analysis (Eq. 3)
still weighs clients by their real data sizes (the round loop records those).

``draw=epoch`` keeps this project's earlier reading, a fresh draw of N_VC examples every local epoch (E
draws a round); ``draw=round``, the paper's, is the default. No recipe of Chen et al. runs FedVC; the
Fig. 4 recipe's extra algorithms run it as Hsu et al. define it.
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


def inclusion_probabilities(sizes: np.ndarray, m: int) -> np.ndarray:
    """pi_i = m s_i / sum(s), the clients whose pi reaches 1 taken for sure and the rest rescaled over the
    remaining picks (so sum(pi) = m and no pi exceeds 1)."""
    pi, free, k = np.zeros(len(sizes)), np.ones(len(sizes), dtype=bool), m
    while k > 0:
        p = k * sizes[free] / sizes[free].sum()
        sure = np.flatnonzero(free)[p >= 1]
        if not len(sure):
            pi[free] = p
            break
        pi[sure], free[sure] = 1.0, False
        k -= len(sure)
    return pi


def pps_systematic(sizes: np.ndarray, m: int, rng: np.random.Generator) -> list[int]:
    """m distinct clients, client i included with probability exactly :func:`inclusion_probabilities`'s
    pi_i, proportional to its size (Hsu et al. 2020, §5.3): systematic sampling over a random order, one
    uniform start and m points a unit apart on the clients' cumulated pi. numpy's weighted choice without
    replacement draws one by one and is not proportional once a large share is picked (GEO-3K at 20%)."""
    pi = inclusion_probabilities(sizes, m)
    order = rng.permutation(len(sizes))
    cum = np.cumsum(pi[order])
    picks = np.searchsorted(cum, rng.random() + np.arange(m), side="right")
    return sorted(order[np.minimum(picks, len(sizes) - 1)].tolist())


@dataclass(frozen=True)
class FedVCConfig(AlgoConfig):
    examples: int = setting(0, "examples of each selected client a round (the virtual client's N_VC); 0: "
                               "the mean client size (the balanced setting)", within="[0, inf)")
    replacement: str = setting("auto", "draw with replacement: auto (only from a smaller client) | always | "
                                       "never", choices=("auto", "always", "never"))
    draw: str = setting("round", "when the virtual client is drawn: round (once per round the client is "
                                 "selected, Hsu et al. 2020 §5.3) | epoch (a fresh draw every local epoch)",
                        choices=("round", "epoch"))


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
        return pps_systematic(np.asarray(self.sizes, dtype=np.float64), m, rng)

    def epoch_pools(self, client: int, indices: Tensor, epochs: int,
                    rng: np.random.Generator) -> list[Tensor]:
        k, n = self.virtual_size(), len(indices)
        replace = self.cfg.replacement == "always" or (self.cfg.replacement == "auto" and n < k)
        if k == n and not replace:
            return [indices] * epochs  # nothing to draw: exactly FedAvg's data
        if not replace and k > n:
            raise ValueError(f"fedvc: client {client} has {n} < {k} examples and replacement=never")
        def draw() -> Tensor:
            return indices[torch.as_tensor(rng.choice(n, k, replace=replace), dtype=torch.long)]

        return [draw()] * epochs if self.cfg.draw == "round" else [draw() for _ in range(epochs)]

    def server_update(self, global_params: State, params: list[State], results: list[ClientResult]) -> State:
        return weighted_average(params, [1.0] * len(params))
