"""The federated round loop and the centralised baseline (Chen et al., ICLR 2023, §4.2-4.4).

Each round: select clients, train each from the global model (its test accuracy *before* aggregation is
recorded for the ΔL/ΔG analysis of §4.4), aggregate with the algorithm, and test the new global model.
After every round a metrics line and the round state (global model + algorithm state) are written, so a
killed run continues with ``--resume`` and ends with the same metrics. All randomness of round r comes
from seeds derived from (seed, r, client), so a run is reproducible on CPU and resumable at any round.
"""

from __future__ import annotations

import copy
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from fpsfl.base.checkpoint import atomic_save, plain
from fpsfl.base.device import resolve_device
from fpsfl.base.rundir import RunDir, RunDirError
from pretrain.backbones import create_backbone

from .algorithms import ALGORITHMS, ClientContext, ClientResult, FedAvg
from .datasets import DataConfig, ImageData, load_dataset
from .experiment import FederateConfig
from .initialisation import check_init, init_sha256, initialise
from .local import DivergenceError, local_train, make_optimizer
from .oracle.tracking import Tracker
from .partitions import PartitionConfig, client_noise, default_min_size, partition, write_partition_report
from .tasks import TASKS, Task

FINAL_FORMAT = "fpsfl-federated/1"
DIVERGE_FACTOR = 100.0  # see check_divergence


@dataclass(frozen=True)
class RunOptions:
    out: Path  # the run directory
    device: str = "auto"
    resume: bool = False
    progress: bool = True
    stop_after: int | None = None  # stop after this many rounds of this invocation (tests of --resume)


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1, np.uint64)[0] >> 1)


def _generators(cfg: FederateConfig, rnd: int, client: int, device: torch.device):
    order = torch.Generator().manual_seed(_seed(cfg.seed, rnd, client, 1))
    aug = torch.Generator(device=device).manual_seed(_seed(cfg.seed, rnd, client, 2))
    return order, aug


def lr_at(cfg: FederateConfig, rnd: int) -> float:
    """Round ``rnd`` (0-based) learning rate: x lr_decay every lr_decay_every rounds (Appendix B.1)."""
    return cfg.resolved_lr() * cfg.lr_decay ** (rnd // cfg.lr_decay_every)


@dataclass
class Setup:
    data: ImageData
    parts: list[torch.Tensor]
    task: Task
    model: nn.Module
    algo: FedAvg
    init_report: str


def partition_config(cfg: FederateConfig) -> PartitionConfig:
    return PartitionConfig(name=cfg.partition, clients=cfg.clients, alpha=cfg.alpha,
                           labels_per_client=cfg.labels_per_client, beta=cfg.beta, noise=cfg.noise,
                           min_size=default_min_size(cfg.partition) if cfg.min_size is None else cfg.min_size,
                           seed=cfg.seed)


def setup(cfg: FederateConfig, device: torch.device, data: ImageData | None = None,
          load_init: bool = True) -> Setup:
    """Data (loaded unless given), partition, task, model (initialised from ``cfg.init`` if
    ``load_init``) and algorithm, on ``device``."""
    if data is None:
        data = load_dataset(DataConfig(name=cfg.dataset, root=cfg.data_root, download=cfg.download,
                                       store_size=cfg.store_size, split_csv=cfg.split_csv,
                                       val_fraction=cfg.val_fraction, seed=cfg.seed))
    task = TASKS[data.task](data, cfg)
    # the CL baseline trains plain SGD on the pooled data: client and server steps have no meaning there
    algo_cls = FedAvg if cfg.centralized else ALGORITHMS[cfg.algo]
    missing = algo_cls.requires - task.provides
    if missing:
        raise ValueError(f"--algo {cfg.algo} needs {', '.join(sorted(missing))}, which the {data.task} task "
                         f"does not provide; choose another algorithm")
    labels = task.sample_labels(data.train_y).numpy()
    natural = data.clients.numpy() if data.clients is not None else None
    parts = partition(labels, partition_config(cfg), natural)
    torch.manual_seed(cfg.seed)
    backbone = create_backbone(cfg.arch, cfg.width)
    report = (initialise(backbone, cfg.arch, cfg.width, cfg.init, cfg.init_format) if load_init
              else f"resumed from the run's state ({cfg.init} at the start)")
    model = task.build_model(backbone)
    counts = np.stack([task.class_counts(data.train_y[torch.as_tensor(p)]).numpy() for p in parts])
    algo_cfg = FedAvg.Config() if cfg.centralized else cfg.algo_config()
    algo = algo_cls(algo_cfg, [len(p) for p in parts], counts)
    algo.attach(model)
    # channels-last weights (the inputs already are, see augment.py): ResNet20 rounds on digits ran about
    # 20% faster with them on the 2-core CPU VM, and it is the layout GPU tensor cores want
    model = model.to(device, memory_format=torch.channels_last)
    return Setup(data.to(device), [torch.as_tensor(p, dtype=torch.long) for p in parts], task, model, algo,
                 report)


def _bn_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_buffers()}


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
    local = copy.deepcopy(s.model)
    results, local_accs, losses = [], [], []
    for i, client in enumerate(selected):
        local.load_state_dict(global_state)
        own_bn = s.algo.clients[client].get("bn") if cfg.bn == "local" else None
        if own_bn is not None:
            local.load_state_dict(own_bn, strict=False)
        ctx = ClientContext(client, frozen, lr, _momentum(cfg), s.algo.clients[client])
        pools = s.algo.epoch_pools(client, s.parts[client], cfg.local_epochs, rng)
        order_gen, aug_gen = _generators(cfg, rnd, client, device)
        optimizer = make_optimizer(local, cfg.resolved_optimizer(), lr, cfg.momentum, cfg.weight_decay)
        losses.append(local_train(local, optimizer, s.algo, ctx, s.task, s.data.train_x, s.data.train_y,
                                  pools, cfg.resolved_batch(), order_gen, aug_gen,
                                  client_noise_for(cfg, client)))
        extra = s.algo.finish_client(ctx, local)
        if cfg.bn == "local":
            ctx.state["bn"] = _bn_buffers(local)
        if cfg.eval_local:
            local_accs.append(s.task.evaluate(local, s.data.test_x, s.data.test_y)["acc"])
        state = {k: v.detach().clone() for k, v in local.state_dict().items()}
        if rnd + 1 in cfg.save_local_models:
            _save_local(run.path, rnd + 1, client, state, global_state)
        results.append(ClientResult(client, state, len(pools[0]) if pools else 0, ctx.steps, extra))
        if bar is not None:
            bar.set_postfix_str(f"client {i + 1}/{len(selected)}")
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
    return client_noise(partition_config(cfg), client)


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
    loss = local_train(s.model, optimizer, s.algo, ctx, s.task, s.data.train_x, s.data.train_y,
                       [pool] * cfg.local_epochs, cfg.resolved_batch(), order_gen, aug_gen)
    return {"round": rnd + 1, "lr": lr, **_test_metrics(s), "train_loss": loss}


