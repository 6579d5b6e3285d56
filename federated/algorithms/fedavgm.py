"""FedAvgM (Hsu et al. 2019, §3): server momentum on the averaged update.

delta = w - avg(w_i); v <- beta v + delta; w <- w - server_lr * v, or in the Nesterov form
w <- w - server_lr * (delta + beta v). Hsu et al. "use Nesterov accelerated gradient" with a server learning
rate held at 1.0 (§4.2), so ``nesterov=true`` is the default; ``nesterov=false`` is the heavy-ball form they
write in the equation. Parameters only: BatchNorm statistics take the plain sample-weighted average
(:meth:`FedAvg.aggregate`). No recipe of Chen et al. runs FedAvgM; the Fig. 4 recipe's extra algorithms
run it as Hsu et al. did.
"""

from __future__ import annotations

from dataclasses import dataclass

from fpsfl.base.settings import setting

from ..aggregate import State, server_momentum
from . import ALGORITHMS
from .base import AlgoConfig, ClientResult, FedAvg


@dataclass(frozen=True)
class FedAvgMConfig(AlgoConfig):
    beta: float = setting(0.9, "server momentum (Hsu et al. 2019 sweep; 0.9 is their common choice)",
                          within="[0, 1)")
    server_lr: float = setting(1.0, "server learning rate (Hsu et al. 2019: effective lr = server_lr / "
                                    "(1 - beta))", within="(0, inf)")
    nesterov: bool = setting(True, "Nesterov form of the server momentum, as torch.optim.SGD (Hsu et al. "
                                   "2019, §4.2: Nesterov accelerated gradient)")


@ALGORITHMS.register
class FedAvgM(FedAvg):
    name = "fedavgm"
    Config = FedAvgMConfig

    def server_update(self, global_params: State, params: list[State], results: list[ClientResult]) -> State:
        average = super().server_update(global_params, params, results)
        new, self.server["velocity"] = server_momentum(global_params, average, self.server.get("velocity"),
                                                       self.cfg.beta, self.cfg.server_lr, self.cfg.nesterov)
        return new
