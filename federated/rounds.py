"""One federated round and one round of the centralised baseline (Chen et al., ICLR 2023, §4.2-4.4).

Each round: select clients, train each from the global model (its test accuracy *before* aggregation is
recorded for the ΔL/ΔG analysis of §4.4), aggregate with the algorithm, and test the new global model. All
randomness of round r comes from seeds derived from (seed, r, client), so a run is reproducible on CPU and
resumable at any round (:mod:`federated.runner` writes the metrics and the state after every round).
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from fpsfl.base.checkpoint import atomic_save
from fpsfl.base.rundir import RunDir

from .algorithms import ClientContext, ClientResult
from .batched import ClientJob, evaluate_batched, train_batched
from .experiment import FederateConfig
from .local import epoch_batches, local_train, make_optimizer
from .oracle.tracking import Tracker
from .partitions import client_noise
from .setup import Setup


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1, np.uint64)[0] >> 1)


def _generators(cfg: FederateConfig, rnd: int, client: int, device: torch.device):
    order = torch.Generator().manual_seed(_seed(cfg.seed, rnd, client, 1))
    aug = torch.Generator(device=device).manual_seed(_seed(cfg.seed, rnd, client, 2))
    return order, aug


def lr_at(cfg: FederateConfig, rnd: int) -> float:
    """Round ``rnd`` (0-based) learning rate: x lr_decay every lr_decay_every rounds (Appendix B.1)."""
    return cfg.resolved_lr() * cfg.lr_decay ** (rnd // cfg.lr_decay_every)


def _bn_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_buffers()}


def client_batch(cfg: FederateConfig, task, device: torch.device, clients: int) -> tuple[int, str]:
    """How many clients train together (1: one after another), and a note when that differs from what
    was asked. auto: every client of the round on a GPU; one at a time on a CPU, where the vectorised
    engine measured slower (README, Performance: grouped convolutions are slower than separate ones)."""
    asked = cfg.client_batch
    if asked is None:
        return (clients if device.type == "cuda" else 1), ""
    if asked > 1 and "functional" not in task.provides:
        return 1, (f"--client-batch {asked}: the {type(task).__name__} has no vectorised form yet; its "
                   f"clients train one after another")
    return max(1, min(asked, clients)), ""


def train_round(s: Setup, cfg: FederateConfig, rnd: int, device: torch.device, run: RunDir,
                bar: tqdm | None, tracker: Tracker | None = None) -> dict:
    """One round: local training of the selected clients, aggregation, evaluation; returns its metrics.
    ``tracker`` adds the analyses of :mod:`federated.oracle.tracking` (and may replace the aggregate)."""
    lr = lr_at(cfg, rnd)
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, rnd, 0]))
    selected = s.algo.select(rng, cfg.participation)
    global_state = {k: v.detach().clone() for k, v in s.model.state_dict().items()}
    initial = _test_metrics(s) if rnd == 0 else {}
    frozen = copy.deepcopy(s.model).eval().requires_grad_(False)
    jobs = [_job(s, cfg, rnd, client, lr, frozen, global_state, rng, device) for client in selected]
    k, _ = client_batch(cfg, s.task, device, len(jobs))
    states, losses = _train_jobs(s, cfg, jobs, k, bar)
    results, local = [], copy.deepcopy(s.model)
    for job, state in zip(jobs, states, strict=True):
        local.load_state_dict(state)
        extra = s.algo.finish_client(job.ctx, local)
        if cfg.bn == "local":
            job.ctx.state["bn"] = _bn_buffers(local)
        if rnd + 1 in cfg.save_local_models:
            _save_local(run.path, rnd + 1, job.ctx.client, state, global_state)
        results.append(ClientResult(job.ctx.client, state, job.examples, job.ctx.steps, extra))
    local_accs = _local_accuracies(s, [r.state for r in results], k) if cfg.eval_local else []
    aggregate = s.algo.aggregate(global_state, results)
    sizes = [len(s.parts[c]) for c in selected]  # real data sizes |D_m|: Eq. 3's and Eq. 4's FedAvg weights
    tracked: dict = {}
    if tracker is not None and tracker.due(rnd + 1):
        if bar is not None:
            bar.set_postfix_str("tracking")
        tracked, override = tracker(rnd + 1, [r.state for r in results], sizes)
        aggregate = aggregate if override is None else override
    s.model.load_state_dict(aggregate)
    record = {"round": rnd + 1, "lr": lr, **_test_metrics(s), "train_loss": float(np.mean(losses)),
              "clients": selected, "client_sizes": sizes, **_health(aggregate), **tracked}
    if rnd == 0:  # the initial model's accuracy: the Acc(theta_{t-1}) of round 1 in Eq. 3 (§6.1)
        record.update({f"init_{k}": v for k, v in initial.items()})
    if local_accs:
        # data-size-weighted, as the local gain of Eq. 3 (§6) weighs clients by |D_m| / |D|
        weights = np.asarray(record["client_sizes"], dtype=np.float64)
        record.update(local_acc=float(np.dot(weights / weights.sum(), local_accs)), local_accs=local_accs)
    return record


def _job(s: Setup, cfg: FederateConfig, rnd: int, client: int, lr: float, frozen: nn.Module,
         global_state: dict, rng: np.random.Generator, device: torch.device) -> ClientJob:
    """What one client trains on this round: its start state, steps, generators and context."""
    start = dict(global_state)
    own_bn = s.algo.clients[client].get("bn") if cfg.bn == "local" else None
    if own_bn is not None:
        start.update({k: v.to(device) for k, v in own_bn.items()})
    pools = s.algo.epoch_pools(client, s.parts[client], cfg.local_epochs, rng)
    order_gen, aug_gen = _generators(cfg, rnd, client, device)
    ctx = ClientContext(client, frozen, lr, _momentum(cfg), s.algo.clients[client])
    return ClientJob(ctx, start, epoch_batches(pools, cfg.resolved_batch(), order_gen), aug_gen,
                     client_noise_for(cfg, client), examples=len(pools[0]) if pools else 0)


def _train_jobs(s: Setup, cfg: FederateConfig, jobs: list[ClientJob], k: int,
                bar: tqdm | None) -> tuple[list[dict], list[float]]:
    """Each job's final state and mean loss: ``k`` clients at a time as one vectorised model, or (k = 1)
    one after another with torch.optim, as the paper's loop."""
    states, losses = [], []
    local = copy.deepcopy(s.model)
    x, y = s.data.train_x, s.data.train_y
    for first in range(0, len(jobs), k):
        chunk = jobs[first:first + k]
        if k == 1:
            job = chunk[0]
            local.load_state_dict(job.start)
            optimizer = make_optimizer(local, cfg.resolved_optimizer(), job.ctx.lr, cfg.momentum,
                                       cfg.weight_decay)
            losses.append(local_train(local, optimizer, s.algo, job.ctx, s.task, x, y, job.batches,
                                      job.aug_gen, job.noise))
            states.append({n: v.detach().clone() for n, v in local.state_dict().items()})
        else:
            states += train_batched(local, s.algo, chunk, s.task, x, y, cfg.resolved_optimizer(),
                                    chunk[0].ctx.lr, cfg.momentum, cfg.weight_decay)
            losses += [float(torch.stack(job.losses).float().mean()) if job.losses else 0.0 for job in chunk]
        if bar is not None:
            bar.set_postfix_str(f"client {min(first + k, len(jobs))}/{len(jobs)}")
    return states, losses


