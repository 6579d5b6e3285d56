"""One federated round and one round of the centralised baseline (Chen et al., ICLR 2023, §4.2-4.4).

Each round: select clients, train each from the global model (its test accuracy *before* aggregation is
recorded for the ΔL/ΔG analysis of §4.4), aggregate with the algorithm, and test the new global model. All
randomness of round r comes from seeds derived from (seed, r, client), so a run is reproducible on CPU and
resumable at any round (:mod:`federated.runner` writes the metrics and the state after every round).

A round is three parts, so that every engine runs the same code: :func:`plan_round` (the server: clients,
learning rate, sample pools, global model), a dispatcher that trains the clients (:func:`train_in_process`,
or Flower messages to ClientApps that call :func:`make_job` and :func:`train_client`, see
:mod:`federated.flower`), and :func:`close_round` (the server: aggregate, test, the metrics record).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from fpsfl.base.checkpoint import atomic_save
from fpsfl.base.rundir import RunDir

from .aggregate import State
from .algorithms import ClientContext, ClientResult, FedAvg
from .batched import ClientJob, evaluate_batched, train_batched
from .experiment import FederateConfig
from .local import compile_model, epoch_batches, local_train, make_optimizer
from .oracle.tracking import Tracker
from .partitions import client_noise
from .seeding import client_generators, round_rng
from .setup import Setup


def precision(s: Setup):
    """The context of local training and evaluation: bf16 autocast with ``--amp``, else none. Only the ops
    torch's autocast lists (convolutions, linear layers) run in bf16; the losses, the optimiser's and the
    algorithms' arithmetic stay float32, and aggregation runs outside it. It spans whole local trainings, so
    its cache of bf16 weight copies is off: kept, it would serve step 1's weights to every later step (the
    optimiser updates the float32 weights, which the cache does not see; digits then stayed at chance)."""
    return torch.autocast(s.data.train_x.device.type, dtype=torch.bfloat16, enabled=s.amp,
                          cache_enabled=False)


def lr_at(cfg: FederateConfig, rnd: int) -> float:
    """Round ``rnd`` (0-based) learning rate: x lr_decay every lr_decay_every rounds (Appendix B.1)."""
    return cfg.resolved_lr() * cfg.lr_decay ** (rnd // cfg.lr_decay_every)


def _bn_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_buffers()}


def client_batch(cfg: FederateConfig, task, device: torch.device, clients: int) -> tuple[int, str]:
    """How many clients train together (1: one after another), and a note when that differs from what
    was asked. auto: every client of the round on a GPU; one at a time on a CPU, where the vectorised
    engine measured slower (docs/performance.md: grouped convolutions are slower than separate ones)."""
    asked = cfg.client_batch
    if asked is None:
        return (clients if device.type == "cuda" else 1), ""
    if asked > 1 and "functional" not in task.provides:
        return 1, (f"--client-batch {asked}: the {type(task).__name__} has no vectorised form yet; its "
                   f"clients train one after another")
    return max(1, min(asked, clients)), ""


def check_client_batch(cfg: FederateConfig, device: torch.device) -> None:
    """Refuse --client-batch K > 1 on a CPU (issue 24): there the sequential loop is bit-reproducible, and
    the vectorised clients cannot equal it. They compute the same steps (float64: 1e-17 a step) but vmap's
    grouped convolutions round differently, and local training amplifies rounding about 10x a step on
    digits' preset; after one demo round the weights are 2.5% apart (relative L2), as far as a 1e-7 nudge
    of the initial weights moves the sequential run (docs/performance.md: Vectorised clients)."""
    if cfg.client_batch is not None and cfg.client_batch > 1 and device.type == "cpu" and not cfg.centralized:
        raise ValueError(f"--client-batch {cfg.client_batch} on a CPU: vectorised clients round differently "
                         f"from one-at-a-time ones and local training amplifies it, so the run would not be "
                         f"the --client-batch 1 run (and on a CPU it is slower); use --client-batch 1")


@dataclass
class RoundPlan:
    """What the server decides before round ``rnd``'s local training: its learning rate, its clients, each
    client's per-epoch sample pools (FedVC draws them from the round's generator), and the global model."""

    rnd: int
    lr: float
    selected: list[int]
    pools: list[list[torch.Tensor]]  # pools[i]: the sample indices of selected[i] in each local epoch
    global_state: State
    frozen: nn.Module  # the round's global model, frozen (the ClientContext's global_model)
    initial: dict  # the initial model's test metrics (round 0 only)


# A dispatcher trains a round's clients and returns their results and mean local losses in plan.selected
# order, and notes for the round's metrics record: train_in_process (this process; no notes) or
# federated.flower's (Flower messages, one per client), which may leave out clients that did not reply or
# whose reply it refused (--min-replies; its notes say why): the round then aggregates over the others.
Dispatch = Callable[[Setup, FederateConfig, RoundPlan, torch.device, "tqdm | None"],
                    tuple[list[ClientResult], list[float], dict]]


def train_round(s: Setup, cfg: FederateConfig, rnd: int, device: torch.device, run: RunDir,
                bar: tqdm | None, tracker: Tracker | None = None, dispatch: Dispatch | None = None) -> dict:
    """One round: local training of the selected clients, aggregation, evaluation; returns its metrics.
    ``tracker`` adds the analyses of :mod:`federated.oracle.tracking` (and may replace the aggregate);
    ``dispatch`` trains the clients (default: :func:`train_in_process`)."""
    plan = plan_round(s, cfg, rnd)
    results, losses, notes = (dispatch or train_in_process)(s, cfg, plan, device, bar)
    replied = {r.client for r in results}
    missing = [c for c in plan.selected if c not in replied]
    if missing:  # a Flower round with enough replies (--min-replies): the clients that replied take part
        kept = [i for i, c in enumerate(plan.selected) if c in replied]
        plan = dataclasses.replace(plan, selected=[plan.selected[i] for i in kept],
                                   pools=[plan.pools[i] for i in kept])
    k = client_batch(cfg, s.task, device, len(plan.selected))[0] if dispatch is None else 1
    record = close_round(s, cfg, plan, results, losses, k, run, bar, tracker)
    if missing:
        record["missing_clients"] = missing
    record.update(notes)
    return record


def plan_round(s: Setup, cfg: FederateConfig, rnd: int) -> RoundPlan:
    """The server's part before local training; all its randomness comes from (seed, rnd)."""
    rng = round_rng(cfg.seed, rnd)
    selected = s.algo.select(rng, cfg.participation)
    global_state = {k: v.detach().clone() for k, v in s.model.state_dict().items()}
    initial = test_metrics(s) if rnd == 0 else {}
    frozen = frozen_copy(s.model)
    pools = [s.algo.epoch_pools(client, s.parts[client], cfg.local_epochs, rng) for client in selected]
    return RoundPlan(rnd, lr_at(cfg, rnd), selected, pools, global_state, frozen, initial)


