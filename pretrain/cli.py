"""pretrain: pre-train a backbone on synthetic fractals or an image folder (Chen et al., ICLR 2023, §4.2).

  pretrain fps --epochs 100 --out fps.ckpt                    FPS + SimSiam, ResNet20 at 32 px (the paper)
  pretrain fps --arch resnet18 --size 224 --method mocov2 ... FPS + MoCo-v2, ResNet18 at 224 px
  pretrain fractal-simsiam ...                                one fractal, two augmented views (baseline)
  pretrain multilabel ...                                     multi-label fractals, J = 1000 (baseline)
  pretrain images --root DIR ...                              SimSiam/MoCo-v2 on any image folder
  pretrain supervised --root DIR ...                          cross-entropy on ROOT/<class>/ images

The checkpoint (--out) holds the backbone only and loads with torch.load(weights_only=True); progress,
per-epoch metrics and the --resume state go to a run directory beside it (fps.ckpt -> fps.run/).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fpsfl.base.checkpoint import CheckpointError
from fpsfl.base.cli import Parser, UsageError, parse_settings, positive, run_main, writable_file
from fpsfl.base.device import device_name
from fpsfl.base.rundir import RunDirError
from fractals.ifs import BankError

from .backbones import BackboneError, arch_names, check_backbone
from .folder import FolderError
from .methods import METHODS
from .recipe import PretrainConfig, RunOptions, default_run_dir
from .sources import SOURCES
from .train import TrainingError, train

ALIASES = {"fractal-simsiam": "fractal-single"}  # the CLI name of the "fractal + SimSiam" baseline
_FRACTAL = ("fps", "fractal-single", "multilabel")


def _method_args(pairs: list[str], lr: float | None) -> dict[str, str]:
    args = parse_settings(pairs)
    if lr is not None:
        positive("--lr", lr)
        args["lr"] = str(lr)
    return args


def cmd_train(args: argparse.Namespace) -> None:
    source = ALIASES.get(args.command, args.command)
    spec = SOURCES[source]
    method = args.method or spec.methods[0]
    if method not in spec.methods:
        raise UsageError(f"{args.command} trains with {' or '.join(spec.methods)}, not --method {method}")
    for name in ("epochs", "batch_size", "pairs_per_epoch", "size"):
        positive(f"--{name.replace('_', '-')}", getattr(args, name))
    if source in _FRACTAL and args.size < 16:
        raise UsageError(f"--size must be at least 16 px for rendered fractals, got {args.size}")
    check_backbone(args.arch, args.width, args.size)
    if args.workers is not None and args.workers < 0:
        raise UsageError(f"--workers must be >= 0, got {args.workers}")
    cfg = PretrainConfig(source=source, method=method, arch=args.arch, width=args.width, size=args.size,
                         epochs=args.epochs, pairs_per_epoch=args.pairs_per_epoch, batch_size=args.batch_size,
                         seed=args.seed, method_args=_method_args(args.set, args.lr), amp=args.amp,
                         root=getattr(args, "root", None), bank=getattr(args, "bank", None),
                         n_classes=getattr(args, "classes", 1000))
    out = Path(args.out or f"{args.command}-{args.arch.replace(':', '-')}.ckpt")
    writable_file(out)
    opts = RunOptions(out=out, run_dir=Path(args.run_dir) if args.run_dir else default_run_dir(out),
                      device=args.device, workers=args.workers, resume=args.resume, profile=args.profile,
                      progress=not args.quiet)
    last = train(cfg, opts)
    if args.profile:
        keys = ("epoch", "steps", "pairs_per_s", "data_wait", "augment_frac", "compute_frac", "seconds")
        setting = {k: getattr(cfg, k) for k in ("arch", "size", "batch_size", "method", "amp")}
        print(json.dumps({"profile": {k: last.get(k) for k in keys}, **setting,
                          "device": device_name(opts.device)}))
    epoch, loss = last.get("epoch", cfg.epochs), last.get("loss", float("nan"))
    print(f"wrote {out} ({cfg.arch}, {method} on {source}, epoch {epoch}/{cfg.epochs}, loss {loss:.4f}); "
          f"run directory {opts.run_dir}")


def _add_common(p: argparse.ArgumentParser, source: str) -> None:
    spec = SOURCES[source]
    p.add_argument("--arch", default="resnet20",
                   help=f"backbone: {', '.join(arch_names())} (default: resnet20, the paper's at 32 px)")
    p.add_argument("--width", type=float, default=1.0,
                   help="channel multiplier of the CIFAR ResNets (Fig. 5; default 1)")
    p.add_argument("--size", type=int, default=32,
                   help="input side in px: 32 (CIFAR scale) or 224 (default 32)")
    p.add_argument("--epochs", type=int, default=100, help="epochs (default: 100, Appendix A.2)")
    p.add_argument("--batch-size", type=int, default=256, help="pairs/images per step (default: 256)")
    if source in _FRACTAL:
        p.add_argument("--pairs-per-epoch", type=int, default=1_000_000,
                       help="samples rendered per epoch (default: 1000000, Appendix A.2)")
        p.add_argument("--bank",
                       help="IFS code bank .npz from `fractals bank` (default: 100K codes from --seed)")
    else:
        p.set_defaults(pairs_per_epoch=1)  # an epoch is one pass over the folder
        per_class = " with one sub-folder per class" if source == "supervised" else ", searched recursively"
        p.add_argument("--root", required=True, help=f"image folder{per_class}")
    if source == "multilabel":
        p.add_argument("--classes", type=int, default=1000,
                       help="J, the number of fractal classes (default 1000)")
    p.add_argument("--method", choices=spec.methods, default=None,
                   help=f"{' | '.join(spec.methods)} (default: {spec.methods[0]})")
    p.add_argument("--lr", type=float, default=None,
                   help="base learning rate per 256 samples, scaled with the batch (default: the method's; "
                        + ", ".join(f"{m} {METHODS[m].Config().lr}" for m in spec.methods) + ")")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a method setting, e.g. --set temperature=0.1 (repeatable; see README)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights, data and augmentation (default 0)")
    p.add_argument("--out", help="checkpoint path (default: <command>-<arch>.ckpt)")
    p.add_argument("--run-dir", help="run directory (default: beside --out, fps.ckpt -> fps.run/)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    p.add_argument("--workers", type=int, default=None,
                   help="data worker processes (default: 0 on CPU, up to 8 on a GPU)")
    p.add_argument("--amp", action="store_true", help="bf16 autocast (use on a GPU)")
    p.add_argument("--resume", action="store_true", help="continue the run in the run directory")
    p.add_argument("--profile", action="store_true",
                   help="time data wait / augmentation / compute separately and print them as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar or per-epoch lines")
    p.set_defaults(run=cmd_train)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="pretrain", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name in ("fps", "fractal-simsiam", "multilabel", "images", "supervised"):
        source = ALIASES.get(name, name)
        s = sub.add_parser(name, help=SOURCES[source].description, description=SOURCES[source].description)
        _add_common(s, source)
    return p


def main(argv: list[str] | None = None) -> int:
    errors = (BackboneError, CheckpointError, RunDirError, FolderError, BankError, ValueError)
    return run_main("pretrain", build_parser(), argv, errors, (TrainingError,))


if __name__ == "__main__":
    sys.exit(main())
