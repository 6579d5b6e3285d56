"""``analyze budget``: how much FPS pre-training is needed (no paper publishes this curve).

For checkpoints of increasing pre-training budgets (several seeds per budget allowed) and federated runs
started from them (and from random init), draws against the number of FPS pairs seen (log scale):
- the kNN and linear probes of each checkpoint's frozen backbone (:mod:`pretrain.probe`) on a labelled set
  (digits by default; ``--dataset imagefolder --data-root DIR`` for natural images, e.g. a CIFAR-10 subset),
  as mean ± std over the checkpoints of one budget; the probe is fair by default (every backbone's
  BatchNorm statistics re-estimated on the probe's training images, ``--bn``), and random init is a band,
  mean ± std over ``--seeds`` random inits treated the same way;
- how far each checkpoint's deepest stage turned from its init (cosine to init, :mod:`pretrain.signals`);
- the label-free signals the pre-training run logged at the checkpoint's epoch (its ``metrics.jsonl``, or
  the checkpoint's own ``signals`` when the run directory is not beside it or lacks that epoch's line):
  RankMe (Garrido et al., ICML 2023) on held-out fractal views and SimSiam's ``z_std``;
- the final federated test accuracy, mean ± std over the seeds of the runs whose ``--init`` was one of
  that budget's checkpoints (the panel is left out when no run is given).
``recipes/budget.sh`` makes the inputs.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from fpsfl.base.checkpoint import load_checkpoint
from fpsfl.base.cli import TEXT
from fpsfl.base.device import resolve_device

from .output import FORCE_HELP, new_figure, output_dir, save_figure, write_json
from .probe import add_probe_flags, check_checkpoints, mean_std, probe_checkpoint, probe_data, random_baseline
from .runs import AnalysisError, Run, load_runs, read_metrics

SIGNALS = ("rankme", "z_std")  # the run's own per-epoch quality signals drawn beside the probes
# issue 38's bar for a budget study: the largest budget at least this far above the random inits' mean
MARGIN = 0.03  # accuracy (3 points)


def pairs_seen(ckpt: dict, path: str) -> int:
    """Pairs a checkpoint saw: its epoch times the pairs per epoch of its run."""
    per_epoch = ckpt["config"].get("pretrain", {}).get("pairs_per_epoch")
    if not isinstance(per_epoch, int):
        raise AnalysisError(f"{path} does not record pairs_per_epoch; is it a fractal pre-training run?")
    return ckpt["epoch"] * per_epoch


def run_signals(path: str, ckpt: dict, cache: dict[Path, list[dict]] | None = None) -> dict[str, float]:
    """RankMe and z_std of the checkpoint's epoch from the run directory beside it (fps.ckpt or a kept
    fps.e0004.ckpt -> fps.run/metrics.jsonl), else as the checkpoint itself records them (``signals``,
    written with it at that epoch: a run directory not copied, or its line lost); empty when neither has
    them. ``cache`` holds the records of the run directories read so far, so each is read (and warned
    about) once."""
    p = Path(path)
    run_dir = p.with_name(re.sub(r"\.e\d{4,}$", "", p.stem) + ".run")
    own = ckpt.get("signals") or {}
    fallback = {k: float(own[k]) for k in SIGNALS if isinstance(own.get(k), (int, float))}
    if not (run_dir / "metrics.jsonl").is_file():
        return fallback
    cache = {} if cache is None else cache
    if run_dir not in cache:  # a torn last line: no signals for it
        cache[run_dir] = list(read_metrics(run_dir, "pretrain", "epoch"))
    for record in cache[run_dir]:
        if record.get("epoch") == ckpt["epoch"]:
            return {k: float(record[k]) for k in SIGNALS if k in record}
    return fallback


def weights_digest(ckpt: dict) -> str:
    """sha256 of a checkpoint's backbone tensors (names, dtypes, shapes and bytes), to find the same
    weights under two names (a run's final file and its last kept epoch, or one seed run twice)."""
    h = hashlib.sha256()
    for name, t in sorted(ckpt["backbone"].items()):
        t = t.detach().cpu().contiguous().reshape(-1)
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _final_accs(runs: list[Run]) -> list[float]:
    return [100 * run.metrics[-1]["test_acc"] for run in runs]


def budget_points(checkpoints: list[str], runs: list[Run], data, device: str, seeds: list[int],
                  input_size: int | None = None, bn: str = "reestimate") -> dict:
    """Per budget (pairs seen): each checkpoint's probes, drift and signals, and the federated accuracies
    of the runs that any of its checkpoints initialised; the random baseline over ``seeds`` for the first
    checkpoint's architecture (a study has one)."""
    by_pairs: dict[int, list[dict]] = defaultdict(list)
    random, dev, records, seen = None, resolve_device(device), {}, {}
    for path in checkpoints:
        ckpt = load_checkpoint(path)
        digest = weights_digest(ckpt)
        if digest in seen:  # counted twice, it would be two seeds of one budget that agree exactly
            print(f"analyze: note: {path} holds the same weights as {seen[digest][0]}: counted once",
                  file=sys.stderr)
            seen[digest].append(path)  # a federated run from either name is one from these weights
            continue
        seen[digest] = [path]
        result = probe_checkpoint(path, data, input_size, dev, bn)
        if random is None:
            random = random_baseline(result["arch"], result["width"], data, result["input_size"], dev, seeds,
                                     bn)
        by_pairs[pairs_seen(ckpt, path)].append(
            {"checkpoint": path, "weights_sha256": digest,
             "seed": ckpt["config"].get("pretrain", {}).get("seed"), **result["probe"],
             "deepest_cos": result["deepest_cos"], **run_signals(path, ckpt, records)})
    points = []
    for pairs, members in sorted(by_pairs.items()):
        paths = {Path(p).resolve() for m in members for p in seen[m["weights_sha256"]]}
        mine = [r for r in runs if Path(r.config.init).resolve() in paths]
        points.append({"pairs": pairs, "checkpoints": members, "federated": _final_accs(mine),
                       **{k: [m[k] for m in members if k in m]
                          for k in ("knn_acc", "linear_acc", "deepest_cos", *SIGNALS)}})
    return {"points": points, "random_init": random,
            "random_federated": _final_accs([r for r in runs if r.config.init == "random"])}


def study_bar(budgets: list[tuple[int, float]], base: float, base_std: float,
              margin: float = MARGIN) -> list[str]:
    """Issue 38's bar for one probe of a budget study: ``budgets`` are (pairs seen, mean accuracy as a
    fraction) in increasing pairs; each budget must score at least the one before minus the random inits'
    std, and the largest at least ``margin`` above their mean. Returns each way it fails (empty: it holds)."""
    fails = [f"{now_pairs:,} pairs fell {100 * (prev - now):.1f} points below {prev_pairs:,} (random's std "
             f"{100 * base_std:.1f})"
             for (prev_pairs, prev), (now_pairs, now) in zip(budgets, budgets[1:], strict=False)
             if now < prev - base_std]
    if budgets and budgets[-1][1] < base + margin:
        fails.append(f"the largest budget's {100 * budgets[-1][1]:.1f}% is below random + {100 * margin:.0f} "
                     f"({100 * (base + margin):.1f}%)")
    return fails


def _band(ax, base: dict, key: str, color: str, label: str) -> None:
    """The random inits' mean ± std of ``key`` as a horizontal band."""
    m, s = 100 * base[key], 100 * base[f"{key}_std"]
    ax.axhline(m, color=color, ls=":", label=f"{label} ({m:.1f} ± {s:.1f})")
    ax.axhspan(m - s, m + s, color=color, alpha=0.12)


def _errorbar(ax, x, points, key, scale, **kw) -> None:
    stats = [mean_std([scale * v for v in p[key]]) for p in points]
    ax.errorbar(x, [m for m, _ in stats], yerr=[s for _, s in stats], capsize=3, **kw)


def _legend_over_twins(ax, twin) -> None:
    """One legend for a panel and its twinx, on the twin (drawn last, so no line crosses it), in headroom
    above every point of both: RankMe rises and the cosine falls with the budget, so a legend in any
    corner of the panel covered one of the two curves."""
    for a in (ax, twin):
        lo, hi = a.get_ylim()
        a.set_ylim(lo, hi + 0.35 * (hi - lo))
    handles = [h for a in (ax, twin) for h in a.get_legend_handles_labels()[0]]
    twin.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="upper center")