def frozen_copy(model: nn.Module) -> nn.Module:
    """The round's global model as the clients' hooks see it (FedProx's anchor, MOON's global view)."""
    return copy.deepcopy(model).eval().requires_grad_(False)


def train_in_process(s: Setup, cfg: FederateConfig, plan: RoundPlan, device: torch.device,
                     bar: tqdm | None) -> tuple[list[ClientResult], list[float], dict]:
    """The in-process engine: every client of the round in this process, ``--client-batch`` at a time."""
    jobs = [make_job(cfg, plan, i, s.algo.clients[client], device)
            for i, client in enumerate(plan.selected)]
    k, _ = client_batch(cfg, s.task, device, len(jobs))
    states, losses = _train_jobs(s, cfg, jobs, k, bar)
    local = copy.deepcopy(s.model)
    results = [finish_job(s.algo, cfg, job, state, local) for job, state in zip(jobs, states, strict=True)]
    return results, losses, {}


def local_model(s: Setup, vectorised: bool = False) -> nn.Module:
    """A copy of the global model for the clients to train in, each from its start state (:func:`_train_one`
    overwrites it), compiled with ``--compile`` unless the clients are vectorised (``--client-batch K``
    uses it only as the template of their stacked tensors). Dynamo's graphs belong to the model's code, not
    to the copy: the copies of later rounds reuse the first round's (tests/federated/test_compile.py)."""
    local = copy.deepcopy(s.model)
    if s.compile and not vectorised:
        compile_model(local, next(local.parameters()).device)
    return local


def train_client(s: Setup, cfg: FederateConfig, job: ClientJob) -> tuple[ClientResult, float]:
    """One client's local training and client step, as the in-process engine runs it with --client-batch 1
    (the Flower ClientApp calls this)."""
    local = local_model(s)
    state, loss = _train_one(s, cfg, job, local)
    return finish_job(s.algo, cfg, job, state, local), loss


