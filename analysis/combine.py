"""Convex combinations of client models, as pure functions on state dicts (Chen et al., ICLR 2023, §6.2).

A combination sum_m lambda_m theta_m is taken over *every* floating-point entry of the state, BatchNorm
running statistics included, with the same weights: exactly what FedAvg does with data-size weights (see
:func:`federated.aggregate.weighted_average`). Integer entries (``num_batches_tracked``) are copied from the
first model. The differentiable form (:func:`combine_stacked`) lets the convex search of Eq. 4 take
gradients with respect to lambda.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

State = dict[str, Tensor]


def stack_states(states: Sequence[State]) -> State:
    """{name: (M, ...) tensor} of the M states' floating entries (integer entries: the first model's)."""
    out = {}
    for key, ref in states[0].items():
        out[key] = torch.stack([s[key] for s in states]) if ref.is_floating_point() else ref
    return out


def combine_stacked(stacked: State, lam: Tensor) -> State:
    """sum_m lam_m stacked[k][m] for each floating entry; differentiable in ``lam`` (shape (M,))."""
    out = {}
    for key, value in stacked.items():
        if value.is_floating_point():
            out[key] = torch.tensordot(lam.to(value.dtype), value, dims=1)
        else:
            out[key] = value
    return out


def combine(states: Sequence[State] | State, lam: Sequence[float] | np.ndarray | Tensor) -> State:
    """The convex combination sum_m lam_m theta_m (lam is normalised to sum to 1) of a list of states, or
    of states already stacked by :func:`stack_states` (faster when combining the same models often)."""
    stacked = states if isinstance(states, dict) else stack_states(states)
    m = next(v for v in stacked.values() if v.is_floating_point()).shape[0]
    lam = torch.as_tensor(np.asarray(lam, dtype=np.float64))
    if lam.ndim != 1 or len(lam) != m or (lam < 0).any() or lam.sum() <= 0:
        raise ValueError(f"need {m} non-negative weights with a positive sum, got {lam.tolist()}")
    with torch.no_grad():
        return combine_stacked(stacked, lam / lam.sum())


def sample_simplex(n: int, m: int, rng: np.random.Generator, concentration: float = 1.0) -> np.ndarray:
    """``n`` points of the M-simplex drawn from Dirichlet(concentration * 1), shape (n, m)."""
    return rng.dirichlet(np.full(m, concentration), size=n)


def loss_summary(losses: Sequence[float]) -> dict[str, float]:
    """Mean, 95% interval (2.5 and 97.5 percentiles) and variance of sampled losses (Fig. 8)."""
    values = np.asarray(losses, dtype=np.float64)
    lo, hi = np.percentile(values, [2.5, 97.5])
    return {"mean": float(values.mean()), "p2_5": float(lo), "p97_5": float(hi), "var": float(values.var())}