def plot_budget(result: dict, path: Path, dataset: str) -> None:
    points, base = result["points"], result["random_init"]
    x = [p["pairs"] for p in points]
    fed = any(p["federated"] for p in points) or bool(result["random_federated"])
    fig, axes = new_figure(3 if fed else 2)
    px, sx = axes[0], axes[1]
    _errorbar(px, x, points, "knn_acc", 100, fmt="-o", label="kNN probe")
    _errorbar(px, x, points, "linear_acc", 100, fmt="-s", label="linear probe")
    n = len(base["seeds"])
    _band(px, base, "knn_acc", "C0", f"random init, kNN, {n} seeds")
    _band(px, base, "linear_acc", "C1", f"random init, linear, {n} seeds")
    fair = "BatchNorm re-estimated" if base["bn"] == "reestimate" else "eval-mode BatchNorm (unfair)"
    px.set(xscale="log", xlabel="FPS pairs seen", ylabel=f"{dataset} test accuracy (%)",
           title=f"frozen-feature probes on {dataset}\n({fair}), mean ± std")  # two lines: one is clipped
    _errorbar(sx, x, points, "rankme", 1, fmt="-o", color="C2", label="RankMe (held-out fractal views)")
    sx.set(xscale="log", xlabel="FPS pairs seen", ylabel="RankMe of the backbone's features",
           title="label-free signals at the checkpoint")
    zx = sx.twinx()
    _errorbar(zx, x, points, "deepest_cos", 1, fmt="--s", color="C4", label="deepest stage's cosine to init")
    zx.set_ylabel("cosine to init (deepest stage)")
    _legend_over_twins(sx, zx)
    if fed:
        fx = axes[2]
        _errorbar(fx, x, points, "federated", 1, fmt="-o", label="FedAvg from FPS init")
        if result["random_federated"]:
            m, s = mean_std(result["random_federated"])
            fx.axhline(m, color="C3", ls=":", label=f"FedAvg from random init ({m:.1f} ± {s:.1f})")
        fx.set(xscale="log", xlabel="FPS pairs seen", ylabel="final test accuracy (%)",
               title="FedAvg, mean ± std over seeds")
        fx.legend(fontsize=7)
    px.legend(fontsize=7)
    save_figure(fig, path)


