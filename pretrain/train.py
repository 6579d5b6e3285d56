"""The pre-training loop (Chen et al., ICLR 2023, §4.2 and Appendix A.2).

SGD with momentum, a learning rate set once an epoch (cosine or constant, :mod:`pretrain.schedules`; groups
marked ``fixed_lr`` keep their rate, as SimSiam's predictor), image-level augmentation on the training device,
optional bf16 autocast and channels-last on CUDA, optionally (``--compile``) a torch.compiled step and
(``--cuda-graph``, :mod:`pretrain.graphed`) the whole step replayed as one CUDA graph. After every epoch it
appends a line to ``metrics.jsonl``, writes the backbone checkpoint and then the training state (``state.pt``:
weights, optimiser, memory bank, CPU and CUDA RNG states), each atomically, so a crash loses at most the epoch
in progress and ``--resume`` continues where it stopped, bit for bit on CPU (``tests/test_crash_points.py``
kills a run at each of its writes).

Under ``torchrun`` (:mod:`pretrain.distributed`) the method is wrapped in DistributedDataParallel and each
process trains on its rows of every global batch (``--batch-size`` stays the global batch). Identical for
any number of processes: the pairs of every global batch and each sample's augmentation (each process draws
the whole batch's augmentation randomness and keeps its rows), the learning rate, and the initial weights.
The loss logged is the all-reduced mean of the processes' losses, i.e. the global batch's. With SimSiam's
synchronised BatchNorm the losses and weights equal one process's up to rounding (summation order in BN and
in DDP's gradient average): ~1e-13 in float64, but in float32 SimSiam amplifies rounding at initialisation
and runs drift apart by a few per cent within epochs, as one process with 1 and with 2 threads does. Not
identical: MoCo-v2's BatchNorm is per process and shuffled (by design), so its keys and losses differ;
``z_std`` is the mean of the processes' values. Only rank 0 writes the run directory and the checkpoint,
probes and prints; ``--resume`` loads the state on rank 0, which broadcasts it to the others.

Elastic runs: under torchrun ``--resume`` defaults to ``auto``, so a job that ``--max-restarts`` relaunches
after a rank died continues from the last finished epoch (and its first launch starts the run). A restart
may put rank 0 on another node, so every rank checks that it sees rank 0's ``config.json``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from contextlib import ExitStack
from dataclasses import asdict

import torch
from tqdm import tqdm

from fpsfl.base.checkpoint import atomic_save, make_checkpoint, plain, save_checkpoint
from fpsfl.base.rundir import RunDir
from fpsfl.base.seeds import seed_of
from fractals.stream import draw_views

from . import distributed
from .backbones import create_backbone
from .compiled import COMPILE_BACKEND_ENV, compile_augment, compile_step  # noqa: F401 (re-exported)
from .graphed import Step, capture_for, make_step
from .methods import METHODS, Method
from .probe import PROBES, probe
from .rankme import FALL_EPOCHS, RANK_PAIRS, RankWatch, falling
from .recipe import PretrainConfig, RunOptions
from .schedules import LR_SCHEDULES, cosine_lr, warmup  # noqa: F401 (cosine_lr re-exported)
from .session import check_shared, lock_run, start_run
from .signals import deepest_stage, flat, scale_weights, stage_of, summary, verdict, weight_drift
from .sources import SOURCES

_NAN_CHECK_EVERY = 16  # steps between finiteness checks (each one synchronises a GPU)
_ONE = distributed.Dist()  # a single process
# the epoch's signals a checkpoint carries beside its drift (``ckpt["signals"]``)
SIGNAL_KEYS = ("loss", "z_std", "rankme", "rankme_init", "probe_knn_acc", "probe_linear_acc",
               "probe_init_knn_acc")
# Tests only: train in float64, where 1 and N processes agree to ~1e-12. In float32 SimSiam's early-layer
# gradients at initialisation carry ~2% rounding noise (float32 vs float64), so two summation orders (two
# processes, or one process with two threads) drift apart by a few per cent over a few steps.
FLOAT64_ENV = "FPSFL_TEST_FLOAT64"
# Tests only: "R:E:S" SIGKILLs rank R after step S of epoch E (1-based) in torchrun's first launch, as a
# preempted node would; the restart (TORCHELASTIC_RESTART_COUNT > 0) runs on.
KILL_ENV = "FPSFL_TEST_KILL"


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. the loss diverged); the message says what to do."""


