"""pretrain: pre-train a backbone on synthetic fractals or an image folder (Chen et al., ICLR 2023, §4.2).

  pretrain fps --recipe official --epochs 100 --out fps.ckpt  FPS + SimSiam, ResNet20 at 32 px (the paper)
  pretrain fps --epochs 8 --pairs-per-epoch 125000 ...        the default --recipe short: MoCo-v2, init x0.1
  pretrain fps --arch resnet18 --size 224 --method mocov2 ... FPS + MoCo-v2, ResNet18 at 224 px
  pretrain fractal-simsiam ...                                one fractal, two augmented views (baseline)
  pretrain multilabel ...                                     multi-label fractals, J = 1000 (baseline)
  pretrain images --root DIR ...                              SimSiam/MoCo-v2 on any image folder
  pretrain supervised --root DIR ...                          cross-entropy on ROOT/<class>/ images

The checkpoint (--out) holds the backbone only and loads with torch.load(weights_only=True); progress,
per-epoch metrics and the --resume state go to a run directory beside it (fps.ckpt -> fps.run/).

  torchrun --standalone --nproc-per-node N -m pretrain.cli fps ...   DistributedDataParallel, N processes
                                                                     (--batch-size stays the global batch)
  torchrun --max-restarts 3 ... pretrain.cli fps ...                 a restart after a rank died resumes by
                                                                     itself (--resume auto under torchrun)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from fpsfl.base.checkpoint import CheckpointError, load_checkpoint
from fpsfl.base.cli import (
    Parser,
    UsageError,
    add_set_flag,
    add_settings,
    parse_settings,
    run_main,
    settings_from,
    writable_file,
)
from fpsfl.base.configfile import ConfigFileError, read_sections, typed
from fpsfl.base.device import device_name
from fpsfl.base.rundir import RunDirError
from fractals.ifs import BankError

from . import distributed
from .backbones import BackboneError, check_backbone
from .folder import FolderError
from .methods import METHODS
from .recipe import DEFAULT_RECIPE, RECIPES, PretrainConfig, RunOptions, default_run_dir
from .sources import SOURCES
from .train import TrainingError, train

# each source's subcommand, and back (fractal-single is fractal-simsiam: the paper's "fractal + SimSiam")
COMMANDS = {name: spec.cli_name for name, spec in SOURCES.items()}
ALIASES = {command: name for name, command in COMMANDS.items() if command != name}


def _method_args(pairs: list[str], lr: float | None) -> dict[str, str]:
    args = parse_settings(pairs)
    if lr is not None:
        args["lr"] = str(lr)
    return args


# a run's config.json records these beside its [pretrain] table, resolved from it: read, never set
RECORDED = ("method", "base_lr", "steps_per_epoch", "n_classes", "data")  # derived, and the data fingerprint


def file_settings(path: Path | None) -> tuple[dict, dict, dict]:
    """A --config file's [pretrain] values, its method settings ([method], or a run's method_args, which
    were its --set and --lr) and its [run] options; nothing without a file."""
    if path is None:
        return {}, {}, {}
    tables = read_sections(path, ("pretrain", "method", "run"), recorded=RECORDED)
    where = f"--config {path}"
    values = typed(PretrainConfig, tables.get("pretrain", {}), f"{where}: [pretrain]", skip=("method_args",))
    method = {**values.pop("method_args", {}), **tables.get("method", {})}
    return values, method, typed(RunOptions, tables.get("run", {}), f"{where}: [run]")


def with_source_command(argv: list[str]) -> list[str]:
    """``pretrain --config FILE ...``: the subcommand of the file's source put first (default fps)."""
    if not argv or not argv[0].startswith("--config"):
        return argv
    path = argv[0].partition("=")[2] or (argv[1] if len(argv) > 1 else "")
    if not path:
        raise UsageError("--config expects a FILE")
    source = file_settings(Path(path))[0].get("source", "fps")
    if source not in SOURCES:
        raise UsageError(f"--config {path}: unknown source {source!r}; choose from {', '.join(SOURCES)}")
    return [COMMANDS.get(source, source), *argv]


