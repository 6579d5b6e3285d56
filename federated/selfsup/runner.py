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

import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from fpsfl.base.checkpoint import make_checkpoint, plain, save_checkpoint
from fpsfl.base.device import resolve_device
from fpsfl.base.rundir import RunDir, RunDirError, lock_out
from pretrain.backbones import create_backbone

from ..datasets import ImageData
from ..experiment import FederateConfig
from ..initialisation import check_init, init_sha256, initialise, resolve_init
from ..local import DivergenceError
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
    """The part of ``fed`` self-pre-training reads (:data:`DATA_FIELDS` and the partition's settings)."""
    full = fed.to_dict()
    return {k: full[k] for k in (*DATA_FIELDS, *fed.partition_args)}


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
            state = _load_resumable(rundir, config)
            model.load_state_dict(state["model"])
            start = int(state["done"]) + 1
        else:
            if opts.resume:  # killed in its first round: started again once the settings match (issue 42)
                _check_settings(rundir, config)
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
    sizes = [len(p) for p in parts]
    bar = tqdm(total=sp.rounds + method.warmup_rounds, initial=start - 1 + method.warmup_rounds,
               desc=f"self-pretrain {sp.algo}", unit="round", disable=not opts.progress, dynamic_ncols=True)
    train = dispatch or InProcess(method, model, fed, sp, images, parts, size, bar)
    for rnd in range(start, sp.rounds + 1):
        if opts.stop_after is not None and rnd - start >= opts.stop_after:
            break
        t0 = time.perf_counter()
        selected = select_clients(sizes, fed.seed, rnd, fed.participation)
        global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        try:
            updates, notes = train(rnd, selected, global_state, sizes)
        except DivergenceError as exc:
            bar.close()
            raise DivergenceError(f"round {rnd}: {exc}; the rounds before are kept in {rundir.path} "
                                  f"(--resume continues; try a lower --lr)") from None
        state, server_stats = aggregate(method, updates)
        model.load_state_dict(state)
        record = {"round": rnd, **round_stats(updates), **server_stats,
                  "clients": [u.client for u in updates], "client_sizes": [u.n_samples for u in updates],
                  "seconds": time.perf_counter() - t0, **notes}
        missing = [c for c in selected if c not in record["clients"]]
        if missing:  # a Flower round with enough replies (--min-replies) goes on without these
            record["missing_clients"] = missing
        if rnd < 1:
            record["warmup"] = True
        rundir.append_metrics(record)
        rundir.save_state({"done": rnd, "model": model.state_dict()})
        if opts.log_rounds:  # no bar (flwr run): a line per round, which flwr log shows
            tqdm.write(f"self-pretrain round {rnd}/{sp.rounds}: loss {record.get('loss', float('nan')):.4f}, "
                       f"{len(updates)} clients, {record['seconds']:.1f} s", file=sys.stderr)
        if "loss" in record:
            bar.set_postfix(loss=f"{record['loss']:.3f}")
        bar.update(1)
    bar.close()
    rows = rundir.metrics()
    if rows and rows[-1]["round"] == sp.rounds:
        ckpt = make_checkpoint(model.backbone, arch=fed.arch, width=fed.width, method=sp.algo,
                               source=f"{fed.dataset} (federated self-pre-training)", epoch=sp.rounds,
                               config={**config, "pretrain": {"size": size}})
        save_checkpoint(ckpt, opts.out)
    return rows


def _load_resumable(rundir: RunDir, config: dict) -> dict:
    """The saved state, once every setting matches the saved one (:func:`_check_settings`)."""
    _check_settings(rundir, config)
    return rundir.load_state(config, compare=())


def _check_settings(rundir: RunDir, config: dict) -> None:
    """Refuse a --resume with other settings than the saved run's; the --init path is compared by its
    sha256 (a moved init file resumes, another file of the same name does not)."""
    saved, mine = rundir.saved_config(), plain(config)
    for part in ("self_pretrain", "method", "federate", "partition", "input_size"):
        a, b = saved.get(part), mine[part]
        if isinstance(a, dict) and isinstance(b, dict):
            a, b = {k: v for k, v in a.items() if k != "init"}, {k: v for k, v in b.items() if k != "init"}
        if a != b:
            changed = (sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
                       if isinstance(a, dict) and isinstance(b, dict) else [part])
            raise RunDirError(f"--resume: {', '.join(changed)} differ(s) from the run in "
                              f"{rundir.config_path}; resume with the same settings or start a new run")
    recorded, now = saved.get("init_sha256"), mine["init_sha256"]
    if recorded and now and recorded != now:
        raise RunDirError(f"--resume: --init is not the file this run started from (its sha256 differs from "
                          f"the one in {rundir.config_path})")
