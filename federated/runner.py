"""A federated run from start to finish, or resumed (Chen et al., ICLR 2023, §4.2-4.4).

After every round a metrics line and the round state (global model + algorithm state) are written, so a
killed run continues with ``--resume`` and ends with the same metrics; the run directory is locked for the
whole run (:class:`fpsfl.base.rundir.RunDir`), and a round whose loss or weights explode stops it.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable

import torch
from torch import nn
from tqdm import tqdm

from fpsfl.base.checkpoint import atomic_save, load_weights_only, plain
from fpsfl.base.device import resolve_device
from fpsfl.base.graphs import capture_for
from fpsfl.base.rundir import RunDir, RunDirError

from .centralised import Centralised
from .datasets import DATASETS, ImageData
from .experiment import FederateConfig, RunOptions, typed_record
from .initialisation import (
    InitSource,
    check_init,
    check_partition,
    check_partition_indices,
    init_sha256,
    init_warning,
    pretraining_size,
    resolve_init,
)
from .local import DivergenceError
from .loop import check_resume, run_rounds
from .partitions.report import check_partition_report
from .rounds import Dispatch, Federated, check_client_batch
from .setup import Setup, setup, write_partition
from .shards import partition_settings

FINAL_FORMAT = "fpsfl-federated/1"
DIVERGE_FACTOR = 100.0  # see check_divergence


# An engine's host runs the round loop ``rounds(dispatch)`` its own way (a Flower ServerApp in Flower's
# simulation runtime or on a SuperLink's Grid) and returns its metrics rows; it gets the resolved config.
# The engine is chosen at the top (federate's CLI, the Flower app): this module never imports it.
Host = Callable[[FederateConfig, Callable[[Dispatch | None], list[dict]]], list[dict]]


def run(cfg: FederateConfig, opts: RunOptions, data: ImageData | None = None,
        host: Host | None = None) -> list[dict]:
    """Run (or resume) a simulation into ``opts.out``; returns all metrics rows. ``data`` replaces the
    configured dataset (tests). The run directory is locked for the whole run (:class:`RunDir`).
    ``host`` runs the rounds for another engine (``opts.engine`` flower: :func:`federated.flower.run`)."""
    if opts.engine != "inprocess" and host is None:
        raise ValueError(f"--engine {opts.engine} runs through its own front door (federate's CLI, or "
                         f"federated.flower.run), not federated.runner.run")
    device = resolve_device(opts.device)
    if opts.engine == "inprocess":
        check_client_batch(cfg, device)  # before anything is written
    capture = capture_for(device) if opts.cuda_graph else None  # a CUDA device
    if capture is not None and opts.engine != "inprocess":
        raise ValueError(f"--cuda-graph runs with --engine inprocess, not {opts.engine}")
    rundir = RunDir(opts.out, opts.tensorboard)
    with rundir.session(opts.resume):  # before the (slow) data loading, and before anything is written
        resume = opts.resume and rundir.has_state()  # else a --resume starts a run killed before its state
        if opts.resume:
            cfg = _as_started(cfg, rundir)
        source = None  # --init, opened once here and passed down (a resumed run's model is in state.pt)
        if resume:
            _check_engine(rundir, opts.engine, cfg.algo)
        else:
            source = resolve_init(cfg.init, cfg.init_format, cfg.arch)
            check_init(cfg.arch, cfg.width, source)  # a bad --init fails before the data
            check_partition(source, cfg.init_format, partition_settings(cfg))
            cfg, size_note = _input_size(cfg, source)
            if size_note and opts.progress:
                tqdm.write(size_note)
        s = setup(cfg, device, data, load_init=not resume, init=source)
        s.compile = opts.compile and opts.engine == "inprocess"
        s.capture = capture
        if source is not None:  # a self-pre-trained --init must have seen these very client samples
            check_partition_indices(source, cfg.init_format, [p.numpy() for p in s.parts])
        if host is not None:
            return host(cfg, lambda dispatch: _rounds(s, cfg, opts, rundir, device, dispatch, source))
        return _rounds(s, cfg, opts, rundir, device, source=source)


def _input_size(cfg: FederateConfig, source: InitSource) -> tuple[FederateConfig, str]:
    """Without --input-size, a classification run from a pretrain checkpoint sees the size the checkpoint
    was pre-trained at (a 32 px checkpoint on a folder of 32 px images trained at 224 px, 49x the work)."""
    if cfg.input_size is not None or DATASETS[cfg.dataset].task != "classification":
        return cfg, ""
    size = pretraining_size(source)
    if size is None:
        return cfg, ""
    return (dataclasses.replace(cfg, input_size=size),
            f"input {size} px: the size {cfg.init} was pre-trained at (--input-size to change it)")


def _as_started(cfg: FederateConfig, rundir: RunDir) -> FederateConfig:
    """The config of a resumed run with the input size it started with when none is given now (it may
    have come from the --init checkpoint, which need not be there any more)."""
    saved = rundir.saved_config().get("federate", {})
    if cfg.input_size is None and saved.get("input_size") is not None:
        return dataclasses.replace(cfg, input_size=int(saved["input_size"]))
    return cfg


def _rounds(s: Setup, cfg: FederateConfig, opts: RunOptions, rundir: RunDir, device: torch.device,
            dispatch: Dispatch | None = None, source: InitSource | None = None) -> list[dict]:
    digest = source.sha256 if source is not None else init_sha256(cfg.init)  # resumed: the file may be gone
    config = {"federate": cfg.to_dict(), "algo": plain(vars(s.algo.cfg)), "init_sha256": digest,
              "engine": opts.engine}
    training = Centralised(s, cfg, device) if cfg.centralized else Federated(s, cfg, device, rundir, dispatch)
    if rundir.has_state():  # (a --resume: a new run refuses a directory with a state)
        _check_settings(rundir, config, cfg)
        state = rundir.load_state(config, compare=())
        check_partition_report(rundir.path, [p.numpy() for p in s.parts])
        s.model.load_state_dict(state["model"])
        s.algo.load_state_dict(state["algo"])
        training.load_extra_state(state)
        start, norm0 = int(state["done"]), float(state["norm0"])
    else:
        if opts.resume:  # killed before its first state: started again once the settings match
            _check_settings(rundir, config, cfg)
            rundir.start_again(config, compare=())
        rundir.create(config, opts)
        start, norm0 = 0, param_norm(s.model)
    write_partition(rundir.path, cfg, s)
    if opts.progress:
        tqdm.write(f"init: {s.init_report}")
    if start == 0 and (warning := init_warning(source or cfg.init, cfg.init_format)):
        print(f"federate: warning: {warning}", file=sys.stderr)
    for note in training.notes(opts.engine):
        print(f"federate: note: {note}", file=sys.stderr)
    work = _Supervised(training, s, cfg, rundir, norm0, config)
    return run_rounds(work, start, rundir, progress=opts.progress, log_rounds=opts.log_rounds,
                      stop_after=opts.stop_after)


class _Supervised:
    """A supervised run's rounds for :func:`federated.loop.run_rounds`: ``training`` (the federated rounds
    or the centralised baseline's epochs), then the divergence check on the test loss and weight norm."""

    def __init__(self, training: Federated | Centralised, s: Setup, cfg: FederateConfig, rundir: RunDir,
                 norm0: float, config: dict):
        self.training, self.s, self.cfg, self.rundir, self.norm0, self.config = (
            training, s, cfg, rundir, norm0, config)
        self.desc, self.rounds, self.last_round = training.desc, range(cfg.rounds), cfg.rounds

    def round(self, rnd: int, bar: tqdm) -> dict:
        record = self.training.round(rnd, bar)
        record["weight_norm"] = param_norm(self.s.model)
        check_divergence(record, self.s.task.n_classes, self.norm0)
        return record

    def state(self, rnd: int) -> dict:
        return {"done": rnd + 1, "model": self.s.model.state_dict(), "algo": self.s.algo.state_dict(),
                "norm0": self.norm0, **self.training.extra_state()}

    def diverged(self, rnd: int, exc: DivergenceError) -> str:
        kept = (f"the last good round ({rnd}) is kept in {self.rundir.path}" if rnd else
                f"no round finished, so {self.rundir.path} is left as it was")
        return f"round {rnd + 1}: {exc}; {kept} (try a lower --lr)"

    def line(self, record: dict) -> str:
        return round_line(record, self.cfg.rounds)

    def postfix(self, record: dict) -> dict[str, str]:
        return {"acc": f"{record['test_acc']:.3f}"}

    def finish(self) -> None:
        cfg, model, n_classes = self.cfg, self.s.model, self.s.task.n_classes
        final = {"format": FINAL_FORMAT, "arch": cfg.arch, "width": cfg.width, "n_classes": n_classes,
                 "config": plain(self.config), "model": {k: v.cpu() for k, v in model.state_dict().items()}}
        atomic_save(final, self.rundir.path / "final.pt")