def run(cfg: FederateConfig, opts: RunOptions, data: ImageData | None = None) -> list[dict]:
    """Run (or resume) a simulation into ``opts.out``; returns all metrics rows. ``data`` replaces the
    configured dataset (tests). The run directory is locked for the whole run (:class:`RunDir`)."""
    device = resolve_device(opts.device)
    rundir = RunDir(opts.out)
    with rundir.session(opts.resume):  # before the (slow) data loading, and before anything is written
        if not opts.resume:
            check_init(cfg.arch, cfg.width, cfg.init, cfg.init_format)  # a bad --init fails before the data
        s = setup(cfg, device, data, load_init=not opts.resume)  # a resumed run's model is in state.pt
        return _rounds(s, cfg, opts, rundir, device)


def _rounds(s: Setup, cfg: FederateConfig, opts: RunOptions, rundir: RunDir,
            device: torch.device) -> list[dict]:
    config = {"federate": cfg.to_dict(), "algo": plain(vars(s.algo.cfg)),
              "init_sha256": init_sha256(cfg.init)}
    optimizer = make_optimizer(s.model, cfg.resolved_optimizer(), cfg.resolved_lr(), cfg.momentum,
                               cfg.weight_decay)
    if opts.resume:
        state = _load_resumable(rundir, config, cfg)
        s.model.load_state_dict(state["model"])
        s.algo.load_state_dict(state["algo"])
        if cfg.centralized:
            optimizer.load_state_dict(state["optimizer"])
        start, norm0 = int(state["done"]), float(state["norm0"])
    else:
        rundir.create(config, opts)
        start, norm0 = 0, param_norm(s.model)
    _write_partition(rundir.path, cfg, s)
    if opts.progress:
        tqdm.write(f"init: {s.init_report}")
    if cfg.centralized and type(s.algo) is not ALGORITHMS[cfg.algo]:
        print(f"federate: note: --centralized trains plain SGD on the pooled data; {cfg.algo}'s client and "
              f"server steps do not apply to it", file=sys.stderr)
    tracker = (Tracker(cfg.tracking, s.model, s.task, s.data, cfg.seed)
               if cfg.tracking.active and not cfg.centralized else None)
    bar = tqdm(total=cfg.rounds, initial=start, desc="centralised" if cfg.centralized else "rounds",
               unit="round", disable=not opts.progress, dynamic_ncols=True)
    for rnd in range(start, cfg.rounds):
        if opts.stop_after is not None and rnd - start >= opts.stop_after:
            break
        t0 = time.perf_counter()
        try:
            record = (centralized_round(s, cfg, rnd, device, optimizer) if cfg.centralized
                      else train_round(s, cfg, rnd, device, rundir, bar, tracker))
            record["weight_norm"] = param_norm(s.model)
            check_divergence(record, s.task.n_classes, norm0)
        except DivergenceError as exc:
            bar.close()
            kept = (f"the last good round ({rnd}) is kept in {rundir.path}" if rnd else
                    f"no round finished, so {rundir.path} is left as it was")
            raise DivergenceError(f"round {rnd + 1}: {exc}; {kept} (try a lower --lr)") from None
        record["seconds"] = time.perf_counter() - t0
        rundir.append_metrics(record)
        state = {"done": rnd + 1, "model": s.model.state_dict(), "algo": s.algo.state_dict(), "norm0": norm0}
        if cfg.centralized:
            state["optimizer"] = optimizer.state_dict()
        rundir.save_state(state)
        bar.set_postfix(acc=f"{record['test_acc']:.3f}")
        bar.update(1)
    bar.close()
    rows = rundir.metrics()
    if rows and rows[-1]["round"] == cfg.rounds:
        final = {"format": FINAL_FORMAT, "arch": cfg.arch, "width": cfg.width, "n_classes": s.task.n_classes,
                 "config": plain(config), "model": {k: v.cpu() for k, v in s.model.state_dict().items()}}
        atomic_save(final, rundir.path / "final.pt")
    return rows


