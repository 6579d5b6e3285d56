"""Aggregation math of the FedAvg family as pure functions on state dicts (no models, no I/O).

McMahan et al. 2017 (FedAvg), Hsu et al. 2019 (FedAvgM), Wang et al. 2020 (FedNova), Acar et al. 2021
(FedDyn), Karimireddy et al. 2020 (SCAFFOLD); as used by Chen et al., ICLR 2023, §4.3.

A state is ``{name: tensor}``. The one rule of every server update: server-side transforms (momentum,
FedNova's normalisation, control variates, FedDyn's h) act on the trainable *parameters* only, and the
*buffers* (BatchNorm running statistics) are the sample-weighted average of the clients'. Extrapolating a
running variance can make it negative, and the model then returns NaN. :func:`split_state` is the one place
that tells the two apart; :meth:`federated.algorithms.base.FedAvg.aggregate` applies it for every algorithm.
Integer tensors (BatchNorm's ``num_batches_tracked``) are averaged in float and rounded back, so every
function returns a state with the dtypes it was given.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch
from torch import Tensor

State = dict[str, Tensor]


def split_state(state: State, params: Collection[str]) -> tuple[State, State]:
    """(parameters, buffers) of ``state``: the entries named in ``params``, and all the others."""
    return ({k: v for k, v in state.items() if k in params},
            {k: v for k, v in state.items() if k not in params})


def cast_like(value: Tensor, like: Tensor) -> Tensor:
    """An averaged entry back in ``like``'s dtype: integer buffers are rounded (the one buffer rule)."""
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
        out[key] = cast_like(acc, ref)
    return out


def nova_norm(steps: int, momentum: float) -> float:
    """FedNova's a_i for SGD with momentum rho after tau local steps (Wang et al. 2020, §4 / Eq. 9):
    a = (tau - rho (1 - rho^tau) / (1 - rho)) / (1 - rho); a = tau without momentum."""
    if momentum == 0:
        return float(steps)
    rho = momentum
    return (steps - rho * (1 - rho ** steps) / (1 - rho)) / (1 - rho)


def fednova(global_params: State, params: Sequence[State], weights: Sequence[float], steps: Sequence[int],
            momentum: float) -> State:
    """w <- w - tau_eff * sum_i p_i (w - w_i) / a_i, tau_eff = sum_i p_i a_i (Wang et al. 2020, Eq. 6).

    On parameters only (see the module docstring). With equal steps it is exactly FedAvg.
    """
    p = normalise(weights)
    a = [nova_norm(t, momentum) for t in steps]
    tau_eff = sum(pi * ai for pi, ai in zip(p, a, strict=True))
    # a client of no steps did not move: its normalised update (w - w_i) / a_i is 0, not 0 / 0
    moved = [(pi, ai, s) for pi, ai, s in zip(p, a, params, strict=True) if ai > 0]
    out = {}
    for key, ref in global_params.items():
        direction = sum((pi / ai * (ref - s[key]) for pi, ai, s in moved), torch.zeros_like(ref))
        out[key] = ref - tau_eff * direction
    return out


def server_momentum(global_params: State, average: State, velocity: State | None, beta: float, lr: float,
                    nesterov: bool) -> tuple[State, State]:
    """FedAvgM (Hsu et al. 2019): delta = w - avg; v <- beta v + delta; w <- w - lr v
    (Nesterov, as torch.optim.SGD: w <- w - lr (delta + beta v)).

    On parameters only (see the module docstring). Returns (new parameters, new velocity).
    """
    out, new_velocity = {}, {}
    for key, w in global_params.items():
        delta = w - average[key]
        v = delta if velocity is None else beta * velocity[key] + delta
        new_velocity[key] = v
        out[key] = w - lr * (delta + beta * v if nesterov else v)
    return out, new_velocity
