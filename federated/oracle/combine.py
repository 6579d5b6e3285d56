"""Convex combinations of client models, as pure functions on state dicts (Chen et al., ICLR 2023, §6.2).

A combination sum_m lambda_m theta_m follows the one rule of :func:`federated.aggregate.weighted_average`,
FedAvg's with data-size weights: every floating-point entry, BatchNorm running statistics included, takes the
weighted average, and integer entries (``num_batches_tracked``) the rounded weighted average. A list of
states is combined by that helper itself; states stacked once by :func:`stack_states` (faster when the same
models are combined hundreds of times) by :func:`combine_stacked`, whose float entries are differentiable in
lambda, so the convex search of Eq. 4 can take gradients.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ..aggregate import State, cast_like, weighted_average


def stack_states(states: Sequence[State]) -> State:
    """{name: (M, ...) tensor} of the M states' entries."""
    return {key: torch.stack([s[key] for s in states]) for key in states[0]}


def combine_stacked(stacked: State, lam: Tensor) -> State:
    """sum_m lam_m stacked[k][m] for each entry; differentiable in ``lam`` (shape (M,), summing to 1) for
    the floating-point entries, rounded for the integer ones."""
    out = {}
    for key, value in stacked.items():
        if value.is_floating_point():
            out[key] = torch.tensordot(lam.to(value.dtype), value, dims=1)
        else:
            mean = torch.tensordot(lam.detach().double(), value.double(), dims=1)
            out[key] = cast_like(mean, value)
    return out


def _weights(lam, m: int) -> Tensor:
    lam = torch.as_tensor(np.asarray(lam, dtype=np.float64))
    if lam.ndim != 1 or len(lam) != m or (lam < 0).any() or lam.sum() <= 0:
        raise ValueError(f"need {m} non-negative weights with a positive sum, got {lam.tolist()}")
    return lam / lam.sum()


def combine(states: Sequence[State] | State, lam: Sequence[float] | np.ndarray | Tensor) -> State:
    """The convex combination sum_m lam_m theta_m (lam is normalised to sum to 1) of a list of states, or
    of states already stacked by :func:`stack_states`."""
    if not isinstance(states, dict):
        return weighted_average(states, _weights(lam, len(states)).tolist())
    m = next(iter(states.values())).shape[0]
    with torch.no_grad():
        return combine_stacked(states, _weights(lam, m))


def sample_simplex(n: int, m: int, rng: np.random.Generator, concentration: float = 1.0) -> np.ndarray:
    """``n`` points of the M-simplex drawn from Dirichlet(concentration * 1), shape (n, m)."""
    return rng.dirichlet(np.full(m, concentration), size=n)


def loss_summary(losses: Sequence[float]) -> dict[str, float]:
    """Mean, 95% interval (2.5 and 97.5 percentiles) and variance of sampled losses (Fig. 8)."""
    values = np.asarray(losses, dtype=np.float64)
    lo, hi = np.percentile(values, [2.5, 97.5])
    return {"mean": float(values.mean()), "p2_5": float(lo), "p97_5": float(hi), "var": float(values.var())}