def _local_accuracies(s: Setup, states: list[dict], k: int) -> list[float]:
    """Each local model's test accuracy (Eq. 3's local gain), ``k`` models evaluated at a time."""
    if k == 1:
        local = copy.deepcopy(s.model)
        accs = []
        for state in states:
            local.load_state_dict(state)
            accs.append(s.task.evaluate(local, s.data.test_x, s.data.test_y)["acc"])
        return accs
    x, y = s.data.test_x, s.data.test_y
    return [acc for first in range(0, len(states), k)
            for acc in evaluate_batched(s.model, s.task, states[first:first + k], x, y)]


def _health(state: dict[str, torch.Tensor]) -> dict:
    """The smallest BatchNorm running variance of a state (negative means a corrupted server update)."""
    variances = [v.min() for k, v in state.items() if k.endswith("running_var")]
    return {"bn_min_var": float(torch.stack(variances).min())} if variances else {}


def _test_metrics(s: Setup) -> dict:
    """The global model's test metrics: test_acc (the task's main metric), test_loss, and any others."""
    return {f"test_{k}": v for k, v in s.task.evaluate(s.model, s.data.test_x, s.data.test_y).items()}


def _momentum(cfg: FederateConfig) -> float:
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


def centralized_round(s: Setup, cfg: FederateConfig, rnd: int, device: torch.device,
                      optimizer: torch.optim.Optimizer) -> dict:
    """One 'round' of the centralised baseline: local_epochs epochs on the union of the clients, with one
    optimiser for the whole run and the same learning-rate schedule (the CL of ΔCL-FL, §4.2)."""
    lr = lr_at(cfg, rnd)
    for group in optimizer.param_groups:
        group["lr"] = lr
    pool = torch.cat(s.parts)
    ctx = ClientContext(-1, s.model, lr, _momentum(cfg), {})
    order_gen, aug_gen = _generators(cfg, rnd, 0, device)
    batches = epoch_batches([pool] * cfg.local_epochs, cfg.resolved_batch(), order_gen)
    loss = local_train(s.model, optimizer, s.algo, ctx, s.task, s.data.train_x, s.data.train_y, batches,
                       aug_gen)
    return {"round": rnd + 1, "lr": lr, **_test_metrics(s), "train_loss": loss}
