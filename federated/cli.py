"""federate: simulate FedAvg-family training on non-IID clients (Chen et al., ICLR 2023, §4.2-4.4).

  federate --out runs/d                                   digits (embedded), Dir(0.3), 10 clients, FedAvg
  federate --dataset cifar10 --data-root ~/data --init fps.ckpt --out runs/c10-fps
  federate --dataset cifar10 --data-root ~/data --init fps.ckpt --centralized --out runs/c10-fps-cl
  federate ... --algo scaffold | fedprox --set mu=0.1 | fedavgm --set beta=0.9 | fedvc | fedir | ...
  federate export-partitions --clients 10 --alpha 0.1 --out shards/   one .npz per client + manifest.json,
                                          for Flower SuperNodes that hold only their own data (docs/flower.md)
  federate self-pretrain --alpha 0.1 --out sp.ckpt     federated self-supervised pre-training (Orchestra, §5)
                                          on the clients' own images; then federate --alpha 0.1 --init sp.ckpt

A run directory holds config.json, metrics.jsonl (one line a round), partition.json/.png, state.pt (for
--resume) and final.pt. Defaults follow the paper: 10 clients, alpha 0.3, full participation, 5 local
epochs, 100 rounds, SGD momentum 0.9, weight decay 1e-4, lr x0.1 every 30 rounds, lr/batch per Table 9.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm import tqdm

from fpsfl.base.checkpoint import CheckpointError
from fpsfl.base.cli import (
    Parser,
    UsageError,
    add_set_flag,
    add_settings,
    nonempty,
    parse_settings,
    run_main,
    settings_from,
)
from fpsfl.base.configfile import read_sections, run_record, typed
from fpsfl.base.rundir import RunDirError
from fpsfl.base.settings import group_fields
from pretrain.backbones import BackboneError, check_backbone

from . import flower, runner
from .datasets import DATASETS, DataError
from .experiment import SETTING_GROUPS, FederateConfig, RunOptions, flat_settings, merge
from .flags import add_plugin_flags, plugin_settings_classes, plugin_settings_from, unread_settings
from .flower import FlowerError
from .initialisation import InitError, init_sha256
from .local import DivergenceError
from .oracle.tracking import TrackConfig
from .partitions import PartitionError
from .setup import client_class_counts, partitioned
from .shards import MANIFEST, check_export_dir, export_shards, partition_settings

GROUPS = {  # argparse sections of the generated flags, in order, with their notes
    "data": None, "partition": None, "federated training": None, "segmentation (cityscapes)": None,
    "model": None,
    "tracking": "Per-round analyses (§6.2). Oracle analyses: the convex search and the loss variance use "
                "the global TEST set, as the paper does (no real federation could); --convex-data val "
                "searches on the validation split instead. Combined models average BatchNorm statistics with "
                "the same weights, as FedAvg does.",
    "search": None, "run": None,
}


class FileSettings(NamedTuple):
    """The typed values of a --config file: [federate] (tracking apart), [algo] and [run]."""

    federate: dict
    algo: dict
    tracking: dict
    run: dict


def file_settings(args: argparse.Namespace) -> FileSettings:
    """The --config file's values (none without one). A run's config.json gives its federate table, whose
    algo_args are the run's --set; its algo table is the resolved record and is not read."""
    path = getattr(args, "config", None)
    if path is None:
        return FileSettings({}, {}, {}, {})
    tables = read_sections(path, ("federate", "algo", "run"), recorded=("algo", "init_sha256", "engine"))
    where = f"--config {path}"
    plugin_tables = tuple(flat_settings())  # partition_args, data_args
    inner = ("tracking", "algo_args", *plugin_tables)
    fed = typed([FederateConfig, *plugin_settings_classes()], tables.get("federate", {}),
                f"{where}: [federate]", skip=(*inner, *SETTING_GROUPS))
    for name, cls in SETTING_GROUPS.items():  # [federate.training] rounds = 5: a group's settings, read flat
        fed = {**typed(cls, fed.pop(name, {}), f"{where}: [federate.{name}]", skip=inner), **fed}
    for table in plugin_tables:  # written as a table, plugin settings count as the flat keys (which win)
        fed = {**typed(plugin_settings_classes(), fed.pop(table, {}), f"{where}: [federate.{table}]"), **fed}
    tracking = typed(TrackConfig, fed.pop("tracking", {}), f"{where}: [federate.tracking]")
    algo = {**fed.pop("algo_args", {}), **tables.get("algo", {})}
    return FileSettings(fed, algo, tracking, typed(RunOptions, tables.get("run", {}), f"{where}: [run]"))


