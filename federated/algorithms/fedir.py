"""FedIR (Hsu et al. 2020, §3.1): importance reweighting of the local loss by class ratios.

A sample of class y on client i is weighted w = p(y) / q_i(y), with p the class distribution over all
clients and q_i the client's, so each client's expected loss matches the global one under label skew. The
mini-batch loss is self-normalised, sum_j w_j l_j / sum_j w_j, as Hsu et al. use it: a plain mean of w_j l_j
would scale the step size with the client's skew (0.2x with two labels per client, ~50x for a rare class).

Declared: p(y) is the pooled class distribution of all clients' training data (the server knows each
client's class counts), not a target distribution set on the server; the two coincide when the test set
follows the pooled training distribution, as in CIFAR and Tiny-ImageNet.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from . import ALGORITHMS
from .base import ClientContext, FedAvg


def importance_weights(global_counts: np.ndarray, client_counts: np.ndarray) -> np.ndarray:
    """p(y) / q_i(y) per class; 0 for classes the client does not hold (they never occur in its loss)."""
    p = global_counts / global_counts.sum()
    q = client_counts / max(client_counts.sum(), 1)
    return np.divide(p, q, out=np.zeros_like(p, dtype=np.float64), where=q > 0)


def self_normalised(weights: Tensor, losses: Tensor) -> Tensor:
    """sum_j w_j l_j / sum_j w_j: the importance-weighted mean of per-sample losses."""
    return (weights * losses).sum() / weights.sum().clamp_min(torch.finfo(weights.dtype).tiny)


@ALGORITHMS.register
class FedIR(FedAvg):
    name = "fedir"
    requires = frozenset({"sample_labels"})  # one class per training sample

    def client_tensors(self, ctx: ClientContext, model: nn.Module) -> dict:
        if "ir_weights" not in ctx.state:
            w = importance_weights(self.class_counts.sum(0), self.class_counts[ctx.client])
            ctx.state["ir_weights"] = torch.as_tensor(w, dtype=torch.float64)
        return {"weights": ctx.state["ir_weights"]}

    def functional_loss(self, fm, params, buffers, x, y, client, shared) -> Tensor:
        losses = fm.task.loss(fm(params, buffers, x), y)
        return self_normalised(client["weights"].to(losses.dtype)[fm.task.sample_labels(y)], losses)