def default_workers(device: torch.device, local_processes: int = 1) -> int:
    """No workers on CPU (the model is the bottleneck); on a GPU, enough renderer processes to feed it, the
    node's cores shared among its ``local_processes`` training processes (torchrun)."""
    return 0 if device.type == "cpu" else max(1, min(8, ((os.cpu_count() or 2) - 2) // local_processes))


def epoch_seed(seed: int, epoch: int) -> int:
    """Seed of the epoch's augmentation generator, independent of every other stream."""
    return seed_of(seed, epoch, 0xA06)


def build_method(cfg: PretrainConfig, n_classes: int | None, device: torch.device) -> Method:
    torch.manual_seed(cfg.seed)  # the same seed gives the same initial weights (and MoCo bank)
    backbone = create_backbone(cfg.arch, cfg.width)
    if cfg.init_scale != 1:
        scale_weights(backbone, cfg.init_scale)
    mcfg = cfg.method_config().resolve(backbone.feature_dim, cfg.size)  # head sizes depend on f and size
    method = METHODS[cfg.method](backbone, mcfg, n_classes)
    return method.to(device)


def make_optimizer(method: Method, cfg: PretrainConfig) -> tuple[torch.optim.SGD, float]:
    """SGD over the method's groups; the base lr is per 256 samples, scaled linearly with the batch."""
    mcfg = method.cfg
    lr = mcfg.lr * cfg.batch_size / 256
    groups = [dict(g, lr=lr, lr_scale=1.0) for g in method.param_groups()]
    if mcfg.last_stage_lr != 1:
        groups = _split_last_stage(groups, method.backbone, mcfg.last_stage_lr)
    for g in groups:
        g["lr"] = lr * g["lr_scale"]
    return torch.optim.SGD(groups, lr=lr, momentum=mcfg.momentum, weight_decay=mcfg.weight_decay), lr


def _split_last_stage(groups: list[dict], backbone: torch.nn.Module, scale: float) -> list[dict]:
    """``groups`` with the backbone's deepest stage moved out of each into a group of its own whose rate is
    ``scale`` times the schedule's (``last_stage_lr``); the first group stays first (the logged rate)."""
    named = list(backbone.named_parameters())
    stage = deepest_stage([n for n, _ in named], [p for _, p in named])
    deep = {id(p) for n, p in named if stage_of(n) == stage}
    out, split = [], []
    for g in groups:
        rest = [p for p in g["params"] if id(p) not in deep]
        mine = [p for p in g["params"] if id(p) in deep]
        out.append(dict(g, params=rest))
        if mine:
            split.append(dict(g, params=mine, lr_scale=g["lr_scale"] * scale))
    return [g for g in out if g["params"]] + split


def set_lr(optimizer: torch.optim.Optimizer, base: float, epoch: int, epochs: int,
           schedule: str = "cosine") -> float:
    """Set the rate of ``epoch`` under ``schedule`` (:data:`pretrain.schedules.LR_SCHEDULES`) on every group
    but the ``fixed_lr`` ones, which keep ``base``; returns it."""
    lr = LR_SCHEDULES[schedule](base, epoch, epochs)
    for group in optimizer.param_groups:
        group["lr"] = (base if group["fixed_lr"] else lr) * group.get("lr_scale", 1.0)
    return lr


def warm_lr(optimizer: torch.optim.Optimizer, epoch_lrs: list[float], factor: float) -> None:
    """Scale the epoch's rates by the warm-up's ``factor`` on every group but the ``fixed_lr`` ones."""
    for group, lr in zip(optimizer.param_groups, epoch_lrs, strict=True):
        group["lr"] = lr if group["fixed_lr"] else lr * factor


class _Clock:
    """Accumulates seconds per phase; with ``sync`` it waits for the GPU so each phase gets its own time."""

    def __init__(self, device: torch.device, sync: bool):
        self.sync = sync and device.type == "cuda"
        self.totals: dict[str, float] = {}
        self.t = time.perf_counter()

    def lap(self, phase: str) -> None:
        if self.sync:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.totals[phase] = self.totals.get(phase, 0.0) + now - self.t
        self.t = now


def run_epoch(method: Method, source, optimizer, cfg: PretrainConfig, epoch: int, device: torch.device,
              opts: RunOptions, model: torch.nn.Module | None = None,
              d: distributed.Dist = _ONE, applier=None, step: Step | None = None) -> dict:
    """One pass over the source; returns the epoch's metrics. ``model`` is the method or its DDP wrapper,
    either maybe compiled (:func:`compile_step`); ``method`` is the eager module underneath; ``applier``
    makes the views from their draws (None: eager; :func:`compile_augment`); ``step`` trains on a batch
    (None: the eager :class:`Step` of ``model``; the run passes its own, maybe a CUDA graph's)."""
    if step is None:
        model = method if model is None else model
        step = make_step(method, model, optimizer, device, cfg.amp, False, applier)
    step.begin_epoch()
    method.train()
    gen = torch.Generator(device=device).manual_seed(epoch_seed(cfg.seed, epoch))
    steps = samples = 0
    bar = tqdm(total=len(source), desc=f"epoch {epoch + 1}/{cfg.epochs}", unit="step", leave=False,
               disable=not (opts.progress and d.main), dynamic_ncols=True)
    start = time.perf_counter()
    clock = _Clock(device, opts.profile)
    warm, epoch_lrs = method.cfg.warmup_epochs, [g["lr"] for g in optimizer.param_groups]
    for batch in source.batches(epoch):
        if epoch < warm:  # set every step (a captured graph reads the rate from the device: one capture)
            warm_lr(optimizer, epoch_lrs, warmup(epoch + (steps + 1) / len(source), warm))
        images = batch["images"].to(device, non_blocking=True)
        labels = batch["labels"].to(device, non_blocking=True) if "labels" in batch else None
        clock.lap("data_wait")
        mine, n = images.shape[1], images.shape[1] * d.world  # this process's rows of a global batch of n
        draws = draw_views(images, method.n_views, method.augment, gen, (d.rank * mine, n))
        step(images, draws, labels, clock.lap)  # the views, then the training step
        clock.lap("compute")
        steps, samples = steps + 1, samples + n
        _test_kill(d, epoch, steps)
        if steps % _NAN_CHECK_EVERY == 0 or steps == len(source):
            total = distributed.mean(step.loss_sum)  # every process checks the same value: they stop together
            if not torch.isfinite(total):
                bar.close()
                kept = (f"the last finished epoch ({epoch}) is kept in {opts.run_dir}" if epoch else
                        "no epoch finished, so nothing was kept")
                raise distributed.fail(d, TrainingError(
                    f"the loss became non-finite in epoch {epoch + 1} (near step {steps}); {kept} "
                    f"(try a lower --lr)"), 1)
            bar.set_postfix(loss=f"{total.item() / steps:.4f}",
                            pairs_s=f"{samples / (time.perf_counter() - start):.0f}")
        bar.update(1)
    bar.close()
    seconds = time.perf_counter() - start
    busy = sum(clock.totals.values()) or 1.0
    loss_sum = step.loss_sum if step.loss_sum is not None else torch.zeros((), device=device)
    record = {"epoch": epoch + 1, "loss": distributed.mean(loss_sum).item() / max(steps, 1), "steps": steps,
              "pairs_per_s": samples / seconds, "seconds": seconds,
              "data_wait": clock.totals.get("data_wait", 0.0) / busy}
    if d.world > 1:
        record["world_size"] = d.world
    if opts.profile:
        record["augment_frac"] = clock.totals.get("augment", 0.0) / busy
        record["compute_frac"] = clock.totals.get("compute", 0.0) / busy
    record.update({k: float(distributed.mean(v)) / max(steps, 1) for k, v in step.stat_sums.items()})
    return record


def _test_kill(d: distributed.Dist, epoch: int, step: int) -> None:
    """The test hook of ``FPSFL_TEST_KILL`` (see :data:`KILL_ENV`)."""
    hook = os.environ.get(KILL_ENV)
    if hook and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        if tuple(int(x) for x in hook.split(":")) == (d.rank, epoch + 1, step):
            os.kill(os.getpid(), signal.SIGKILL)


def rng_states() -> dict:
    """The random states a resume needs: the CPU's and, once CUDA is in use, every CUDA device's. An unused
    CUDA is not initialised just to read it. Under torchrun these are rank 0's (it alone saves), which is
    enough: the one draw from a device's generator, MoCo's batch shuffle, is made on rank 0 and broadcast
    (lightly's ``batch_shuffle_distributed``); augmentation draws from its own per-epoch generators."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []
    return {"rng": torch.get_rng_state(), "cuda_rng": cuda}


def set_rng_states(state: dict) -> None:
    """Restore :func:`rng_states`. CUDA states are restored where CUDA is present (states of older runs
    have none; a GPU run resumed on a CPU-only machine has nothing to restore them to)."""
    torch.set_rng_state(state["rng"])
    cuda = state.get("cuda_rng") or []
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[:torch.cuda.device_count()])


def restore(state: dict, method: Method, optimizer: torch.optim.Optimizer) -> int:
    """Restore weights, memory bank, optimiser and RNG from a saved state; returns the next epoch."""
    method.load_state_dict(state["model"])
    method.load_extra_state(state["extra"])
    optimizer.load_state_dict(state["optimizer"])
    set_rng_states(state)
    return int(state["done"])


def train(cfg: PretrainConfig, opts: RunOptions) -> dict:
    """Run (or resume) pre-training; returns the last epoch's metrics. Writes the run dir and ``opts.out``
    (rank 0 only under torchrun)."""
    d = distributed.from_env()
    device = distributed.device_for(opts.device, d)
    workers = default_workers(device, d.local_world) if opts.workers is None else opts.workers
    check_world(cfg, d)
    if opts.cuda_graph:
        capture_for(device)  # a CUDA device
        if d.world > 1:
            raise distributed.fail(d, ValueError(f"--cuda-graph runs in one process, not {d.world} (DDP's "
                                                 f"collectives are not captured)"), 2)
    distributed.init(d, device, opts.dist_timeout)
    run = RunDir(opts.run_dir, opts.tensorboard)  # only rank 0 writes it
    mode = opts.resume or ("auto" if distributed.under_torchrun() else "no")
    try:
        with ExitStack() as stack:  # rank 0 holds the run directory's session until the run ends
            resume = distributed.from_main(d, lambda: lock_run(run, mode, opts, stack))
            return _train(cfg, opts, d, device, workers, run, resume)
    finally:
        distributed.shutdown()


def check_world(cfg: PretrainConfig, d: distributed.Dist) -> None:
    """One-line errors for a run that cannot be split over the processes (every rank finds the same)."""
    if d.world == 1:
        return
    # the fractal sources' last batch may be short; a folder's is dropped (FolderConfig.drop_last)
    last = cfg.pairs_per_epoch % cfg.batch_size if SOURCES[cfg.source].rendered else 0
    problem = None
    if cfg.batch_size % d.world:
        problem = f"--batch-size {cfg.batch_size} (global) must be a multiple of the {d.world} processes"
    elif last % d.world:
        problem = (f"--pairs-per-epoch {cfg.pairs_per_epoch} leaves a last batch of {last}, not divisible by "
                   f"the {d.world} processes; make it a multiple of {d.world}")
    if problem:
        raise distributed.fail(d, ValueError(problem), 2)


def _train(cfg: PretrainConfig, opts: RunOptions, d: distributed.Dist, device: torch.device, workers: int,
           run: RunDir, resume: bool) -> dict:
    try:  # every rank scans the folder (or bank): each finds the same problem, rank 0 reports it
        source = SOURCES[cfg.source].make(cfg, workers, device)
    except ValueError as exc:
        raise distributed.fail(d, exc, 2) from None
    if d.world > 1:
        source.shard(d.rank, d.world)
    method = build_method(cfg, source.n_classes, device)
    # the initial weights, kept to measure how far each stage moves (issue 38); a resumed run rebuilds
    # them from the seed before its state replaces them
    init = {k: v.detach().cpu().clone() for k, v in method.kept_backbone().state_dict().items()}
    if d.world > 1 and method.sync_bn:
        method = distributed.sync_batchnorm(method, device)
    # channels-last on every device: the layout of GPU tensor cores, and ~20% faster ResNet20 steps on CPU
    method = method.to(memory_format=torch.channels_last)
    if os.environ.get(FLOAT64_ENV):
        method = method.double()
    optimizer, base_lr = make_optimizer(method, cfg)
    config = {"pretrain": cfg.to_dict(), "method": asdict(method.cfg), "base_lr": base_lr,
              "steps_per_epoch": len(source), "n_classes": source.n_classes,
              "data": source.fingerprint() if d.main else {}}
    state = distributed.from_main(d, lambda: start_run(run, resume, opts, config, d.world))
    check_shared(run, d)
    start = restore(state, method, optimizer) if state is not None else 0
    model = distributed.wrap(method, device)
    applier = None
    if opts.compile:  # the step's forward, loss and backward; ``method`` stays the eager module it updates
        model, applier = compile_step(model, device), compile_augment(device)
    step = make_step(method, model, optimizer, device, cfg.amp, opts.cuda_graph, applier)
    probe_data = PROBES[opts.probe]() if opts.probe and d.main else None
    initial = _probe(method, probe_data, cfg, "init") if probe_data is not None and start == 0 else {}
    watch = _rank_watch(source, method, device) if d.main else None
    if watch is not None and start == 0:
        initial["rankme_init"] = watch.measure(method.kept_backbone())
    last: dict = run.last_metrics() if d.main else {}
    for epoch in range(start, cfg.epochs):
        if opts.stop_after is not None and epoch - start >= opts.stop_after:
            break
        set_lr(optimizer, base_lr, epoch, cfg.epochs, method.cfg.lr_schedule)
        record = {**run_epoch(method, source, optimizer, cfg, epoch, device, opts, model, d, step=step),
                  "lr": optimizer.param_groups[0]["lr"], **initial}  # the last step's (group 0: scheduled)
        initial = {}
        if probe_data is not None and ((epoch + 1) % opts.probe_every == 0 or epoch + 1 == cfg.epochs):
            record.update(_probe(method, probe_data, cfg))
        drift = weight_drift(init, method.kept_backbone().state_dict())
        record.update(flat(drift))
        if watch is not None:
            record["rankme"] = watch.measure(method.kept_backbone())
            if falling(watch.history) and not falling(watch.history[:-1]) and opts.progress:
                first, now = watch.history[-FALL_EPOCHS - 1], watch.history[-1]
                tqdm.write(f"note: RankMe fell in each of the last {FALL_EPOCHS} epochs ({first:.1f} -> "
                           f"{now:.1f}): the features may be collapsing; training goes on")
        if d.main:
            _save(run, record, method, optimizer, cfg, config, opts, epoch, drift)
        last = record
        if opts.progress and d.main:
            tqdm.write(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in record.items()}))
    if d.main and opts.progress:
        _tell_drift(weight_drift(init, method.kept_backbone().state_dict()))
    return last


def _tell_drift(drift: dict) -> None:
    """The run's last word on its backbone: cosine to init per stage and, if it barely moved, the verdict."""
    tqdm.write(f"cosine to init (norm ratio) per stage: {summary(drift)}")
    line = verdict(drift)
    if line:
        tqdm.write(f"warning: this checkpoint is {line}")


def _save(run: RunDir, record: dict, method: Method, optimizer: torch.optim.Optimizer, cfg: PretrainConfig,
          config: dict, opts: RunOptions, epoch: int, drift: dict) -> None:
    """The epoch's metrics line, backbone checkpoints and training state, in that order: the state marks
    the epoch done, so it is written last, once everything of the epoch is on disk (a crash before it
    repeats the epoch on --resume). The SyncBatchNorm of a multi-process run has BatchNorm's state_dict
    keys, so its checkpoint loads as one from a single process."""
    run.append_metrics(record)
    ckpt = make_checkpoint(method.kept_backbone(), arch=cfg.arch, width=cfg.width, method=cfg.method,
                           source=cfg.source, epoch=epoch + 1, config=config)
    ckpt["signals"] = {"drift": drift, "init": f"seed {cfg.seed}",
                       **{k: v for k, v in record.items() if k in SIGNAL_KEYS}}
    save_checkpoint(ckpt, opts.out)
    if opts.keep_every and (epoch + 1) % opts.keep_every == 0:
        save_checkpoint(ckpt, kept_path(opts.out, epoch + 1))
    run.save_state({"done": epoch + 1, "model": method.state_dict(), "extra": method.extra_state(),
                    "optimizer": optimizer.state_dict(), **rng_states()})


def kept_path(out, epoch: int):
    """Where ``--keep-every`` keeps the checkpoint of ``epoch``: fps.ckpt -> fps.e0004.ckpt."""
    return out.with_name(f"{out.stem}.e{epoch:04d}{out.suffix}")


def _rank_watch(source, method: Method, device: torch.device) -> RankWatch | None:
    """RankMe's held-out views, for the sources that can render a held-out batch (the fractal ones)."""
    if not hasattr(source, "held_out"):
        return None
    return RankWatch(source.held_out(RANK_PAIRS), method.n_views, method.augment, device)


def _probe(method: Method, data, cfg: PretrainConfig, prefix: str = "") -> dict:
    """The kNN probe of the backbone, as metrics.jsonl keys (``probe_knn_acc``, ``probe_init_knn_acc``)."""
    acc = probe(method.kept_backbone(), data, cfg.size, linear=False)["knn_acc"]
    return {f"probe_{prefix}_knn_acc" if prefix else "probe_knn_acc": acc}


__all__ = ["TrainingError", "atomic_save", "cosine_lr", "plain", "train"]
