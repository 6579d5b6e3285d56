"""FedDyn (Acar et al. 2021, Algorithm 1): dynamic regularisation that aligns local and global optima.

Local objective L_i(w) - <g_i, w> + alpha/2 ||w - w_global||^2; then g_i <- g_i - alpha (w_i - w_global).
The server keeps h <- h - alpha/N sum_{i in S} (w_i - w_global) and sets w = mean_S(w_i) - h / alpha (an
unweighted mean over the round's clients). Parameters only: BatchNorm statistics take the plain
sample-weighted average. Chen et al., ICLR 2023, §4.3 and Fig. 4 run it without stating its settings.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from fpsfl.base.settings import setting

from ..aggregate import State, weighted_average
from . import ALGORITHMS
from .base import AlgoConfig, ClientContext, ClientResult, FedAvg
from .fedprox import global_params, squared_distance


@dataclass(frozen=True)
class FedDynConfig(AlgoConfig):
    alpha: float = setting(0.01, "regularisation strength (Acar et al. 2021 use 0.01-0.1 on CIFAR)",
                           within="(0, inf)")


@ALGORITHMS.register
class FedDyn(FedAvg):
    name = "feddyn"
    Config = FedDynConfig

    def shared_tensors(self, ctx: ClientContext) -> dict:
        return {"global": global_params(ctx)}

    def client_tensors(self, ctx: ClientContext, model: nn.Module) -> dict:
        if "g" in ctx.state:
            return {"g": ctx.state["g"]}
        return {"g": {k: torch.zeros_like(p) for k, p in model.named_parameters()}}  # before its first round

    def functional_loss(self, fm, params, buffers, x, y, client, shared) -> Tensor:
        loss = super().functional_loss(fm, params, buffers, x, y, client, shared)
        loss = loss + 0.5 * self.cfg.alpha * squared_distance(params, shared["global"])
        return loss - sum((client["g"][k] * p).sum() for k, p in params.items())

    @torch.no_grad()
    def finish_client(self, ctx: ClientContext, model: nn.Module) -> dict:
        glob = dict(ctx.global_model.named_parameters())
        g = ctx.state.setdefault("g", {k: torch.zeros_like(p) for k, p in model.named_parameters()})
        for name, p in model.named_parameters():
            g[name] = g[name] - self.cfg.alpha * (p - glob[name])
        return {}

    def server_update(self, global_params: State, params: list[State], results: list[ClientResult]) -> State:
        n, alpha = len(self.sizes), self.cfg.alpha
        mean = weighted_average(params, [1.0] * len(params))
        h = self.server.setdefault("h", {k: torch.zeros_like(v) for k, v in global_params.items()})
        for k, w in global_params.items():
            h[k] = h[k] - alpha / n * sum(p[k] - w for p in params)
            mean[k] = mean[k] - h[k] / alpha
        return mean