def config_from(args: argparse.Namespace, file: FileSettings | None = None) -> FederateConfig:
    """The FederateConfig of parsed flags over the --config file's values (``file``, read here when not
    given): every field and partition setting that was given. The file's algorithm settings are dropped
    when a flag picks another --algo."""
    file = file_settings(args) if file is None else file
    flags = {**settings_from(args, FederateConfig), **plugin_settings_from(args)}
    flags.update(algo_args=parse_settings(args.set), tracking=settings_from(args, TrackConfig))
    return merge({**file.federate, "algo_args": file.algo, "tracking": file.tracking}, flags)


def check_replayed_init(args: argparse.Namespace, init: str) -> None:
    """A run's config.json replayed with --config trains from its --init only while that file is still the
    one the run started from (issue 42): the record holds the file's sha256 beside its path. A --init given
    as a flag is the user's choice and is not compared."""
    path = getattr(args, "config", None)
    if path is None or "init" in settings_from(args, FederateConfig):
        return
    record = run_record(path) or {}
    recorded, replayed = record.get("init_sha256"), (record.get("federate") or {}).get("init")
    if not recorded or replayed != init:
        return
    now = init_sha256(init)
    if now is not None and now != recorded:  # a missing file is refused by the run itself
        raise UsageError(f"--config {path}: --init {init} is not the file that run started from (its sha256 "
                         f"differs from the recorded one); give --init {init} to train from the file as it "
                         f"is now")


def options_from(args: argparse.Namespace) -> tuple[FederateConfig, RunOptions]:
    """The run's config and options from parsed flags (the default --out named after the run)."""
    file = file_settings(args)  # the --config file, read once
    cfg = config_from(args, file)
    for note in unread_settings(plugin_settings_from(args), cfg.partition, cfg.dataset):
        print(f"federate: note: {note}", file=sys.stderr)
    check_replayed_init(args, cfg.init)
    spec = DATASETS[cfg.dataset]
    check_backbone(cfg.arch, cfg.width, cfg.input_size or cfg.crop_size or spec.input_size)
    opts = RunOptions(**{**file.run, **settings_from(args, RunOptions)})
    out = opts.out or Path(f"runs/{cfg.dataset}-{cfg.partition}-{cfg.algo}-s{cfg.seed}")
    return cfg, dataclasses.replace(opts, out=out)


def cmd_federate(args: argparse.Namespace) -> None:
    cfg, opts = options_from(args)
    out = opts.out
    if opts.shards is not None and opts.engine == "inprocess":
        raise UsageError("--shards: node-local shards are for flwr run . on a SuperLink (each SuperNode with "
                         "node config data-dir); the inprocess engine draws the partition itself")
    # the engine is chosen here, at the top: the runner never imports federated.flower
    rows = (flower.run if opts.engine == "flower" else runner.run)(cfg, opts)
    if rows:
        last, best = rows[-1], max(r["test_acc"] for r in rows)
        local = f", mean local acc {last['local_acc']:.4f}" if "local_acc" in last else ""
        total = sum(r.get("seconds", 0.0) for r in rows)
        print(f"{'centralised' if cfg.centralized else cfg.algo}: round {last['round']}/{cfg.rounds}, "
              f"test acc {last['test_acc']:.4f} (best {best:.4f}){local}; {total:.0f} s of training; "
              f"run directory {out}")