def close_round(s: Setup, cfg: FederateConfig, plan: RoundPlan, results: list[ClientResult],
                losses: list[float], k: int, run: RunDir, bar: tqdm | None, tracker: Tracker | None) -> dict:
    """The server's part after local training: aggregate, test, and the round's metrics record."""
    rnd, selected = plan.rnd, plan.selected
    if rnd + 1 in cfg.save_local_models:
        for r in results:
            _save_local(run.path, rnd + 1, r.client, r.state, plan.global_state)
    local_accs = _local_accuracies(s, [r.state for r in results], k) if cfg.eval_local else []
    aggregate = s.algo.aggregate(plan.global_state, results)
    sizes = [len(s.parts[c]) for c in selected]  # real data sizes |D_m|: Eq. 3's and Eq. 4's FedAvg weights
    tracked: dict = {}
    if tracker is not None and tracker.due(rnd + 1):
        if bar is not None:
            bar.set_postfix_str("tracking")
        tracked, override = tracker(rnd + 1, [r.state for r in results], sizes)
        aggregate = aggregate if override is None else override
    s.model.load_state_dict(aggregate)
    record = {"round": rnd + 1, "lr": plan.lr, **test_metrics(s), "train_loss": float(np.mean(losses)),
              "clients": selected, "client_sizes": sizes, **_health(aggregate), **tracked}
    if rnd == 0:  # the initial model's accuracy: the Acc(theta_{t-1}) of round 1 in Eq. 3 (§6.1)
        record.update({f"init_{k}": v for k, v in plan.initial.items()})
    if local_accs:
        # data-size-weighted, as the local gain of Eq. 3 (§6) weighs clients by |D_m| / |D|
        weights = np.asarray(record["client_sizes"], dtype=np.float64)
        record.update(local_acc=float(np.dot(weights / weights.sum(), local_accs)), local_accs=local_accs)
    return record


def make_job(cfg: FederateConfig, plan: RoundPlan, i: int, client_state: dict,
             device: torch.device) -> ClientJob:
    """What the ``i``-th client of the round trains on: its start state, steps, generators and context.
    ``client_state`` is its persistent state (``algo.clients[client]``), updated in place."""
    client = plan.selected[i]
    start = dict(plan.global_state)
    own_bn = client_state.get("bn") if cfg.bn == "local" else None
    if own_bn is not None:
        start.update({k: v.to(device) for k, v in own_bn.items()})
    pools = plan.pools[i]
    aug_gen = client_generators(cfg.seed, plan.rnd, client, device)[1]
    ctx = ClientContext(client, plan.frozen, plan.lr, local_momentum(cfg), client_state)
    return ClientJob(ctx, start, planned_batches(cfg, plan, i), aug_gen, client_noise_for(cfg, client),
                     examples=len(pools[0]) if pools else 0)


def planned_batches(cfg: FederateConfig, plan: RoundPlan, i: int) -> list[torch.Tensor]:
    """The sample indices of each local step of the ``i``-th client of the round, in the order drawn from
    (seed, round, client): what its local training runs, and what a Flower server counts its steps from."""
    order_gen = client_generators(cfg.seed, plan.rnd, plan.selected[i], torch.device("cpu"))[0]
    return epoch_batches(plan.pools[i], cfg.resolved_batch(), order_gen)


def finish_job(algo: FedAvg, cfg: FederateConfig, job: ClientJob, state: State,
               local: nn.Module) -> ClientResult:
    """The client step after local training (:meth:`FedAvg.finish_client`) and what the client sends."""
    local.load_state_dict(state)
    extra = algo.finish_client(job.ctx, local)
    if cfg.bn == "local":
        job.ctx.state["bn"] = _bn_buffers(local)
    return ClientResult(job.ctx.client, state, job.examples, job.ctx.steps, extra)


def _train_jobs(s: Setup, cfg: FederateConfig, jobs: list[ClientJob], k: int,
                bar: tqdm | None) -> tuple[list[dict], list[float]]:
    """Each job's final state and mean loss: ``k`` clients at a time as one vectorised model, or (k = 1)
    one after another with torch.optim, as the paper's loop."""
    states, losses = [], []
    local = local_model(s, vectorised=k > 1)
    x, y = s.data.train_x, s.data.train_y
    for first in range(0, len(jobs), k):
        chunk = jobs[first:first + k]
        if k == 1:
            state, loss = _train_one(s, cfg, chunk[0], local)
            states.append(state)
            losses.append(loss)
        else:
            with precision(s):
                states += train_batched(local, s.algo, chunk, s.task, x, y, cfg.resolved_optimizer(),
                                        chunk[0].ctx.lr, cfg.momentum, cfg.weight_decay, s.capture, s.graphs)
            losses += [float(torch.stack(job.losses).float().mean()) if job.losses else 0.0 for job in chunk]
        if bar is not None:
            bar.set_postfix_str(f"client {min(first + k, len(jobs))}/{len(jobs)}")
    return states, losses


