"""A self-pre-training run from start to finish, or resumed (Chen et al., ICLR 2023, §5 and App. B.3).

The clients' data and partition are supervised ``federate``'s (:func:`federated.setup.partitioned`: the
labels are read to draw the partition and to write its report, never for training). After every round a
metrics line and the global model are written to the run directory (:class:`fpsfl.base.rundir.RunDir`), so
a killed run continues with ``--resume`` and, on a CPU, ends with the same checkpoint bit for bit: every
draw of a round comes from (seed, round, client). After the last round the online backbone is written as an
``fpsfl-backbone/1`` checkpoint whose config records the partition (its settings and the sha256 of the
clients' sample indices); ``federate --init`` refuses it for another partition.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from fpsfl.base.checkpoint import make_checkpoint, plain, save_checkpoint
from fpsfl.base.device import resolve_device
from fpsfl.base.rundir import RunDir, RunDirError, lock_out
from pretrain.backbones import create_backbone

from ..datasets import ImageData
from ..experiment import FederateConfig, flat_settings
from ..initialisation import check_init, init_sha256, initialise, resolve_init
from ..local import DivergenceError
from ..loop import check_resume, run_rounds
from ..partitions import indices_sha256, write_partition_report
from ..setup import partitioned
from ..shards import partition_settings
from . import FED_SSL
from .config import DATA_FIELDS, SelfPretrainConfig, SelfPretrainOptions
from .rounds import Dispatch, InProcess, aggregate, round_stats, select_clients

# An engine's host runs the round loop ``rounds(dispatch)`` its own way (a Flower ServerApp) and returns its
# metrics rows, as federated.runner.Host does for supervised runs.
Host = Callable[[Callable[[Dispatch | None], list[dict]]], list[dict]]


def data_config(fed: FederateConfig) -> dict:
    """The part of ``fed`` self-pre-training reads (:data:`DATA_FIELDS` and the partitions' and datasets'
    settings, flat)."""
    full, tables = fed.to_dict(), flat_settings()  # the tables (in DATA_FIELDS) are flat in to_dict
    flat = (k for table in tables for k in getattr(fed, table))
    return {k: full[k] for k in (*DATA_FIELDS, *flat) if k not in tables}


def run(fed: FederateConfig, sp: SelfPretrainConfig, opts: SelfPretrainOptions, data: ImageData | None = None,
        host: Host | None = None) -> list[dict]:
    """Run (or resume) self-pre-training into ``opts.run_dir`` and write ``opts.out`` after the last round;
    returns the metrics rows. ``data`` replaces the configured dataset (tests)."""
    device = resolve_device(opts.device)
    method = FED_SSL[sp.algo](sp.method_config(fed.preset()))
    rundir = RunDir(opts.run_dir, opts.tensorboard)
    if not opts.resume and Path(opts.out).exists():  # a finished run's checkpoint, or anyone's (issue 42)
        held = "pass --resume to continue its run, or " if rundir.has_state() else ""
        raise RunDirError(f"--out {opts.out} already exists and is not overwritten; {held}choose another "
                          f"--out")
    with lock_out(Path(opts.out)), rundir.session(opts.resume):  # --out's lock clears a killed write's file
        resume = opts.resume and rundir.has_state()  # else a --resume starts a run killed before its state
        source = None if resume else resolve_init(fed.init, fed.init_format, fed.arch)  # opened once
        if source is not None:
            check_init(fed.arch, fed.width, source)  # before the (slow) data loading
        data, _, parts = partitioned(fed, data)
        if data.task != "classification" or data.train_x.shape[1] != data.train_x.shape[2]:
            raise ValueError(f"self-pretrain needs a dataset of square images (classification); "
                             f"{fed.dataset} is {data.task} (Chen et al., App. B.3: Orchestra did not scale "
                             f"to Cityscapes)")
        size = fed.input_size or data.input_size
        parts = [torch.as_tensor(p, dtype=torch.long) for p in parts]
        torch.manual_seed(fed.seed)
        backbone = create_backbone(fed.arch, fed.width)
        report = (initialise(backbone, fed.arch, fed.width, source) if source is not None
                  else f"resumed from the run's state ({fed.init} at the start)")
        model = method.build(backbone, size).to(device, memory_format=torch.channels_last)
        config = {"self_pretrain": sp.to_dict(), "method": plain(vars(method.cfg)),
                  "federate": data_config(fed), "input_size": size,
                  "init_sha256": source.sha256 if source is not None else init_sha256(fed.init),
                  "partition": {"settings": partition_settings(fed), "indices_sha256": indices_sha256(
                      [p.numpy() for p in parts]), "sizes": [len(p) for p in parts]}}
        if resume:
            _check_settings(rundir, config, fed.init)
            state = rundir.load_state(config, compare=())
            model.load_state_dict(state["model"])
            start = int(state["done"]) + 1
        else:
            if opts.resume:  # killed in its first round: started again once the settings match (issue 42)
                _check_settings(rundir, config, fed.init)
                rundir.start_again(config, compare=())
            rundir.create(config, opts)
            start = 1 - method.warmup_rounds
        write_partition_report(rundir.path, [p.numpy() for p in parts], data.train_y.numpy(), data.n_classes,
                               fed.partition_config())
        if opts.progress:
            tqdm.write(f"init: {report}")
        images = data.train_x.to(device)  # the labels stay behind
        del data

        def rounds(dispatch: Dispatch | None) -> list[dict]:
            return _rounds(method, model, fed, sp, opts, rundir, images, parts, size, start, config, dispatch)

        return host(rounds) if host is not None else rounds(None)


def _rounds(method, model, fed: FederateConfig, sp: SelfPretrainConfig, opts: SelfPretrainOptions,
            rundir: RunDir, images, parts, size: int, start: int, config: dict,
            dispatch: Dispatch | None) -> list[dict]:
    inprocess = None if dispatch else InProcess(method, model, fed, sp, images, parts, size)
    work = _SelfPretrain(method, model, fed, sp, rundir, [len(p) for p in parts], size, config,
                         dispatch or inprocess, inprocess, opts.out)
    return run_rounds(work, start, rundir, progress=opts.progress, log_rounds=opts.log_rounds,
                      stop_after=opts.stop_after)


class _SelfPretrain:
    """Self-pre-training's rounds for :func:`federated.loop.run_rounds`: the round's clients (drawn as
    supervised federate draws them) trained by ``train`` (in this process or over Flower), their states
    averaged, then the method's server step. Rounds 1 - warm-up .. 0 are the method's warm-up rounds."""

    def __init__(self, method, model, fed: FederateConfig, sp: SelfPretrainConfig, rundir: RunDir,
                 sizes: list[int], size: int, config: dict, train: Dispatch, inprocess: InProcess | None,
                 out: str | Path):
        self.method, self.model, self.fed, self.sp, self.rundir = method, model, fed, sp, rundir
        self.sizes, self.size, self.config, self.train, self.inprocess = sizes, size, config, train, inprocess
        self.out = out
        self.desc, self.rounds, self.last_round = (f"self-pretrain {sp.algo}",
                                                   range(1 - method.warmup_rounds, sp.rounds + 1), sp.rounds)

    def round(self, rnd: int, bar: tqdm) -> dict:
        if self.inprocess is not None:
            self.inprocess.bar = bar  # client i of n on the bar
        selected = select_clients(self.sizes, self.fed.seed, rnd, self.fed.participation)
        global_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        updates, notes = self.train(rnd, selected, global_state, self.sizes)
        state, server_stats = aggregate(self.method, updates)
        self.model.load_state_dict(state)
        record = {"round": rnd, **round_stats(updates), **server_stats,
                  "clients": [u.client for u in updates], "client_sizes": [u.n_samples for u in updates],
                  **notes}
        missing = [c for c in selected if c not in record["clients"]]
        if missing:  # a Flower round with enough replies (--min-replies) goes on without these
            record["missing_clients"] = missing
        if rnd < 1:
            record["warmup"] = True
        return record

    def state(self, rnd: int) -> dict:
        return {"done": rnd, "model": self.model.state_dict()}

    def diverged(self, rnd: int, exc: DivergenceError) -> str:
        return (f"round {rnd}: {exc}; the rounds before are kept in {self.rundir.path} (--resume continues; "
                f"try a lower --lr)")

    def line(self, record: dict) -> str:
        return (f"self-pretrain round {record['round']}/{self.sp.rounds}: loss "
                f"{record.get('loss', float('nan')):.4f}, {len(record['clients'])} clients, "
                f"{record['seconds']:.1f} s")

    def postfix(self, record: dict) -> dict[str, str]:
        return {"loss": f"{record['loss']:.3f}"} if "loss" in record else {}

    def finish(self) -> None:
        fed, sp = self.fed, self.sp
        ckpt = make_checkpoint(self.model.backbone, arch=fed.arch, width=fed.width, method=sp.algo,
                               source=f"{fed.dataset} (federated self-pre-training)", epoch=sp.rounds,
                               config={**self.config, "pretrain": {"size": self.size}})
        save_checkpoint(ckpt, self.out)


def _check_settings(rundir: RunDir, config: dict, init: str) -> None:
    """Refuse a --resume with other settings than the saved run's (its method, data, partition, size)."""
    check_resume(rundir, config, ("self_pretrain", "method", "federate", "partition", "input_size"), init)
