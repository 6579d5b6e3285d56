"""``federate self-pretrain``: federated self-supervised pre-training on the clients' own images (Chen et al.,
ICLR 2023, §5, Table 7, App. B.3), before supervised FedAvg from its checkpoint.

  federate self-pretrain --dataset cifar10 --data-root ~/data --alpha 0.1 --out sp.ckpt
  federate --dataset cifar10 --data-root ~/data --alpha 0.1 --init sp.ckpt --out runs/c10-sp
  federate self-pretrain ... --init fps-resnet20 --out sp-fps.ckpt      SP from FPS weights (Table 7)
  federate self-pretrain ... --set local_clusters=256 --set global_clusters=32

The data, partition, client-sampling and model flags are federate's: give the supervised stage the same
ones (and the same --seed), or it refuses the checkpoint. Labels are never read for training. Defaults
follow App. B.3: Orchestra, 50 rounds of 5 local epochs, lr 0.003, batch 32, 32 local / 8 global clusters
(Tiny-ImageNet: 256 / 32). The run directory (beside --out) holds config.json, metrics.jsonl (one line a
round: the losses, the rotation head's accuracy, z_std, the global clusters in use), partition.json/.png
and state.pt (for --resume).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from fpsfl.base.cli import (
    Parser,
    UsageError,
    add_set_flag,
    add_settings,
    parse_settings,
    settings_from,
    writable_file,
)
from pretrain.backbones import check_backbone

from ..datasets import DATASETS
from ..experiment import FederateConfig, merge
from ..flags import add_plugin_flags, plugin_settings_from
from . import FED_SSL
from .config import DATA_FIELDS, SelfPretrainConfig, SelfPretrainOptions
from .runner import run

GROUPS = ("data", "partition", "federated training", "model", "self-pre-training", "run")


def configs_from(args: argparse.Namespace) -> tuple[FederateConfig, SelfPretrainConfig, SelfPretrainOptions]:
    """The run's data/partition/model config, self-pre-training config and options from parsed flags."""
    values = settings_from(args, FederateConfig)
    values.pop("algo", None)  # --algo names the self-supervised method (SelfPretrainConfig), not federate's
    values.update(plugin_settings_from(args))
    fed = merge(values)
    sp = SelfPretrainConfig(**settings_from(args, SelfPretrainConfig), algo_args=parse_settings(args.set))
    sp.method_config(fed.preset())  # unknown or out-of-range --set values fail before anything is written
    check_backbone(fed.arch, fed.width, fed.input_size or DATASETS[fed.dataset].input_size)
    opts = SelfPretrainOptions(**settings_from(args, SelfPretrainOptions))
    out = opts.out or Path(f"sp-{fed.dataset}-{sp.algo}-s{fed.seed}.ckpt")
    writable_file(out)
    run_dir = opts.run_dir or out.with_name(f"{out.stem}.run")
    return fed, sp, dataclasses.replace(opts, out=out, run_dir=run_dir)


def cmd_self_pretrain(args: argparse.Namespace) -> None:
    fed, sp, opts = configs_from(args)
    if opts.shards is not None and opts.engine == "inprocess":
        raise UsageError("--shards: node-local shards are for flwr run . on a SuperLink (each SuperNode with "
                         "node config data-dir); the inprocess engine draws the partition itself")
    if opts.engine == "flower":  # the engine is chosen here, at the top: the runner never imports Flower
        from ..flower.selfsup import run_simulation

        rows = run_simulation(fed, sp, opts)
    else:
        rows = run(fed, sp, opts)
    last = rows[-1] if rows else {}
    if last.get("round") == sp.rounds:
        print(f"self-pretrain {sp.algo}: {sp.rounds} rounds, last loss {last.get('loss', float('nan')):.4f}; "
              f"wrote {opts.out} (federate --init {opts.out} with the same data and partition flags); run "
              f"directory {opts.run_dir}")
    else:
        print(f"self-pretrain {sp.algo}: stopped after round {last.get('round')} of {sp.rounds}; continue "
              f"with --resume; run directory {opts.run_dir}")


def build_parser() -> argparse.ArgumentParser:
    """federate's data, partition, sampling and model flags, then self-pre-training's and the run's."""
    p = Parser(prog="federate self-pretrain", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    groups = {name: p.add_argument_group(name) for name in GROUPS}
    add_settings(p, FederateConfig, groups=groups, only=DATA_FIELDS)
    add_plugin_flags(p, groups)
    add_settings(p, SelfPretrainConfig, groups=groups)
    known = "; ".join(f"{name}: {', '.join(f.name for f in dataclasses.fields(cls.Config))}"
                      for name, cls in FED_SSL.items())
    add_set_flag(groups["self-pre-training"], f"a method setting, e.g. --set local_clusters=256 (repeatable; "
                                              f"{known})")
    add_settings(p, SelfPretrainOptions, groups=groups)
    p.set_defaults(run=cmd_self_pretrain)
    return p
