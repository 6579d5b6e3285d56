"""``analyze probe CKPT``: kNN and linear-probe accuracy of a checkpoint's frozen backbone, beside a random
init of the same architecture (the baseline), on any labelled ``federate`` dataset (digits by default).

The probe itself is :mod:`pretrain.probe` (Wu et al. 2018's weighted kNN, a logistic-regression linear
probe); this command reads checkpoints, loads the dataset, prints a table and writes ``probe.json``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from federated.datasets import DataConfig, load_dataset
from fpsfl.base.checkpoint import load_backbone_weights, load_checkpoint
from fpsfl.base.cli import COUNT, SEED, TEXT
from fpsfl.base.device import resolve_device
from pretrain.backbones import create_backbone
from pretrain.probe import ProbeData, probe

from .output import output_dir, write_json
from .runs import AnalysisError


def probe_data(dataset: str, root: str | None, seed: int) -> ProbeData:
    """A classification dataset of ``federate`` (its whole training and test sets) as probe data."""
    data = load_dataset(DataConfig(name=dataset, root=root, val_fraction=0.0, seed=seed))
    if data.task != "classification":
        raise AnalysisError(f"a probe needs a classification dataset, not {dataset!r}")
    return ProbeData(data.train_x, data.train_y, data.test_x, data.test_y, data.n_classes)


def probe_checkpoint(path: str, data: ProbeData, input_size: int | None, device: torch.device,
                     seed: int, baseline: bool = True) -> dict:
    """The probes of the checkpoint at ``path`` and, with ``baseline``, of a random init (``seed``) of its
    architecture (``random_init``)."""
    ckpt = load_checkpoint(path)
    size = input_size or int(ckpt["config"].get("pretrain", {}).get("size", 32))
    torch.manual_seed(seed)
    random = create_backbone(ckpt["arch"], ckpt["width"]).to(device)
    trained = create_backbone(ckpt["arch"], ckpt["width"])
    load_backbone_weights(trained, ckpt, str(path))
    out = {"checkpoint": str(path), "arch": ckpt["arch"], "width": ckpt["width"], "epoch": ckpt["epoch"],
           "method": ckpt["method"], "source": ckpt["source"], "input_size": size,
           "probe": probe(trained.to(device), data, size)}
    if baseline:
        out["random_init"] = probe(random, data, size)
    return out


def check_checkpoints(paths: list[str]) -> None:
    """Every checkpoint loads (CheckpointError names the first that does not), before anything is written."""
    for path in paths:
        load_checkpoint(path)


def cmd_probe(args: argparse.Namespace) -> None:
    check_checkpoints(args.checkpoints)
    device = resolve_device(args.device)
    data = probe_data(args.dataset, args.data_root, args.seed)
    out = output_dir(args.out, [], args.checkpoints)
    rows = [probe_checkpoint(p, data, args.input_size, device, args.seed) for p in args.checkpoints]
    print(f"{'checkpoint':40s} {'kNN':>7s} {'linear':>7s}   random init: {'kNN':>7s} {'linear':>7s}")
    for r in rows:
        p, b = r["probe"], r["random_init"]
        print(f"{Path(r['checkpoint']).name:40s} {100 * p['knn_acc']:6.1f}% {100 * p['linear_acc']:6.1f}%"
              f"                {100 * b['knn_acc']:6.1f}% {100 * b['linear_acc']:6.1f}%")
    write_json(out / "probe.json", {"dataset": args.dataset, "rows": rows})
    print(f"wrote {out / 'probe.json'}")


def register(sub) -> None:
    p = sub.add_parser("probe", help="kNN and linear-probe accuracy of checkpoints' frozen backbones, "
                       "beside a random init", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", metavar="CKPT", help="pretrain checkpoints (.ckpt)")
    p.add_argument("--dataset", type=TEXT, default="digits",
                   help="a classification dataset of federate (default: digits)")
    p.add_argument("--data-root", type=TEXT, help="folder holding the dataset (see federate --help)")
    p.add_argument("--input-size", type=COUNT, help="px the backbone sees (default: the checkpoint's "
                   "pre-training size)")
    p.add_argument("--seed", type=SEED, default=0, help="seed of the random-init baseline (default 0)")
    p.add_argument("--device", type=TEXT, default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    p.add_argument("--out", type=TEXT,
                   help="output folder for probe.json (default: analysis/ beside the checkpoints)")
    p.set_defaults(run=cmd_probe)
