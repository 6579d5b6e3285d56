"""Aggregation math of the FedAvg family as pure functions on state dicts (no models, no I/O).

McMahan et al. 2017 (FedAvg), Hsu et al. 2019 (FedAvgM), Wang et al. 2020 (FedNova), Acar et al. 2021
(FedDyn), Karimireddy et al. 2020 (SCAFFOLD); as used by Chen et al., ICLR 2023, §4.3.

A state is ``{name: tensor}``. Integer tensors (BatchNorm's ``num_batches_tracked``) are averaged in float
and rounded back, so every function returns a state with the dtypes it was given.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

State = dict[str, Tensor]


def _cast(value: Tensor, like: Tensor) -> Tensor:
    return value.round().to(like.dtype) if not like.is_floating_point() else value.to(like.dtype)


def normalise(weights: Sequence[float]) -> list[float]:
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("aggregation weights must sum to a positive number")
    return [float(w) / total for w in weights]


def weighted_average(states: Sequence[State], weights: Sequence[float]) -> State:
    """sum_i p_i * state_i with p = weights / sum(weights) (FedAvg: weights are client sample counts)."""
    p = normalise(weights)
    out = {}
    for key, ref in states[0].items():
        acc = torch.zeros_like(ref, dtype=torch.float64 if ref.dtype == torch.float64 else torch.float32)
        for pi, state in zip(p, states, strict=True):
            acc.add_(state[key].to(acc.dtype), alpha=pi)
        out[key] = _cast(acc, ref)
    return out


def difference(a: State, b: State) -> State:
    """a - b over the floating-point entries."""
    return {k: a[k] - b[k] for k in a if a[k].is_floating_point()}


def nova_norm(steps: int, momentum: float) -> float:
    """FedNova's a_i for SGD with momentum rho after tau local steps (Wang et al. 2020, §4 / Eq. 9):
    a = (tau - rho (1 - rho^tau) / (1 - rho)) / (1 - rho); a = tau without momentum."""
    if momentum == 0:
        return float(steps)
    rho = momentum
    return (steps - rho * (1 - rho ** steps) / (1 - rho)) / (1 - rho)


def fednova(global_state: State, states: Sequence[State], weights: Sequence[float], steps: Sequence[int],
            momentum: float) -> State:
    """w <- w - tau_eff * sum_i p_i (w - w_i) / a_i, tau_eff = sum_i p_i a_i (Wang et al. 2020, Eq. 6).

    Buffers (BatchNorm statistics) are averaged as FedAvg does. With equal steps it is exactly FedAvg.
    """
    p = normalise(weights)
    a = [nova_norm(t, momentum) for t in steps]
    tau_eff = sum(pi * ai for pi, ai in zip(p, a, strict=True))
    out = weighted_average(states, weights)
    for key, ref in global_state.items():
        if not ref.is_floating_point():
            continue
        direction = sum(pi / ai * (ref - s[key]) for pi, ai, s in zip(p, a, states, strict=True))
        out[key] = ref - tau_eff * direction
    return out


def server_momentum(global_state: State, average: State, velocity: State | None, beta: float, lr: float,
                    nesterov: bool) -> tuple[State, State]:
    """FedAvgM (Hsu et al. 2019): delta = w - avg; v <- beta v + delta; w <- w - lr v
    (Nesterov: w <- w - lr (delta + beta v)).

    Returns (new global state, new velocity). Buffers take the plain average.
    """
    delta = difference(global_state, average)
    velocity = {k: (beta * velocity[k] if velocity else 0) + d for k, d in delta.items()}
    out = dict(average)
    for key, v in velocity.items():
        step = delta[key] + beta * v if nesterov else v
        out[key] = global_state[key] - lr * step
    return out, velocity
