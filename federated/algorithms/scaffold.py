"""SCAFFOLD (Karimireddy et al. 2020) with option II control variates.

Local steps use the corrected gradient g - c_i + c. After K local steps with learning rate lr the client
sets c_i+ = c_i - c + (w_global - w_i) / (a lr) and sends delta c_i = c_i+ - c_i; the server adds
(|S| / N) * mean(delta c_i) to c. Chen et al., ICLR 2023, §4.3 / Table 9.

The paper's local optimiser is SGD with momentum rho = 0.9, under which K steps move the model by about
a = K / (1 - rho) gradients, not K. Dividing by K (plain SGD's count) would make c_i ten times the mean
gradient; fed back through the momentum, the correction then grows every round until training collapses
(it did: 10% accuracy on digits). So a is FedNova's momentum-aware step count (Wang et al. 2020), which
equals K without momentum, and c_i+ is again the mean local gradient.
"""

from __future__ import annotations

import torch
from torch import nn

from ..aggregate import State, nova_norm
from .base import ClientContext, ClientResult, FedAvg


def _zeros_like(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(p) for k, p in model.named_parameters()}


class Scaffold(FedAvg):
    name = "scaffold"

    def before_step(self, ctx: ClientContext, model: nn.Module) -> None:
        if "c" not in self.server:
            self.server["c"] = _zeros_like(model)
        if "c" not in ctx.state:
            ctx.state["c"] = _zeros_like(model)
        c, ci = self.server["c"], ctx.state["c"]
        for name, p in model.named_parameters():
            if p.grad is not None:
                p.grad.add_(c[name].to(p.device) - ci[name].to(p.device))

    @torch.no_grad()
    def finish_client(self, ctx: ClientContext, model: nn.Module) -> dict:
        if ctx.steps == 0:
            return {"delta_c": {}}
        c, ci = self.server["c"], ctx.state["c"]
        glob = dict(ctx.global_model.named_parameters())
        scale = 1.0 / (nova_norm(ctx.steps, ctx.momentum) * ctx.lr)
        delta = {}
        for name, p in model.named_parameters():
            new = ci[name] - c[name] + (glob[name] - p) * scale
            delta[name] = new - ci[name]
            ci[name] = new
        return {"delta_c": delta}

    def aggregate(self, global_state: State, results: list[ClientResult]) -> State:
        new = super().aggregate(global_state, results)
        deltas = [r.extra["delta_c"] for r in results if r.extra["delta_c"]]
        if deltas:
            share = len(deltas) / len(self.sizes)  # |S| / N
            for name in self.server["c"]:
                mean = sum(d[name] for d in deltas) / len(deltas)
                self.server["c"][name] = self.server["c"][name] + share * mean
        return new
