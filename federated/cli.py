"""federate: simulate FedAvg-family training on non-IID clients (Chen et al., ICLR 2023, §4.2-4.4).

  federate --out runs/d                                   digits (embedded), Dir(0.3), 10 clients, FedAvg
  federate --dataset cifar10 --data-root ~/data --init fps.ckpt --out runs/c10-fps
  federate --dataset cifar10 --data-root ~/data --init fps.ckpt --centralized --out runs/c10-fps-cl
  federate ... --algo scaffold | fedprox --set mu=0.1 | fedavgm --set beta=0.9 | fedvc | fedir | ...

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

from fpsfl.base.checkpoint import CheckpointError
from fpsfl.base.cli import Parser, add_set_flag, add_settings, parse_settings, run_main, settings_from
from fpsfl.base.rundir import RunDirError
from pretrain.backbones import BackboneError, check_backbone

from . import flower, runner
from .datasets import DATASETS, DataError
from .experiment import FederateConfig, RunOptions
from .flower import FlowerError
from .initialisation import InitError
from .local import DivergenceError
from .oracle.tracking import TrackConfig
from .partitions import PARTITIONS, PartitionError

GROUPS = {  # argparse sections of the generated flags, in order, with their notes
    "data": None, "partition": None, "federated training": None, "segmentation (cityscapes)": None,
    "model": None,
    "tracking": "Per-round analyses (§6.2). Oracle analyses: the convex search and the loss variance use "
                "the global TEST set, as the paper does (no real federation could); --convex-data val "
                "searches on the validation split instead. Combined models average BatchNorm statistics with "
                "the same weights, as FedAvg does.",
    "search": None, "run": None,
}


def partition_settings() -> list[type]:
    """The Config classes of every registered partition (their fields are the partition flags)."""
    return [cls.Config for cls in PARTITIONS.values()]


def config_from(args: argparse.Namespace) -> FederateConfig:
    """The FederateConfig of parsed flags: every field and partition setting that was given."""
    values = settings_from(args, FederateConfig)
    for settings in partition_settings():
        values.update(settings_from(args, settings))
    tracking = TrackConfig(**settings_from(args, TrackConfig))
    return FederateConfig(**values, algo_args=parse_settings(args.set), tracking=tracking)


def options_from(args: argparse.Namespace) -> tuple[FederateConfig, RunOptions]:
    """The run's config and options from parsed flags (the default --out named after the run)."""
    cfg = config_from(args)
    spec = DATASETS[cfg.dataset]
    check_backbone(cfg.arch, cfg.width, cfg.input_size or cfg.crop_size or spec.input_size)
    opts = RunOptions(**settings_from(args, RunOptions))
    out = opts.out or Path(f"runs/{cfg.dataset}-{cfg.partition}-{cfg.algo}-s{cfg.seed}")
    return cfg, dataclasses.replace(opts, out=out)


def cmd_federate(args: argparse.Namespace) -> None:
    cfg, opts = options_from(args)
    out = opts.out
    # the engine is chosen here, at the top: the runner never imports federated.flower
    rows = (flower.run if opts.engine == "flower" else runner.run)(cfg, opts)
    if rows:
        last, best = rows[-1], max(r["test_acc"] for r in rows)
        local = f", mean local acc {last['local_acc']:.4f}" if "local_acc" in last else ""
        total = sum(r.get("seconds", 0.0) for r in rows)
        print(f"{'centralised' if cfg.centralized else cfg.algo}: round {last['round']}/{cfg.rounds}, "
              f"test acc {last['test_acc']:.4f} (best {best:.4f}){local}; {total:.0f} s of training; "
              f"run directory {out}")


def build_parser() -> argparse.ArgumentParser:
    """Every flag comes from a dataclass field: FederateConfig, the partitions' settings, TrackConfig and
    RunOptions (help, default, unit and range are written once, there)."""
    p = Parser(prog="federate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    groups = {name: p.add_argument_group(name, note and textwrap.fill(note, 100))
              for name, note in GROUPS.items()}
    add_settings(p, FederateConfig, groups=groups)
    seen = {f.name for f in dataclasses.fields(FederateConfig)}
    for settings in partition_settings():  # a setting two partitions share is one flag
        add_settings(p, settings, groups=groups, skip=tuple(seen))
        seen |= {f.name for f in dataclasses.fields(settings)}
    add_set_flag(groups["federated training"], "an algorithm setting, e.g. --set mu=0.1 (repeatable; see "
                                               "README)")
    add_settings(p, TrackConfig, groups=groups)
    add_settings(p, RunOptions, groups=groups)
    p.set_defaults(run=cmd_federate)
    return p


def main(argv: list[str] | None = None) -> int:
    errors = (DataError, PartitionError, InitError, CheckpointError, BackboneError, RunDirError, ValueError)
    return run_main("federate", build_parser(), argv, errors, (DivergenceError, FlowerError))


if __name__ == "__main__":
    sys.exit(main())