def cmd_train(args: argparse.Namespace) -> None:
    source = ALIASES.get(args.command, args.command)
    spec = SOURCES[source]
    file, file_method, file_run = file_settings(args.config)
    file_source, file_method_name = file.pop("source", source), file.pop("method", None)
    # a --config file's missing keys keep the dataclass defaults (what its run had) unless --recipe is given
    preset = RECIPES[args.recipe or ("official" if args.config else DEFAULT_RECIPE)]
    applies = preset.method in spec.methods  # the self-supervised sources
    method = (args.method or (file_method_name if file_source == source else None)
              or (preset.method if applies else spec.methods[0]))
    if file_source != source or method != (file_method_name or method):  # the file's settings are another's
        file_method = {}
    values = {**file, **settings_from(args, PretrainConfig)}
    preset_values, preset_args = preset.settings(source, method) if applies else ({}, {})
    values = {**preset_values, **values}
    if "folder" in spec.groups and not values.get("root"):
        raise UsageError(f"pretrain {args.command} needs --root DIR (an image folder)")
    if not spec.rendered:
        values["pairs_per_epoch"] = 1  # an epoch is one pass over the folder
    method_args = {**preset_args, **file_method, **_method_args(args.set, args.lr)}
    cfg = PretrainConfig(source=source, method=method, method_args=method_args, **values)
    if spec.rendered and cfg.size < 16:
        raise UsageError(f"--size must be at least 16 px for rendered fractals, got {cfg.size}")
    check_backbone(cfg.arch, cfg.width, cfg.size)
    opts = RunOptions(**{**file_run, **settings_from(args, RunOptions)})
    out = opts.out or Path(f"{args.command}-{cfg.arch.replace(':', '-')}.ckpt")
    opts = dataclasses.replace(opts, out=out, run_dir=opts.run_dir or default_run_dir(out))
    check_apart(out, opts.run_dir)
    writable_file(out)
    last = train(cfg, opts)
    if not distributed.from_env().main:  # under torchrun only rank 0 reports
        return
    if opts.profile:
        keys = ("epoch", "steps", "pairs_per_s", "data_wait", "augment_frac", "compute_frac", "seconds")
        setting = {k: getattr(cfg, k) for k in ("arch", "size", "batch_size", "method", "amp")}
        print(json.dumps({"profile": {k: last.get(k) for k in keys}, **setting,
                          "device": device_name(opts.device), "processes": distributed.from_env().world}))
    epoch, loss = load_checkpoint(out)["epoch"], last.get("loss", float("nan"))  # the file's own epoch
    print(f"wrote {out} ({cfg.arch}, {method} on {source}, epoch {epoch}/{cfg.epochs}, loss {loss:.4f}); "
          f"run directory {opts.run_dir}")


def check_apart(out: Path, run_dir: Path) -> None:
    """--out must lie outside --run-dir: inside it, it could replace state.pt or config.json, and the two
    must not be one path."""
    out_abs, run_abs = out.expanduser().resolve(), run_dir.expanduser().resolve()
    if out_abs == run_abs or run_abs in out_abs.parents:
        where = "is" if out_abs == run_abs else "lies inside"
        raise UsageError(f"--out {out} {where} the run directory {run_dir}; put the checkpoint outside it")


def _add_source_command(sub, name: str) -> None:
    """The subcommand of one source: the recipe's flags that apply to it, --method, --lr, --set, run flags."""
    spec = SOURCES[ALIASES.get(name, name)]
    p = sub.add_parser(name, help=spec.description, description=spec.description)
    unused = tuple(f.name for f in dataclasses.fields(PretrainConfig)
                   if f.metadata.get("group") and f.metadata["group"] not in spec.groups)
    add_settings(p, PretrainConfig, skip=unused)
    if RECIPES[DEFAULT_RECIPE].method in spec.methods:
        p.add_argument("--recipe", choices=tuple(RECIPES), default=None,
                       help="defaults of --method, its settings, --init-scale and (fps) how pairs are made: "
                            + "; ".join(f"{k}: {r.method}{r.flags()}, init x{r.init_scale:g}, {r.text}"
                                        for k, r in RECIPES.items())
                            + f" (default: {DEFAULT_RECIPE}; with --config, the file's run's own)")
    else:
        p.set_defaults(recipe=None)
    default = RECIPES[DEFAULT_RECIPE].method
    default = default if default in spec.methods else spec.methods[0]
    p.add_argument("--method", choices=spec.methods, default=None,
                   help=f"{' | '.join(spec.methods)} (default: {default}, from --recipe)")
    p.add_argument("--lr", type=float, default=None,
                   help="base learning rate per 256 samples, scaled with the batch (default: the method's; "
                        + ", ".join(f"{m} {METHODS[m].Config().lr}" for m in spec.methods) + ")")
    p.add_argument("--config", type=Path, metavar="FILE", default=None,
                   help="settings from a TOML file ([pretrain], [method], [run] tables, keys named as the "
                        "flags with underscores) or a run's config.json, which replays that run; flags "
                        "given beside it win; `pretrain --config FILE` takes the subcommand from the file "
                        "(docs/pretraining.md: config files)")
    add_set_flag(p, "a method setting, e.g. --set temperature=0.1 (repeatable; see docs/pretraining.md)")
    add_settings(p, RunOptions)
    p.set_defaults(run=cmd_train)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="pretrain", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for spec in SOURCES.values():
        _add_source_command(sub, spec.cli_name)
    return p


def main(argv: list[str] | None = None) -> int:
    errors = (BackboneError, CheckpointError, RunDirError, FolderError, BankError, ValueError)
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        argv = with_source_command(argv)
    except (UsageError, ConfigFileError) as exc:
        print(f"pretrain: error: {exc}", file=sys.stderr)
        return 2
    return run_main("pretrain", build_parser(), argv, errors, (TrainingError,))


if __name__ == "__main__":
    sys.exit(main())
