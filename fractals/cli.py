"""fractals: sample IFS code banks, preview FPS pairs and benchmark the renderer.

Chen et al., ICLR 2023, §4.2 and Appendix A.1 (Fractal Pair Similarity); codes after Anderson & Farrell 2022.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from fpsfl.base.cli import (
    INT,
    SEED,
    TEXT,
    Parser,
    UsageError,
    add_set_flag,
    parse_settings,
    positive,
    run_main,
    writable_file,
)
from fpsfl.base.settings import override
from fpsfl.base.views import ViewSettings

from .ifs import PAPER_BANK, BankError, bank_or_sample, sample_codes, save_bank
from .preview import make_cells, write_grid
from .scenes import COLOURS, INSTANCES, LOOKS, RenderConfig, fps_pairs
from .stats import COVERED, OFFICIAL_32PX, STATS, view_stats
from .stream import KINDS
from .throughput import measure


def _size(value: int) -> int:
    if value < 16:
        raise UsageError(f"--size must be at least 16 px, got {value}")
    return value


def cmd_bank(args: argparse.Namespace) -> None:
    positive("--n", args.n)
    writable_file(Path(args.out))
    bank = sample_codes(args.n, args.seed)
    save_bank(bank, args.out)
    print(f"wrote {len(bank)} codes (seed {args.seed}) to {args.out}")


def cmd_preview(args: argparse.Namespace) -> None:
    positive("--n", args.n)
    cfg = RenderConfig.preset(_size(args.size), look=args.look, instances=args.instances,
                              colours=args.colours)
    views = override(ViewSettings, parse_settings(args.set), "fractals preview --set")
    writable_file(Path(args.out))
    images = make_cells(args.kind, bank_or_sample(args.bank, args.seed), cfg, args.n, args.seed,
                        args.augs or bool(args.set), views.views())
    height, width = write_grid(images, args.out)
    print(f"wrote {args.out} ({width}x{height} px, {args.n} {args.kind} cells)")


def cmd_stats(args: argparse.Namespace) -> None:
    positive("--pairs", args.pairs)
    cfg = RenderConfig.preset(_size(args.size), look=args.look, instances=args.instances)
    views, _, _ = fps_pairs(bank_or_sample(args.bank, args.seed), cfg, args.pairs,
                            np.random.default_rng(args.seed))
    record = {"look": args.look, "instances": args.instances, "size": cfg.size, "pairs": args.pairs,
              **view_stats(views.reshape(-1, cfg.size, cfg.size, 3))}
    if cfg.size == 32:
        record["official_32px"] = OFFICIAL_32PX
    if args.json:
        print(json.dumps(record))
        return
    print(f"{args.look} look, {args.instances} instances, {args.pairs} pairs at {cfg.size} px "
          f"(covered: max(R, G, B) > {COVERED}):")
    for name in STATS:
        official = f"   official {OFFICIAL_32PX[name]:.3f}" if cfg.size == 32 else ""
        print(f"  {name:<20} {record[name]:.3f}{official}")


def cmd_bench(args: argparse.Namespace) -> None:
    if args.pairs is None:
        args.pairs = 100_000 if args.size <= 32 else 1000
    positive("--pairs", args.pairs)
    positive("--workers", args.workers)
    bank = bank_or_sample(args.bank, args.seed)
    record = {**measure(bank, _size(args.size), args.pairs, args.workers, args.augs, args.seed,
                       progress=not args.json, look=args.look, instances=args.instances),
              "look": args.look, "instances": args.instances}
    if args.json:
        print(json.dumps(record))
    else:
        print(f"{record['pairs_per_s']:.0f} pairs/s at {record['size']} px "
              f"({'with' if record['augs'] else 'no'} image augs, {record['workers']} worker(s)); "
              f"{record['ns_per_point']:.2f} ns per chaos-game point, all work included")


def _instances_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--instances", choices=INSTANCES, default="shared",
                        help="shared: each code of a pair is rendered once and both views place that grey "
                             "instance with their own colour, flips, size, placement and blur (the official "
                             "generator; default); independent: each view renders its own instance")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="fractals", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    b = sub.add_parser("bank", help="sample a bank of IFS codes to an .npz file")
    b.add_argument("--n", type=INT, default=PAPER_BANK, help="number of codes (default: 100000, the paper's)")
    b.add_argument("--seed", type=SEED, default=0, help="sampling seed; one seed gives identical bytes")
    b.add_argument("--out", type=TEXT, required=True, help="output .npz path (plain arrays, no pickles)")
    b.set_defaults(run=cmd_bank)

    v = sub.add_parser("preview", help="write a PNG grid of rendered samples (views side by side)")
    v.add_argument("--kind", choices=KINDS, default="fps",
                   help="fps: FPS pairs; multilabel: multi-label images; single: one fractal, two augmented "
                        "views (default: fps)")
    v.add_argument("--size", type=INT, default=32, help="image side in px, >= 16; 32 and 224 are the paper's")
    v.add_argument("--n", type=INT, default=8, help="number of pairs/images (default: 8)")
    v.add_argument("--seed", type=SEED, default=0, help="random seed (default: 0)")
    v.add_argument("--bank", type=TEXT, help="code bank .npz (default: sample 100K codes from --seed)")
    v.add_argument("--augs", action="store_true", help="also apply the image-level augmentations (the "
                   "official views', MoCo-v2's, unless --set changes them)")
    add_set_flag(v, "a setting of the views' augmentation, as pretrain --set takes it (implies --augs): "
                 + ", ".join(f"{f.name} (default {f.default})" for f in dataclasses.fields(ViewSettings)))
    v.add_argument("--out", type=TEXT, default="preview.png", help="output PNG path (default: preview.png)")
    v.add_argument("--look", choices=LOOKS, default="paper", help="paper: the official generator's "
                   "(default); sparse: this project's first renderer")
    _instances_flag(v)
    v.add_argument("--colours", choices=COLOURS, default="own",
                   help="own: each view colours every fractal with its own hue, saturation and value (the "
                        "official generator; default); shared: both views of a pair colour it alike")
    v.set_defaults(run=cmd_preview)

    t = sub.add_parser("stats", help="coverage, adjacent colour difference, mean colour and value of FPS "
                       "views (no image-level augmentation), against the official generator's")
    t.add_argument("--look", choices=LOOKS, default="paper", help="paper (default) | sparse")
    _instances_flag(t)
    t.add_argument("--size", type=INT, default=32, help="image side in px (default 32)")
    t.add_argument("--pairs", type=INT, default=200, help="pairs rendered (default 200)")
    t.add_argument("--seed", type=SEED, default=0, help="random seed (default: 0)")
    t.add_argument("--bank", type=TEXT, help="code bank .npz (default: sample 100K codes from --seed)")
    t.add_argument("--json", action="store_true", help="print one JSON line instead of a sentence")
    t.set_defaults(run=cmd_stats)

    m = sub.add_parser("bench", help="measure FPS pair throughput (one worker = one core)")
    m.add_argument("--size", type=INT, default=32,
                   help="image side in px: 32 (1K points a fractal) or 224 (100K points)")
    m.add_argument("--augs", action="store_true", help="include the image-level augmentations (on CPU)")
    m.add_argument("--pairs", type=INT, default=None,
                   help="pairs to time (default: 100000 at 32 px, 1000 at larger sizes)")
    m.add_argument("--workers", type=INT, default=1,
                   help="DataLoader worker processes (default: 1, i.e. one core)")
    m.add_argument("--seed", type=SEED, default=0, help="random seed (default: 0)")
    m.add_argument("--bank", type=TEXT, help="code bank .npz (default: sample 100K codes from --seed)")
    m.add_argument("--look", choices=LOOKS, default="paper", help="paper: the official generator's "
                   "(default); sparse: this project's first renderer")
    _instances_flag(m)
    m.add_argument("--json", action="store_true", help="print one JSON line instead of a sentence")
    m.set_defaults(run=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    return run_main("fractals", parser, argv, (BankError, ValueError))


if __name__ == "__main__":
    sys.exit(main())