def _train_one(s: Setup, cfg: FederateConfig, job: ClientJob, local: nn.Module) -> tuple[State, float]:
    """One client's local SGD with torch.optim in ``local`` (overwritten): its final state and mean loss."""
    local.load_state_dict(job.start)
    optimizer = make_optimizer(local, cfg.resolved_optimizer(), job.ctx.lr, cfg.momentum, cfg.weight_decay)
    with precision(s):
        loss = local_train(local, optimizer, s.algo, job.ctx, s.task, s.data.train_x, s.data.train_y,
                           job.batches, job.aug_gen, job.noise)
    return {n: v.detach().clone() for n, v in local.state_dict().items()}, loss


def _local_accuracies(s: Setup, states: list[dict], k: int) -> list[float]:
    """Each local model's test accuracy (Eq. 3's local gain), ``k`` models evaluated at a time."""
    if k == 1:
        local = copy.deepcopy(s.model)
        accs = []
        for state in states:
            local.load_state_dict(state)
            with precision(s):
                accs.append(s.task.evaluate(local, s.data.test_x, s.data.test_y)["acc"])
        return accs
    x, y = s.data.test_x, s.data.test_y
    with precision(s):
        return [acc for first in range(0, len(states), k)
                for acc in evaluate_batched(s.model, s.task, states[first:first + k], x, y)]


def _health(state: dict[str, torch.Tensor]) -> dict:
    """The smallest BatchNorm running variance of a state (negative means a corrupted server update)."""
    variances = [v.min() for k, v in state.items() if k.endswith("running_var")]
    return {"bn_min_var": float(torch.stack(variances).min())} if variances else {}


def test_metrics(s: Setup) -> dict:
    """The global model's test metrics: test_acc (the task's main metric), test_loss, and any others."""
    with precision(s):
        metrics = s.task.evaluate(s.model, s.data.test_x, s.data.test_y)
    return {f"test_{k}": v for k, v in metrics.items()}


def local_momentum(cfg: FederateConfig) -> float:
    """The local SGD momentum (FedNova's step normaliser); Adam has none in that sense."""
    return cfg.momentum if cfg.resolved_optimizer() == "sgd" else 0.0


def client_noise_for(cfg: FederateConfig, client: int) -> float:
    return client_noise(cfg.partition_config(), client)


def _save_local(run_dir: Path, rnd: int, client: int, state: dict, global_state: dict) -> None:
    folder = run_dir / "local" / f"round_{rnd:04d}"
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "global.pt").exists():
        atomic_save({k: v.cpu() for k, v in global_state.items()}, folder / "global.pt")
    atomic_save({k: v.cpu() for k, v in state.items()}, folder / f"client_{client:03d}.pt")


class Federated:
    """The round loop's work for a federated run: :func:`train_round` with the run's tracker (``--track``)
    and engine (``dispatch``: None in process). :class:`federated.centralised.Centralised` is the other
    kind; :func:`federated.runner.run` drives either."""

    desc = "rounds"

    def __init__(self, s: Setup, cfg: FederateConfig, device: torch.device, rundir: RunDir,
                 dispatch: Dispatch | None):
        self.s, self.cfg, self.device, self.rundir, self.dispatch = s, cfg, device, rundir, dispatch
        self.tracker = (Tracker(cfg.tracking, s.model, s.task, s.data, cfg.seed) if cfg.tracking.active
                        else None)

    def notes(self, engine: str) -> list[str]:
        cfg = self.cfg
        if engine == "flower":
            asked = cfg.client_batch not in (None, 1)
            return [f"--client-batch {cfg.client_batch}: each Flower client trains alone (--engine flower)"
                    ] if asked else []
        k, note = client_batch(cfg, self.s.task, next(self.s.model.parameters()).device, cfg.clients)
        if self.s.compile and k > 1:
            note = (note + "; " if note else "") + (f"--compile: the {k} vectorised clients run eagerly "
                                                    f"(--client-batch 1 compiles the one-client step)")
        if self.s.capture is not None and k == 1:
            note = (note + "; " if note else "") + ("--cuda-graph: clients trained one at a time run "
                                                    "eagerly (it captures vectorised clients)")
        return [note] if note else []

    def round(self, rnd: int, bar: tqdm | None) -> dict:
        return train_round(self.s, self.cfg, rnd, self.device, self.rundir, bar, self.tracker, self.dispatch)

    def extra_state(self) -> dict:
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass
