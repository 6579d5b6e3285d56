"""FedIR (Hsu et al. 2020, §3.1): importance reweighting of the local loss by class ratios.

A sample of class y on client i is weighted p(y) / q_i(y), with p the class distribution over all clients
and q_i the client's, so each client's expected loss matches the global one under label skew.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from ..task import Task
from .base import ClientContext, FedAvg


def importance_weights(global_counts: np.ndarray, client_counts: np.ndarray) -> np.ndarray:
    """p(y) / q_i(y) per class; 0 for classes the client does not hold (they never occur in its loss)."""
    p = global_counts / global_counts.sum()
    q = client_counts / max(client_counts.sum(), 1)
    return np.divide(p, q, out=np.zeros_like(p, dtype=np.float64), where=q > 0)


class FedIR(FedAvg):
    name = "fedir"
    requires = frozenset({"sample_labels"})  # one class per training sample

    def local_loss(self, ctx: ClientContext, model: nn.Module, task: Task, inputs: Tensor,
                   targets: Tensor) -> Tensor:
        if "ir_weights" not in ctx.state:
            w = importance_weights(self.class_counts.sum(0), self.class_counts[ctx.client])
            ctx.state["ir_weights"] = torch.as_tensor(w, dtype=torch.float32)
        weights = ctx.state["ir_weights"].to(inputs.device)[task.sample_labels(targets)]
        return (weights * task.loss(model(inputs), targets)).mean()
