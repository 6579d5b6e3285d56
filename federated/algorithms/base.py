"""FedAvg (McMahan et al. 2017) and the hooks every FedAvg-family algorithm overrides.

Chen et al., ICLR 2023, §4.3 and Fig. 4 compare FedAvg with FedProx, FedDyn and MOON; SCAFFOLD and FedNova
are here as NIID-Bench benchmarks them (Li et al. 2022), FedAvgM, FedVC and FedIR as Hsu et al. 2019/2020.
Like Flower's strategies, the round loop (:mod:`federated.rounds`,
:mod:`federated.runner`) owns the orchestration and calls these hooks; an algorithm overrides only what it
changes. Per-client and server state lives in the algorithm object and is saved with the round
checkpoint through :meth:`FedAvg.state_dict`.

The server side is split in two so that no algorithm can touch BatchNorm statistics by mistake:
:meth:`FedAvg.aggregate` (not overridden) averages the buffers by sample count and hands only the
trainable parameters to :meth:`FedAvg.server_update`, which algorithms override.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from fpsfl.base.settings import check

from ..aggregate import State, split_state, weighted_average
from ..functional import FunctionalModel, tree_to
from ..seeding import sample_clients
from ..tasks import Task
from . import ALGORITHMS


@dataclass(frozen=True)
class AlgoConfig:
    """Hyperparameters of an algorithm (``--set KEY=VALUE``); FedAvg has none. Fields made with
    :func:`fpsfl.base.settings.setting` declare their range, checked here."""

    def __post_init__(self) -> None:
        check(self, style="key")


@dataclass
class ClientContext:
    """What one client's local training knows: the round's global model and its own persistent state."""

    client: int
    global_model: nn.Module  # frozen copy of the round's global model
    lr: float
    momentum: float
    state: dict[str, Any]  # this client's persistent state (owned by the algorithm)
    steps: int = 0  # optimiser steps taken so far in this round
    cache: dict[str, Any] = field(default_factory=dict)  # the hooks' tensors this round (FedAvg.hook_tensors)


@dataclass
class ClientResult:
    client: int
    state: State  # the local model's state_dict after training (CPU or device tensors)
    n_samples: int  # samples the client trained on per local epoch (its aggregation weight in FedAvg)
    steps: int
    extra: dict[str, Any] = field(default_factory=dict)


@ALGORITHMS.register
class FedAvg:
    name: ClassVar[str] = "fedavg"
    Config: ClassVar[type[AlgoConfig]] = AlgoConfig
    requires: ClassVar[frozenset[str]] = frozenset()  # task capabilities it needs (see federated.tasks.Task)
    # the server state keys a client's hooks read (SCAFFOLD's c): all that a Flower message carries of it
    client_reads: ClassVar[tuple[str, ...]] = ()
    # whether server_update divides by a client's step count (FedNova): a reply with none is refused
    divides_by_steps: ClassVar[bool] = False

    def __init__(self, cfg: AlgoConfig, client_sizes: list[int], class_counts: np.ndarray):
        self.cfg = cfg
        self.sizes = list(client_sizes)
        self.class_counts = np.asarray(class_counts, dtype=np.float64)  # (clients, classes)
        self.clients: list[dict[str, Any]] = [{} for _ in client_sizes]
        self.server: dict[str, Any] = {}
        self.param_names: frozenset[str] = frozenset()  # set by attach()

    # ---- model and sampling -------------------------------------------------------------------------
    def attach(self, model: nn.Module) -> None:
        """Called once with the global model: lets the algorithm add modules, then records which state
        entries are trainable parameters (the only entries server updates may transform)."""
        self.prepare_model(model)
        self.param_names = frozenset(name for name, _ in model.named_parameters())

    def prepare_model(self, model: nn.Module) -> None:
        """Add algorithm-specific modules to the global model before training starts (MOON)."""

    def select(self, rng: np.random.Generator, fraction: float) -> list[int]:
        """Clients of this round: a uniform sample of round(fraction * N) (at least 1), sorted."""
        return sample_clients(rng, len(self.sizes), fraction)

    def epoch_pools(self, client: int, indices: Tensor, epochs: int,
                    rng: np.random.Generator) -> list[Tensor]:
        """The sample indices the client trains on in each local epoch: all of them (FedVC draws)."""
        return [indices] * epochs

    # ---- local training: the algorithm's terms, written once as pure functions ------------------------
    def functional_loss(self, fm: FunctionalModel, params: State, buffers: State, x: Tensor, y: Tensor,
                        client: dict[str, Any], shared: dict[str, Any]) -> Tensor:
        """One client's mini-batch loss as a function of explicit tensors: ``fm(params, buffers, x)`` calls
        the model on them. The one-client loop passes the model's own tensors, ``--client-batch`` stacked
        ones under ``vmap`` (:mod:`federated.batched`); ``client``, ``shared``: the hooks below."""
        return fm.task.loss(fm(params, buffers, x), y).mean()

    def client_tensors(self, ctx: ClientContext, model: nn.Module) -> dict[str, Any]:
        """The tensors of this client that :meth:`functional_loss` reads (its own state: FedDyn's g)."""
        return {}

    def shared_tensors(self, ctx: ClientContext) -> dict[str, Any]:
        """The tensors every client's :meth:`functional_loss` shares (e.g. the round's global model)."""
        return {}

    def gradient_correction(self, client: dict[str, Any], shared: dict[str, Any]) -> State | None:
        """What is added to the gradients after backward, before the optimiser step (SCAFFOLD's c - c_i);
        None: nothing."""
        return None

    # ---- the one-client loop's entry points, derived from the hooks above (not overridden) -------------
    def local_loss(self, ctx: ClientContext, model: nn.Module, task: Task, inputs: Tensor,
                   targets: Tensor) -> Tensor:
        """:meth:`functional_loss` on ``model``'s own parameters and buffers (one client)."""
        fm = ctx.cache.get("fm")
        if fm is None or fm.train_model is not model or fm.task is not task:
            fm = ctx.cache["fm"] = FunctionalModel(model, task)
        client, shared = self.hook_tensors(ctx, model)
        return self.functional_loss(fm, fm.params, fm.buffers, inputs, targets, client, shared)

    def before_step(self, ctx: ClientContext, model: nn.Module) -> None:
        """Adds :meth:`gradient_correction` to ``model``'s gradients (one client)."""
        correction = self.gradient_correction(*self.hook_tensors(ctx, model))
        if correction is not None:
            for name, p in model.named_parameters():
                if p.grad is not None:
                    p.grad.add_(correction[name])

    def hook_tensors(self, ctx: ClientContext, model: nn.Module) -> tuple[dict[str, Any], dict[str, Any]]:
        """(:meth:`client_tensors`, :meth:`shared_tensors`) of ``ctx`` on the model's device, made once per
        client and round (the state they read changes only in :meth:`finish_client` and the server step)."""
        if "tensors" not in ctx.cache:
            device = next(model.parameters()).device
            client = tree_to(self.client_tensors(ctx, model), device)  # first: it may create server state
            ctx.cache["tensors"] = (client, tree_to(self.shared_tensors(ctx), device))
        return ctx.cache["tensors"]

    def finish_client(self, ctx: ClientContext, model: nn.Module) -> dict[str, Any]:
        """After local training; returns extra payload for :meth:`server_update`."""
        return {}

    # ---- server --------------------------------------------------------------------------------------
    def aggregate(self, global_state: State, results: list[ClientResult]) -> State:
        """The new global state: parameters from :meth:`server_update`, buffers (BatchNorm statistics)
        the sample-weighted average of the clients' (integer buffers stay integers). Not overridden."""
        if not self.param_names:
            raise RuntimeError(f"{self.name}: attach(model) must be called before aggregate")
        glob, _ = split_state(global_state, self.param_names)
        parts = [split_state(r.state, self.param_names) for r in results]
        new = self.server_update(glob, [p for p, _ in parts], results)
        if len(parts[0][1]):
            new.update(weighted_average([b for _, b in parts], [r.n_samples for r in results]))
        return {k: new[k] for k in global_state}

    def server_update(self, global_params: State, params: list[State], results: list[ClientResult]) -> State:
        """The new global parameters from the clients' (``params[i]`` is ``results[i]``'s): FedAvg's
        sample-weighted average."""
        return weighted_average(params, [r.n_samples for r in results])

    def check_result(self, result: ClientResult, global_state: State) -> str:
        """Why :meth:`aggregate` must not take ``result``, a client's reply from another process (a Flower
        node), or "" when it may: its model must have the global model's keys, shapes and dtypes and finite
        values, its step count must be positive where :meth:`server_update` divides by it, and every number
        of its payload must be finite. Algorithms with a payload check its form too. One line."""
        state = result.state
        if state.keys() != global_state.keys():
            odd = sorted(state.keys() ^ global_state.keys())
            return f"its model's keys differ from the global model's ({', '.join(odd[:3])})"
        for key, ref in global_state.items():
            value = state[key]
            if not isinstance(value, Tensor):
                return f"its {key} is a {type(value).__name__}, not a tensor"
            if value.shape != ref.shape or value.dtype != ref.dtype:
                return f"its {key} is {tuple(value.shape)} {value.dtype}, not {tuple(ref.shape)} {ref.dtype}"
            if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                return f"its {key} is not finite"
        if self.divides_by_steps and result.steps <= 0:
            return f"it took {result.steps} steps, and {self.name} divides by the step count"
        bad = _non_finite(result.extra, "")
        return f"its {bad.lstrip('/')} is not finite" if bad else ""

    # ---- persistence ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"server": self.server, "clients": self.clients}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.server, self.clients = state["server"], state["clients"]


def _non_finite(tree: Any, path: str) -> str:
    """The path of the first tensor or number in ``tree`` (nested dicts) that is not finite, or ""."""
    if isinstance(tree, dict):
        return next((bad for k, v in tree.items() if (bad := _non_finite(v, f"{path}/{k}"))), "")
    if isinstance(tree, Tensor):
        return path if tree.is_floating_point() and not bool(torch.isfinite(tree).all()) else ""
    if isinstance(tree, float):
        return "" if math.isfinite(tree) else path
    return ""