def _check_settings(rundir: RunDir, config: dict, cfg: FederateConfig) -> None:
    """Refuse a --resume with other federate or algorithm settings than the saved run's."""
    check_resume(rundir, config, ("federate", "algo"), cfg.init, typed={"federate": typed_record})


def _check_engine(rundir: RunDir, engine: str, algo: str) -> None:
    """Refuse (one line) to resume with another engine a run whose clients hold state: the in-process
    engine keeps it in state.pt, Flower's in the nodes' Contexts, and neither can take over the other's (the
    clients would restart from zero without a word). Without client state the engines give the same run."""
    before = rundir.saved_config().get("engine", "inprocess")  # runs from before the engine was recorded
    if before == engine:
        return
    state = load_weights_only(rundir.state_path, "run state (state.pt)", RunDirError)
    if any(state.get("algo", {}).get("clients", [])):
        where = "their nodes' Flower Contexts" if before == "flower" else rundir.state_path.name
        raise RunDirError(f"--resume: this run started with --engine {before}, and its clients' {algo} state "
                          f"lives in {where}, which --engine {engine} cannot take over; resume with "
                          f"--engine {before}")


def round_line(record: dict, rounds: int) -> str:
    """One round's metrics as one line (a run without a progress bar prints one per round)."""
    missing = record.get("missing_clients")
    gone = f" (missing {', '.join(map(str, missing))})" if missing else ""
    return (f"federate: round {record['round']}/{rounds}: test_acc {record['test_acc']:.4f}, train_loss "
            f"{record['train_loss']:.4f}, {len(record.get('clients', []))} clients{gone}, "
            f"{record['seconds']:.1f} s")


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