def _load_resumable(rundir: RunDir, config: dict, cfg: FederateConfig) -> dict:
    """The saved state, once the settings match the saved ones. The --init path is not compared (the
    state holds the model): a moved init file resumes, a different file with the same name does not."""
    saved, mine = rundir.saved_config(), plain(config)
    for part in ("federate", "algo"):
        a, b = dict(saved.get(part) or {}), dict(mine[part])
        a.pop("init", None), b.pop("init", None)
        if a != b:
            changed = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            raise RunDirError(f"--resume: {', '.join(changed)} differ(s) from the run in "
                              f"{rundir.config_path}; resume with the same settings or start a new run")
    recorded, now = saved.get("init_sha256"), mine["init_sha256"]
    if recorded and now and recorded != now:
        raise RunDirError(f"--resume: --init {cfg.init} is not the file this run started from (its sha256 "
                          f"differs from the one in {rundir.config_path})")
    return rundir.load_state(config, compare=())


def param_norm(model: nn.Module) -> float:
    """The L2 norm of all trainable parameters (float64)."""
    return float(torch.sqrt(sum(p.detach().double().pow(2).sum() for p in model.parameters())))


def check_divergence(record: dict, n_classes: int, norm0: float) -> None:
    """A round diverged when its test loss is non-finite or DIVERGE_FACTOR times a uniform guess's
    (log C), or when the weights' norm is non-finite or DIVERGE_FACTOR times the initial norm: a loss that
    explodes can stay finite for many rounds (lr 50 on digits reached 1e20) and never recover."""
    uniform = math.log(max(n_classes, 2))
    loss, norm = record["test_loss"], record["weight_norm"]
    if not math.isfinite(loss) or loss > DIVERGE_FACTOR * uniform:
        raise DivergenceError(f"the test loss became {loss:.3g} (a uniform guess has {uniform:.2f}): the "
                              f"training diverged")
    if not math.isfinite(norm) or norm > DIVERGE_FACTOR * norm0:
        raise DivergenceError(f"the weight norm became {norm:.3g}, {norm / norm0:.0f}x its initial "
                              f"{norm0:.3g}: the training diverged")


def _write_partition(run_dir: Path, cfg: FederateConfig, s: Setup) -> None:
    parts = [p.numpy() for p in s.parts]
    labels = s.task.sample_labels(s.data.train_y.cpu()).numpy()  # one class per sample (segmentation too)
    write_partition_report(run_dir, parts, labels, s.data.n_classes, partition_config(cfg))
