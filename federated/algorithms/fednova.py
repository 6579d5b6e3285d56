"""FedNova (Wang et al. 2020): normalised averaging that removes the bias of unequal local steps.

Each client's update is divided by its momentum-aware step count a_i before averaging and rescaled by
tau_eff = sum_i p_i a_i. a_i is Wang et al. 2020's momentum-aware step count (their Eq. for SGD with
momentum rho: a_i = [tau_i - rho (1 - rho^tau_i) / (1 - rho)] / (1 - rho)); NIID-Bench's Algorithm 1 divides
by the plain tau_i, which this equals only at momentum 0 (``federate --momentum 0``). Chen et al. do not run
FedNova; it is here as NIID-Bench benchmarks it (Li et al. 2022). With equal steps it is FedAvg.
Parameters only: BatchNorm statistics take the plain sample-weighted average.
"""

from __future__ import annotations

from ..aggregate import State, fednova
from . import ALGORITHMS
from .base import ClientContext, ClientResult, FedAvg


@ALGORITHMS.register
class FedNova(FedAvg):
    name = "fednova"
    divides_by_steps = True  # a_i, the momentum-aware step count

    def finish_client(self, ctx: ClientContext, model) -> dict:
        return {"momentum": ctx.momentum}

    def check_result(self, result: ClientResult, global_state: State) -> str:
        """The local momentum a_i is computed with must be a number in [0, 1)."""
        momentum = result.extra.get("momentum")
        if not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
            return f"its local momentum {momentum!r} is not in [0, 1)"
        return super().check_result(result, global_state)

    def server_update(self, global_params: State, params: list[State], results: list[ClientResult]) -> State:
        return fednova(global_params, params, [r.n_samples for r in results], [r.steps for r in results],
                       results[0].extra["momentum"])
