"""FedAvg vs optimal convex aggregation (Eq. 4, Fig. 7) and loss variance over lambda (Figs. 8, 13, 18).

Chen et al., ICLR 2023, §6.2. Both read what ``federate --track convex,variance`` logged. A run that
tracked nothing but kept client models (``--save-local-models``) is analysed from those instead, with the
same code (:class:`federated.oracle.tracking.Tracker`). Both are oracle analyses on the test set, as in
the paper.
"""

from __future__ import annotations

import argparse

import numpy as np

from federated.oracle.tracking import SEARCH, TrackConfig, Tracker
from fpsfl.base.cli import TEXT, add_settings, settings_from

from .output import FORCE_HELP, OUT_HELP, new_figure, output_dir, save_figure, write_json
from .runs import AnalysisError, Run, load_runs, rebuild


def _from_local_models(run: Run, kind: str, args: argparse.Namespace) -> list[dict]:
    """Metrics rows with ``kind`` computed from the run's saved client models."""
    rounds = run.local_rounds()
    if not rounds:
        raise AnalysisError(f"{run.path} tracked no {kind} and saved no client models; re-run federate with "
                            f"--track {kind} --track-every K (or --save-local-models R1,R2)")
    s = rebuild(run, args.device)
    cfg = TrackConfig(**settings_from(args, TrackConfig), track=(kind,), every=1)
    tracker = Tracker(cfg, s.model, s.task, s.data, run.config.seed)
    device = next(s.model.parameters()).device
    rows = []
    for rnd in rounds:
        states, sizes = run.local_states(rnd)
        states = [{k: v.to(device) for k, v in st.items()} for st in states]
        record, _ = tracker(rnd, states, sizes)
        print(f"{run.name}: round {rnd} computed from {len(states)} saved client models")
        rows.append({"round": rnd, **record})
    return rows


def tracked_rows(run: Run, kind: str, args: argparse.Namespace) -> list[dict]:
    """The run's ``kind`` results per tracked round, flattened: {"round", **results}."""
    rows = run.rows_with(kind) or _from_local_models(run, kind, args)
    return [{"round": r["round"], **r[kind]} for r in rows]


def cmd_convex(args: argparse.Namespace) -> None:
    runs = load_runs(args.runs)
    # before the (possibly long) analysis: a bad --out fails now
    out = output_dir(args.out, runs, writes=("convex.png", "convex.json"), force=args.force)
    series = {run.name: tracked_rows(run, "convex", args) for run in runs}
    fig, (ax, gx) = new_figure(2)
    for i, (name, rows) in enumerate(series.items()):
        t = [r["round"] for r in rows]
        ax.plot(t, [r["fedavg_acc"] for r in rows], "-o", ms=3, color=f"C{i}", label=f"{name}: FedAvg")
        ax.plot(t, [r["convex_acc"] for r in rows], "--s", ms=3, color=f"C{i}",
                label=f"{name}: optimal convex")
        gx.plot(t, [r["convex_acc"] - r["fedavg_acc"] for r in rows], "-o", ms=3, color=f"C{i}", label=name)
    ax.set(xlabel="round", ylabel="test accuracy", title="FedAvg vs optimal convex aggregation (oracle)")
    gx.set(xlabel="round", ylabel="accuracy gap", title="optimal convex − FedAvg")
    ax.legend(fontsize=7)
    gx.legend(fontsize=7)
    save_figure(fig, out / "convex.png")
    write_json(out / "convex.json", series)
    for name, rows in series.items():
        gaps = [r["convex_acc"] - r["fedavg_acc"] for r in rows]
        print(f"{name}: mean gap {np.mean(gaps):+.4f} (max {max(gaps):+.4f}) over {len(rows)} tracked rounds")
    print(f"wrote {out / 'convex.png'} and convex.json")


def _hist_rounds(text: str | None, rows: list[dict]) -> list[int]:
    tracked = [r["round"] for r in rows]
    if not text:
        return tracked[-3:]  # the last three tracked rounds
    wanted = [int(t) for t in text.split(",") if t.strip()]
    missing = sorted(set(wanted) - set(tracked))
    if missing:
        raise AnalysisError(f"--hist-rounds {', '.join(map(str, missing))} were not tracked (tracked: "
                            f"{', '.join(map(str, tracked))})")
    return wanted


def cmd_variance(args: argparse.Namespace) -> None:
    runs = load_runs(args.runs)
    out = output_dir(args.out, runs, writes=("variance.png", "variance_hist.png", "variance.json"),
                     force=args.force)
    series = {run.name: tracked_rows(run, "variance", args) for run in runs}
    fig, (ax, vx) = new_figure(2)
    for i, (run, (name, rows)) in enumerate(zip(runs, series.items(), strict=True)):
        color = f"C{i}"
        ax.plot([r["round"] for r in run.metrics], [r["test_loss"] for r in run.metrics], "-", color=color,
                label=f"{name}: global test loss")
        t = [r["round"] for r in rows]
        ax.fill_between(t, [r["p2_5"] for r in rows], [r["p97_5"] for r in rows], color=color, alpha=0.25,
                        label=f"{name}: 95% over λ")
        vx.plot(t, [r["var"] for r in rows], "-o", ms=3, color=color, label=name)
    ax.set(xlabel="round", ylabel="test loss", title="test loss of λ-combinations, λ ~ Dir(1)")
    vx.set(xlabel="round", ylabel="variance", yscale="log", title="loss variance over λ")
    ax.legend(fontsize=7)
    vx.legend(fontsize=7)
    save_figure(fig, out / "variance.png")
    first = next(iter(series.values()))
    hist_rounds = _hist_rounds(args.hist_rounds, first)
    fig, axes = new_figure(len(hist_rounds))
    for ax, rnd in zip(axes, hist_rounds, strict=True):
        for i, (name, rows) in enumerate(series.items()):
            row = next((r for r in rows if r["round"] == rnd), None)
            if row is not None:
                ax.hist(row["losses"], bins=30, color=f"C{i}", alpha=0.5, label=name)
        ax.set(xlabel="test loss", ylabel="count", title=f"round {rnd}")
        ax.legend(fontsize=7)
    save_figure(fig, out / "variance_hist.png")
    write_json(out / "variance.json", series)
    for name, rows in series.items():
        last = rows[-1]
        print(f"{name}: round {last['round']}: loss mean {last['mean']:.4f}, 95% [{last['p2_5']:.4f}, "
              f"{last['p97_5']:.4f}], variance {last['var']:.3g}")
    print(f"wrote {out / 'variance.png'}, variance_hist.png and variance.json")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="*", metavar="RUN", help="federate run directories (drawn on one figure)")
    p.add_argument("--out", type=TEXT, help=OUT_HELP)
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--device", type=TEXT, default="auto",
                   help="for runs analysed from saved client models (default auto)")
    group = p.add_argument_group("for runs analysed from saved client models (--save-local-models) rather "
                                 "than tracked ones")
    add_settings(group, TrackConfig, only=SEARCH)


def register(sub) -> None:
    p = sub.add_parser("convex", help="FedAvg vs optimal convex aggregation (Eq. 4, Fig. 7; oracle on test)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
    p.set_defaults(run=cmd_convex)
    p = sub.add_parser("variance", help="test loss over λ ~ Dirichlet(1) (Figs. 8, 13, 18; oracle on test)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
    p.add_argument("--hist-rounds", metavar="R1,R2", help="rounds of the histograms (default: the last "
                   "three tracked)")
    p.set_defaults(run=cmd_variance)