def _text(values: list[float], scale: float = 100) -> str:
    m, s = mean_std([scale * v for v in values])
    return f"{m:.1f}" + (f" ± {s:.1f}" if len(values) > 1 else "") if values else "–"


def cmd_budget(args: argparse.Namespace) -> None:
    runs = load_runs(args.runs) if args.runs else []
    check_checkpoints(args.checkpoints)
    data = probe_data(args.dataset, args.data_root, args.seed, args.folds)
    out = output_dir(args.out, runs, args.checkpoints, ("budget.png", "budget.json"), args.force)
    seeds = list(range(args.seed, args.seed + args.seeds))
    result = budget_points(args.checkpoints, runs, data, args.device, seeds, args.input_size, args.bn)
    result["dataset"], result["folds"] = args.dataset, data.folds
    base = result["random_init"]
    result["bar"] = {k: study_bar([(p["pairs"], float(np.mean(p[k]))) for p in result["points"]], base[k],
                                  base[f"{k}_std"]) for k in ("knn_acc", "linear_acc")}
    plot_budget(result, out / "budget.png", args.dataset)
    write_json(out / "budget.json", result)
    print(f"{'random init':>16s}: kNN {100 * base['knn_acc']:.1f} ± {100 * base['knn_acc_std']:.1f}%, linear "
          f"{100 * base['linear_acc']:.1f} ± {100 * base['linear_acc_std']:.1f}% ({len(seeds)} seeds, bn "
          f"{args.bn})"
          + (f", FedAvg {_text(result['random_federated'], 1)}" if result["random_federated"] else ""))
    for p in result["points"]:
        fed = f", FedAvg {_text(p['federated'], 1)}" if p["federated"] else ""
        print(f"{p['pairs']:>10,} pairs: kNN {_text(p['knn_acc'])}%, linear {_text(p['linear_acc'])}%, "
              f"cos to init {np.mean(p['deepest_cos']):.3f}, RankMe {_text(p['rankme'], 1)} "
              f"(n={len(p['checkpoints'])}){fed}")
    for key, name in (("knn_acc", "kNN"), ("linear_acc", "linear")):
        fails = result["bar"][key]
        print(f"{name}: the study's bar (each budget >= the one before - random's std, the largest >= "
              f"random + {100 * MARGIN:.0f}) " + ("holds" if not fails else "fails: " + "; ".join(fails)))
    print(f"wrote {out / 'budget.png'} and budget.json")


def register(sub) -> None:
    p = sub.add_parser("budget", help="probes, RankMe and FedAvg accuracy against FPS pairs seen "
                       "(pre-training budget study)", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", metavar="CKPT",
                   help="pretrain checkpoints of several budgets (several seeds of a budget are averaged)")
    p.add_argument("--runs", nargs="*", default=[], metavar="RUN",
                   help="federate run directories from those checkpoints and from random init")
    add_probe_flags(p)
    p.add_argument("--out", type=TEXT, help="output folder (default: analysis/ in the common parent of the "
                   "checkpoints and runs)")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.set_defaults(run=cmd_budget)
