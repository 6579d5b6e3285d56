"""``analyze budget``: how much FPS pre-training is needed (no paper publishes this curve).

For checkpoints of increasing pre-training budgets and federated runs started from them (and from random
init), draws against the number of FPS pairs seen (log scale): the kNN and linear probes of each
checkpoint's frozen backbone on digits (:mod:`pretrain.probe`), and the final federated test accuracy as
mean ± std over the seeds of the runs whose ``--init`` was that checkpoint; random init is a horizontal
line in both panels. ``recipes/budget.sh`` makes the inputs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from fpsfl.base.checkpoint import load_checkpoint
from fpsfl.base.device import resolve_device
from pretrain.probe import digits_probe

from .output import new_figure, output_dir, save_figure, write_json
from .probe import probe_checkpoint
from .runs import AnalysisError, Run, load_runs


def pairs_seen(path: str) -> int:
    """Pairs a checkpoint saw: its epoch times the pairs per epoch of its run."""
    ckpt = load_checkpoint(path)
    per_epoch = ckpt["config"].get("pretrain", {}).get("pairs_per_epoch")
    if not isinstance(per_epoch, int):
        raise AnalysisError(f"{path} does not record pairs_per_epoch; is it a fractal pre-training run?")
    return ckpt["epoch"] * per_epoch


def _final_accs(runs: list[Run]) -> list[float]:
    return [100 * run.metrics[-1]["test_acc"] for run in runs]


def budget_points(checkpoints: list[str], runs: list[Run], device: str, seed: int) -> dict:
    """Per checkpoint: pairs, probes and the federated accuracies of the runs it initialised."""
    data = digits_probe()
    points = []
    for path in checkpoints:
        probe = probe_checkpoint(path, data, None, resolve_device(device), seed)
        mine = [r for r in runs if Path(r.config.init).resolve() == Path(path).resolve()]
        points.append({"checkpoint": path, "pairs": pairs_seen(path), "knn_acc": probe["probe"]["knn_acc"],
                       "linear_acc": probe["probe"]["linear_acc"], "federated": _final_accs(mine),
                       "random_knn_acc": probe["random_init"]["knn_acc"],
                       "random_linear_acc": probe["random_init"]["linear_acc"]})
    points.sort(key=lambda p: p["pairs"])
    random = _final_accs([r for r in runs if r.config.init == "random"])
    return {"points": points, "random_federated": random}


def _mean_std(values: list[float]) -> tuple[float, float]:
    return (float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0)


def plot_budget(result: dict, path: Path) -> None:
    points = result["points"]
    x = [p["pairs"] for p in points]
    fig, (px, fx) = new_figure(2)
    px.plot(x, [100 * p["knn_acc"] for p in points], "-o", label="kNN probe")
    px.plot(x, [100 * p["linear_acc"] for p in points], "-s", label="linear probe")
    px.axhline(100 * points[0]["random_knn_acc"], color="C0", ls=":", label="random init, kNN")
    px.axhline(100 * points[0]["random_linear_acc"], color="C1", ls=":", label="random init, linear")
    px.set(xscale="log", xlabel="FPS pairs seen", ylabel="digits test accuracy (%)",
           title="frozen-feature probes on digits")
    fed = [_mean_std(p["federated"]) if p["federated"] else (np.nan, 0.0) for p in points]
    fx.errorbar(x, [m for m, _ in fed], yerr=[s for _, s in fed], fmt="-o", capsize=3,
                label="FedAvg from FPS init")
    if result["random_federated"]:
        m, s = _mean_std(result["random_federated"])
        fx.axhline(m, color="C3", ls=":", label=f"FedAvg from random init ({m:.1f} ± {s:.1f})")
    fx.set(xscale="log", xlabel="FPS pairs seen", ylabel="final test accuracy (%)",
           title="FedAvg on digits, mean ± std over seeds")
    px.legend(fontsize=7)
    fx.legend(fontsize=7)
    save_figure(fig, path)


def cmd_budget(args: argparse.Namespace) -> None:
    runs = load_runs(args.runs) if args.runs else []
    out = output_dir(args.out, [])
    result = budget_points(args.checkpoints, runs, args.device, args.seed)
    plot_budget(result, out / "budget.png")
    write_json(out / "budget.json", result)
    for p in result["points"]:
        fed = p["federated"]
        mean, std = _mean_std(fed) if fed else (0.0, 0.0)
        text = f"{mean:.1f} ± {std:.1f} (n={len(fed)})" if fed else "no runs"
        print(f"{p['pairs']:>10,} pairs: kNN {100 * p['knn_acc']:.1f}%, linear {100 * p['linear_acc']:.1f}%, "
              f"FedAvg {text}")
    print(f"wrote {out / 'budget.png'} and budget.json")


def register(sub) -> None:
    p = sub.add_parser("budget", help="probe and FedAvg accuracy against FPS pairs seen (pre-training "
                       "budget study)", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", metavar="CKPT", help="pretrain checkpoints of several budgets")
    p.add_argument("--runs", nargs="*", default=[], metavar="RUN",
                   help="federate run directories from those checkpoints and from random init")
    p.add_argument("--seed", type=int, default=0, help="seed of the random-init probe baseline (default 0)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    p.add_argument("--out", help="output folder (default ./analysis)")
    p.set_defaults(run=cmd_budget)
