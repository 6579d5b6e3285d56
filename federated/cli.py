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
import sys
from pathlib import Path

from fpsfl.base.checkpoint import CheckpointError
from fpsfl.base.cli import Parser, UsageError, parse_settings, run_main
from fpsfl.base.rundir import RunDirError
from pretrain.backbones import BackboneError, arch_names, check_backbone

from .algorithms import ALGORITHMS
from .datasets import DATASETS, DataError
from .experiment import PRESETS, FederateConfig
from .initialisation import InitError
from .local import DivergenceError
from .oracle.tracking import AGGREGATIONS, TRACKS, TrackConfig, add_search_arguments, track_config
from .partitions import PARTITIONS, PartitionError
from .rounds import RunOptions, run


def _rounds_list(text: str) -> tuple[int, ...]:
    try:
        rounds = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise UsageError(f"--save-local-models expects rounds like 10,50, got {text!r}") from None
    return rounds


def _tracking(args: argparse.Namespace) -> TrackConfig:
    return track_config(args, track=tuple(t.strip() for t in args.track.split(",") if t.strip()),
                        every=args.track_every, aggregation=args.aggregation)


def cmd_federate(args: argparse.Namespace) -> None:
    if args.dataset not in DATASETS:
        raise UsageError(f"unknown dataset {args.dataset!r}; choose from {', '.join(DATASETS)}")
    spec = DATASETS[args.dataset]
    input_size = args.input_size or args.crop_size or spec.input_size
    arch = args.arch or spec.default_arch
    check_backbone(arch, args.width, input_size)
    partition = args.partition or spec.default_partition
    cfg = FederateConfig(
        dataset=args.dataset, data_root=args.data_root, download=args.download, split_csv=args.split_csv,
        store_size=args.store_size, input_size=args.input_size, val_fraction=args.val_fraction,
        partition=partition, clients=args.clients, alpha=args.alpha,
        labels_per_client=args.labels_per_client, beta=args.beta, noise=args.noise, min_size=args.min_size,
        algo=args.algo,
        algo_args=parse_settings(args.set), participation=args.participation, rounds=args.rounds,
        local_epochs=args.local_epochs, lr=args.lr, batch_size=args.batch_size, optimizer=args.optimizer,
        momentum=args.momentum, crop_size=args.crop_size, eval_size=args.eval_size,
        weight_decay=args.weight_decay, lr_decay=args.lr_decay, lr_decay_every=args.lr_decay_every,
        bn=args.bn, centralized=args.centralized, arch=arch, width=args.width, init=args.init,
        init_format=args.init_format, seed=args.seed, eval_local=not args.no_eval_local,
        save_local_models=_rounds_list(args.save_local_models), tracking=_tracking(args))
    out = Path(args.out or f"runs/{args.dataset}-{partition}-{args.algo}-s{args.seed}")
    rows = run(cfg, RunOptions(out=out, device=args.device, resume=args.resume, progress=not args.quiet))
    if rows:
        last, best = rows[-1], max(r["test_acc"] for r in rows)
        local = f", mean local acc {last['local_acc']:.4f}" if "local_acc" in last else ""
        total = sum(r.get("seconds", 0.0) for r in rows)
        print(f"{'centralised' if cfg.centralized else cfg.algo}: round {last['round']}/{cfg.rounds}, "
              f"test acc {last['test_acc']:.4f} (best {best:.4f}){local}; {total:.0f} s of training; "
              f"run directory {out}")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="federate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = p.add_argument_group("data")
    d.add_argument("--dataset", default="digits",
                   help=f"{' | '.join(DATASETS)} (default: digits, embedded, no download)")
    d.add_argument("--data-root", help="folder holding the dataset (see README: preparing datasets)")
    d.add_argument("--download", action="store_true", help="let torchvision download CIFAR (needs a network)")
    d.add_argument("--split-csv", help="inat-geo: the GEO-10K/GEO-3K client split CSV")
    d.add_argument("--store-size", type=int,
                   help="px side images are held at in memory (default: per dataset)")
    d.add_argument("--input-size", type=int,
                   help="px side the model sees (default: 32, or 224 for larger data)")
    d.add_argument("--val-fraction", type=float, default=0.02,
                   help="held-out share of train (default 0.02)")
    q = p.add_argument_group("partition")
    q.add_argument("--partition", help=f"{' | '.join(PARTITIONS)} (default: natural for datasets with "
                   "given clients (inat-geo, cityscapes), else dirichlet)")
    q.add_argument("--clients", type=int, default=10, help="number of clients (default 10)")
    q.add_argument("--alpha", type=float, default=0.3, help="Dirichlet concentration (default 0.3)")
    q.add_argument("--labels-per-client", type=int, default=2, help="shards: labels per client k (default 2)")
    q.add_argument("--beta", type=float, default=0.5, help="quantity: sizes ~ Dir(beta) (default 0.5)")
    q.add_argument("--noise", type=float, default=0.1, help="noise: client i gets sigma*i/N (default 0.1)")
    q.add_argument("--min-size", type=int,
                   help="samples every client must have (default 10; 1 for natural clients)")
    f = p.add_argument_group("federated training")
    f.add_argument("--algo", default="fedavg", help=f"{' | '.join(ALGORITHMS)} (default: fedavg)")
    f.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an algorithm setting, e.g. --set mu=0.1 (repeatable; see README)")
    f.add_argument("--participation", type=float, default=1.0, help="fraction of clients a round (default 1)")
    f.add_argument("--rounds", type=int, default=100, help="communication rounds (default 100)")
    f.add_argument("--local-epochs", type=int, default=5, help="local epochs a round (default 5)")
    f.add_argument("--batch-size", type=int, help="local batch (default: Table 9 preset, e.g. 32 for CIFAR)")
    f.add_argument("--lr", type=float, help="local SGD learning rate (default: Table 9 preset: "
                   + ", ".join(f"{k} {v[0]}" for k, v in PRESETS.items()) + ")")
    f.add_argument("--optimizer", choices=("sgd", "adam"),
                   help="local optimiser (default: Table 9 preset: adam for cityscapes, sgd otherwise)")
    f.add_argument("--momentum", type=float, default=0.9, help="local SGD momentum (default 0.9)")
    f.add_argument("--weight-decay", type=float, default=1e-4, help="local weight decay (default 1e-4)")
    f.add_argument("--lr-decay", type=float, default=0.1, help="lr factor every --lr-decay-every rounds")
    f.add_argument("--lr-decay-every", type=int, default=30, help="rounds between lr decays (default 30)")
    f.add_argument("--bn", choices=("global", "local"), default="global",
                   help="global: average BatchNorm statistics like parameters; local: keep them per client")
    f.add_argument("--centralized", action="store_true",
                   help="train centrally on the union of the clients, rounds x local-epochs epochs")
    g = p.add_argument_group("segmentation (cityscapes)")
    g.add_argument("--crop-size", type=int, help="px of the square training crops (default 768, the paper's)")
    g.add_argument("--eval-size", help="HxW test resolution (default: as stored; the paper's 1024x2048)")
    m = p.add_argument_group("model")
    m.add_argument("--arch", help=f"{', '.join(arch_names())} (default: resnet20 at 32 px, resnet18 at "
                   "224 px, mobilenet_v2 for cityscapes, as in the paper)")
    m.add_argument("--width", type=float, default=1.0, help="CIFAR ResNet width multiplier (default 1)")
    m.add_argument("--init", default="random",
                   help="random | imagenet | PATH.ckpt from pretrain (default random)")
    m.add_argument("--init-format", choices=("fpsfl", "torchvision"), default="fpsfl",
                   help="torchvision: --init is a plain state dict (e.g. Places365 weights)")
    t = p.add_argument_group(
        "analysis tracking (§6.2)",
        "Oracle analyses: the convex search and the loss variance use the global TEST set, as the paper "
        "does (no real federation could); --convex-data val searches on the validation split instead. "
        "Combined models average BatchNorm statistics with the same weights, as FedAvg does.")
    t.add_argument("--track", default="", metavar="A,B",
                   help=f"log these analyses every --track-every rounds: {', '.join(TRACKS)} (default none)")
    t.add_argument("--track-every", type=int, default=10, metavar="K", help="rounds between tracked rounds "
                   "(default 10)")
    t.add_argument("--aggregation", choices=AGGREGATIONS, default="algo",
                   help="algo: the algorithm's own aggregation (default); optimal-convex: aggregate every "
                   "round with the searched lambda* (oracle, Fig. 7's dashed curves)")
    add_search_arguments(t)
    r = p.add_argument_group("run")
    r.add_argument("--seed", type=int, default=0,
                   help="seed of partition, init, sampling and data order (default 0)")
    r.add_argument("--out", help="run directory (default runs/<dataset>-<partition>-<algo>-s<seed>)")
    r.add_argument("--resume", action="store_true", help="continue the run in --out from its last round")
    r.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    r.add_argument("--save-local-models", default="", metavar="R1,R2",
                   help="keep every client's model of these rounds (for analysis), e.g. 10,50")
    r.add_argument("--no-eval-local", action="store_true",
                   help="skip testing each local model before aggregation (faster; no local_acc metric)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=cmd_federate)
    return p


def main(argv: list[str] | None = None) -> int:
    errors = (DataError, PartitionError, InitError, CheckpointError, BackboneError, RunDirError, ValueError)
    return run_main("federate", build_parser(), argv, errors, (DivergenceError,))


if __name__ == "__main__":
    sys.exit(main())
