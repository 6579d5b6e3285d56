"""FedProx (Li et al. 2020): a proximal term mu/2 ||w - w_global||^2 in the local loss.

Chen et al., ICLR 2023, §4.3 and Fig. 4 run it without stating mu; mu = 0.01 is from NIID-Bench's grid
{0.001, 0.01, 0.1, 1} (Li et al. 2022).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from fpsfl.base.settings import setting

from . import ALGORITHMS
from .base import AlgoConfig, ClientContext, FedAvg


@dataclass(frozen=True)
class FedProxConfig(AlgoConfig):
    mu: float = setting(0.01, "proximal weight (NIID-Bench tunes mu in {0.001, 0.01, 0.1, 1})",
                        within="[0, inf)")


def global_params(ctx: ClientContext) -> dict[str, Tensor]:
    """The round's global parameters by name (detached)."""
    return {k: p.detach() for k, p in ctx.global_model.named_parameters()}


def squared_distance(params: dict[str, Tensor], reference: dict[str, Tensor]) -> Tensor:
    """sum over parameters of ||w - w_ref||^2 (``reference`` detached: it carries no gradient)."""
    return sum(((p - reference[k]) ** 2).sum() for k, p in params.items())


@ALGORITHMS.register
class FedProx(FedAvg):
    name = "fedprox"
    Config = FedProxConfig

    def shared_tensors(self, ctx: ClientContext) -> dict:
        return {"global": global_params(ctx)}

    def functional_loss(self, fm, params, buffers, x, y, client, shared) -> Tensor:
        loss = super().functional_loss(fm, params, buffers, x, y, client, shared)
        return loss + 0.5 * self.cfg.mu * squared_distance(params, shared["global"])