def cmd_export(args: argparse.Namespace) -> None:
    """The run's partition as node-local shards (:mod:`federated.shards`)."""
    cfg = config_from(args)
    check_export_dir(args.out)  # before the data is loaded
    data, task, parts = partitioned(cfg)
    parts = [torch.as_tensor(p, dtype=torch.long) for p in parts]
    with tqdm(total=len(parts), desc="shards", unit="client", disable=not args.progress) as bar:
        export_shards(args.out, partition_settings(cfg), data, parts, client_class_counts(task, data, parts),
                      bar)
    print(f"federate export-partitions: {len(parts)} shards ({sum(map(len, parts))} training samples) and "
          f"{MANIFEST} in {args.out}; start SuperNode i with --node-config \"partition-id=i "
          f"data-dir='{args.out.resolve()}'\" and run the app with shards='{args.out.resolve()}'")


def build_export_parser() -> argparse.ArgumentParser:
    """``federate export-partitions``: federate's data and partition flags, and where the shards go."""
    p = Parser(prog="federate export-partitions", description=textwrap.fill(
        "Write the partition a federate run with these settings draws as node-local data: "
        "one client-NNNN.npz per client (its training images, labels and positions in the "
        "training set) and manifest.json (the settings, client sizes and each shard's "
        "sha256). A Flower SuperNode started with --node-config \"partition-id=I "
        "data-dir=DIR\" then loads only shard I (docs/flower.md).", 100))
    groups = {name: p.add_argument_group(name) for name in ("data", "partition", "run")}
    data_fields = (*group_fields(FederateConfig, "data", "partition"), "seed")
    add_settings(p, FederateConfig, groups=groups, only=tuple(n for n in data_fields if n != "input_size"))
    add_plugin_flags(p, groups)
    groups["run"].add_argument("--out", type=nonempty(Path), required=True, metavar="DIR",
                               help="directory for the shards and the manifest (created; one that holds a "
                                    "manifest is refused)")
    groups["run"].add_argument("--quiet", dest="progress", action="store_false", help="no progress bar")
    p.set_defaults(run=cmd_export, set=[])
    return p


def build_parser() -> argparse.ArgumentParser:
    """Every flag comes from a dataclass field: FederateConfig, the partitions' settings, TrackConfig and
    RunOptions (help, default, unit and range are written once, there)."""
    p = Parser(prog="federate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    groups = {name: p.add_argument_group(name, note and textwrap.fill(note, 100))
              for name, note in GROUPS.items()}
    p.add_argument("--config", type=Path, metavar="FILE",
                   help="settings from a TOML file ([federate], [algo], [run] tables, keys named as the "
                        "flags with underscores; [federate.training] and the other groups' tables may hold "
                        "their settings) or a run's config.json, which replays that run; flags given "
                        "beside it win (docs/federated.md: config files)")
    add_settings(p, FederateConfig, groups=groups)
    add_plugin_flags(p, groups)
    add_set_flag(groups["federated training"], "an algorithm setting, e.g. --set mu=0.1 (repeatable; see "
                                               "docs/federated.md)")
    add_settings(p, TrackConfig, groups=groups)
    add_settings(p, RunOptions, groups=groups)
    p.set_defaults(run=cmd_federate)
    return p


def main(argv: list[str] | None = None) -> int:
    errors = (DataError, PartitionError, InitError, CheckpointError, BackboneError, RunDirError, ValueError)
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["export-partitions"]:
        return run_main("federate export-partitions", build_export_parser(), argv[1:], errors)
    if argv[:1] == ["self-pretrain"]:  # imported here: federate's own start-up never loads it
        from .selfsup.cli import build_parser as build_self_pretrain_parser

        return run_main("federate self-pretrain", build_self_pretrain_parser(), argv[1:], errors,
                        (DivergenceError, FlowerError))
    return run_main("federate", build_parser(), argv, errors, (DivergenceError, FlowerError))


if __name__ == "__main__":
    sys.exit(main())
