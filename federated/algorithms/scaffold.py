"""SCAFFOLD (Karimireddy et al. 2020, Algorithm 1) with option II control variates.

Local steps use the corrected gradient g - c_i + c. After K local steps with learning rate lr the client
sets c_i+ = c_i - c + (w_global - w_i) / (K lr) and sends delta c_i = c_i+ - c_i; the server adds
(|S| / N) * mean(delta c_i) to c. The global model is the sample-weighted average of the clients' (the
FedAvg-family convention of NIID-Bench; Karimireddy et al.'s unweighted mean with global step 1 is the same
when clients are equal). Parameters only: BatchNorm statistics are never corrected. Chen et al. do not run
SCAFFOLD; it is here as NIID-Bench benchmarks it (Li et al. 2022).

Declared departure: the corrected gradient g - c_i + c goes through the local optimiser, momentum SGD
(momentum 0.9 as every client here, Chen et al. Table 9); NIID-Bench's Algorithm 2 steps plain SGD. Pass
``--momentum 0`` (with ``--set steps=plain``) for that form.

``steps="momentum-aware"`` (the default) replaces K by FedNova's a(K, rho) (Wang et al. 2020), which is K
for plain SGD, so option II is unchanged there. Under the paper's local momentum rho = 0.9, K steps move the
model by about K / (1 - rho) gradients: dividing by K makes c_i ten times the mean gradient, and fed back
through the momentum the correction grows every round until training collapses (10% accuracy on digits).
``steps="plain"`` keeps option II's K whatever the momentum: Karimireddy et al. write option II for plain
SGD, and NIID-Bench's code (momentum 0.9) divides by K. The momentum-aware default is kept for that measured
collapse; a(K, rho) is FedNova's momentum-SGD norm, (K - rho (1 - rho^K) / (1 - rho)) / (1 - rho) (checked
against Wang et al. 2020 in :func:`federated.aggregate.nova_norm`). Chen et al. do not run SCAFFOLD; the
Fig. 4 recipe's extra algorithms run it with this default.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fpsfl.base.settings import setting

from ..aggregate import State, nova_norm
from . import ALGORITHMS
from .base import AlgoConfig, ClientContext, ClientResult, FedAvg


@dataclass(frozen=True)
class ScaffoldConfig(AlgoConfig):
    steps: str = setting("momentum-aware", "the step count of option II: momentum-aware (a(K, rho)) | plain "
                                           "(K)", choices=("momentum-aware", "plain"))


def _zeros_like(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(p) for k, p in model.named_parameters()}


@ALGORITHMS.register
class Scaffold(FedAvg):
    name = "scaffold"
    Config = ScaffoldConfig
    client_reads = ("c",)

    def _variates(self, ctx: ClientContext, model: nn.Module) -> tuple[dict, dict]:
        """(c, c_i), zero before their first use."""
        if "c" not in self.server:
            self.server["c"] = _zeros_like(model)
        if "c" not in ctx.state:
            ctx.state["c"] = _zeros_like(model)
        return self.server["c"], ctx.state["c"]

    def client_tensors(self, ctx: ClientContext, model: nn.Module) -> dict:
        return {"ci": self._variates(ctx, model)[1]}

    def shared_tensors(self, ctx: ClientContext) -> dict:
        return {"c": self.server.get("c")}

    def gradient_correction(self, client: dict, shared: dict) -> State:
        return {k: shared["c"][k] - ci for k, ci in client["ci"].items()}

    def step_count(self, steps: int, momentum: float) -> float:
        return nova_norm(steps, momentum) if self.cfg.steps == "momentum-aware" else float(steps)

    @torch.no_grad()
    def finish_client(self, ctx: ClientContext, model: nn.Module) -> dict:
        if ctx.steps == 0:
            return {"delta_c": {}}
        c, ci = self.server["c"], ctx.state["c"]
        glob = dict(ctx.global_model.named_parameters())
        scale = 1.0 / (self.step_count(ctx.steps, ctx.momentum) * ctx.lr)
        delta = {}
        for name, p in model.named_parameters():
            new = ci[name] - c[name] + (glob[name] - p) * scale
            delta[name] = new - ci[name]
            ci[name] = new
        return {"delta_c": delta}

    def check_result(self, result: ClientResult, global_state: State) -> str:
        """A delta c_i for every parameter, shaped as it, after any local step (none without one)."""
        reason = super().check_result(result, global_state)
        delta = result.extra.get("delta_c")
        if reason or (delta == {} and result.steps == 0):
            return reason
        if not isinstance(delta, dict) or delta.keys() != self.param_names:
            return "its delta_c does not hold one entry per parameter"
        wrong = next((k for k, v in delta.items() if not isinstance(v, torch.Tensor)
                      or v.shape != global_state[k].shape), None)
        return f"its delta_c[{wrong}] is not shaped as the parameter" if wrong else ""

    def server_update(self, global_params: State, params: list[State], results: list[ClientResult]) -> State:
        new = super().server_update(global_params, params, results)
        deltas = [r.extra["delta_c"] for r in results if r.extra["delta_c"]]
        # c = 0 before its first use: made here too, for a server whose clients run elsewhere (Flower)
        self.server.setdefault("c", {k: torch.zeros_like(v) for k, v in global_params.items()})
        if deltas:
            share = len(deltas) / len(self.sizes)  # |S| / N
            for name in self.server["c"]:
                mean = sum(d[name] for d in deltas) / len(deltas)
                self.server["c"][name] = self.server["c"][name] + share * mean
        return new
