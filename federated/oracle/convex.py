"""Optimal convex aggregation (Chen et al., ICLR 2023, §6.2, Eq. 4, Fig. 7; Appendix B.2).

Given a round's local models theta_m, search lambda on the simplex that maximises the accuracy of
sum_m lambda_m theta_m. lambda = softmax(w) is optimised by SGD on the loss of the combined model, from
several starts (uniform, FedAvg's data-size weights, and Dirichlet(1) draws); the best start by accuracy
wins. FedAvg's weights are evaluated as they are too, so the result is never below FedAvg. It is an oracle
analysis: the paper searches on the global test set, which no real federation has.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call

from .combine import State, combine, combine_stacked, sample_simplex, stack_states


@dataclass(frozen=True)
class ConvexConfig:
    lr: float = 1e-5  # SGD learning rate on w, lambda = softmax(w) (Appendix B.2)
    epochs: int = 20  # passes over the search data (Appendix B.2)
    batch_size: int = 32  # Appendix B.2
    random_starts: int = 2  # Dirichlet(1) starts besides uniform and FedAvg's weights
    seed: int = 0


@dataclass
class Candidate:
    start: str  # uniform | fedavg | dirichlet-K
    lam: list[float]
    acc: float
    loss: float


def _descend(model: nn.Module, stacked: State, lam0: np.ndarray, loss_fn: Callable[[Tensor, Tensor], Tensor],
             batches: Callable[[int], list[tuple[Tensor, Tensor]]], cfg: ConvexConfig) -> np.ndarray:
    """SGD on w (lambda = softmax(w), w0 = log lambda0) of the mean loss of the combined model."""
    device = next(iter(stacked.values())).device
    w = torch.tensor(np.log(np.maximum(lam0, 1e-12)), dtype=torch.float32, device=device, requires_grad=True)
    optimizer = torch.optim.SGD([w], lr=cfg.lr)
    model.eval()  # the combined BatchNorm statistics are part of the combination (module docstring)
    # they follow lambda but carry no gradient (batch_norm cannot differentiate its running statistics)
    buffers = {name for name, _ in model.named_buffers()}
    for epoch in range(cfg.epochs):
        for inputs, targets in batches(epoch):
            state = combine_stacked(stacked, torch.softmax(w, 0))
            state = {k: v.detach() if k in buffers else v for k, v in state.items()}
            loss = loss_fn(functional_call(model, state, (inputs,)), targets).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return torch.softmax(w.detach(), 0).double().cpu().numpy()


def optimal_convex(model: nn.Module, states: Sequence[State], sizes: Sequence[int],
                   evaluate: Callable[[State], dict], loss_fn: Callable[[Tensor, Tensor], Tensor],
                   batches: Callable[[int], list[tuple[Tensor, Tensor]]], cfg: ConvexConfig) -> dict:
    """Search lambda* and report it against FedAvg's weights.

    ``evaluate(state)`` gives {"acc", "loss"} of a state; ``batches(epoch)`` the search batches (model
    inputs, targets) of an epoch; ``loss_fn`` per-sample losses. Returns fedavg_acc/loss, convex_acc/loss,
    lambda (lambda*), fedavg_lambda and every start's candidate.
    """
    m = len(states)
    sizes = np.asarray(sizes, dtype=np.float64)
    starts = {"uniform": np.full(m, 1.0 / m), "fedavg": sizes / sizes.sum()}
    rng = np.random.default_rng(cfg.seed)
    for k in range(cfg.random_starts):
        starts[f"dirichlet-{k}"] = rng.dirichlet(np.ones(m))
    stacked = stack_states([{k: v.detach() for k, v in s.items()} for s in states])
    fedavg = evaluate(combine(stacked, starts["fedavg"]))
    candidates = [Candidate("fedavg-weights", starts["fedavg"].tolist(), fedavg["acc"], fedavg["loss"])]
    for name, lam0 in starts.items():
        lam = _descend(model, stacked, lam0, loss_fn, batches, cfg) if m > 1 else lam0
        metrics = evaluate(combine(stacked, lam))
        candidates.append(Candidate(name, lam.tolist(), metrics["acc"], metrics["loss"]))
    # best accuracy; ties go to the lower loss, then to the earlier candidate (FedAvg's weights first)
    best = min(range(len(candidates)), key=lambda i: (-candidates[i].acc, candidates[i].loss, i))
    win = candidates[best]
    return {"fedavg_acc": fedavg["acc"], "fedavg_loss": fedavg["loss"], "convex_acc": win.acc,
            "convex_loss": win.loss, "lambda": win.lam, "start": win.start,
            "fedavg_lambda": starts["fedavg"].tolist(), "candidates": [vars(c) for c in candidates]}


def loss_variance(states: Sequence[State], evaluate: Callable[[State], dict], n_samples: int,
                  rng: np.random.Generator) -> list[float]:
    """Test losses of ``n_samples`` combinations with lambda ~ Dirichlet(1) (§6.2, Fig. 8)."""
    lambdas = sample_simplex(n_samples, len(states), rng)
    stacked = stack_states(states)
    return [evaluate(combine(stacked, lam))["loss"] for lam in lambdas]
