"""Training dynamics: local and global gain per round (Chen et al., ICLR 2023, §6.1, Eq. 3, Fig. 6).

With theta_bar_t the global model after round t and theta_m the local models of round t (trained from
theta_bar_{t-1}), weighted by data size p_m = |D_m| / |D|:

    local gain   ΔL_t = sum_m p_m Acc(theta_m) - Acc(theta_bar_{t-1})
    global gain  ΔG_t = Acc(theta_bar_t) - sum_m p_m Acc(theta_m)

so Acc(theta_bar_{t-1}) + ΔL_t + ΔG_t = Acc(theta_bar_t). ``federate`` logs the weighted local accuracy
(``local_acc``) every round and the initial model's accuracy (``init_test_acc``) in round 1.
"""

from __future__ import annotations

import argparse

from fpsfl.base.cli import TEXT

from .output import FORCE_HELP, OUT_HELP, new_figure, output_dir, save_figure, write_json
from .runs import AnalysisError, Run, load_runs


def gains(rows: list[dict]) -> list[dict]:
    """Per round: prev (global acc before), local (weighted local acc), global (after), d_local, d_global.

    Round 1 needs ``init_test_acc``; rows without ``local_acc`` are an error (the run skipped it)."""
    out = []
    prev = rows[0].get("init_test_acc") if rows else None
    for row in rows:
        if "local_acc" not in row:
            raise AnalysisError("the run logged no local accuracy (it ran with --no-eval-local); re-run "
                                "federate without --no-eval-local")
        if prev is not None:
            local, glob = row["local_acc"], row["test_acc"]
            out.append({"round": row["round"], "prev": prev, "local": local, "global": glob,
                        "d_local": local - prev, "d_global": glob - local})
        prev = row["test_acc"]
    return out


def _federated(run: Run) -> list[dict]:
    if run.config.centralized:
        raise AnalysisError(f"{run.path} is a centralised run; dynamics needs a federated run")
    try:
        return gains(run.metrics)
    except AnalysisError as exc:
        raise AnalysisError(f"{run.path}: {exc}") from None


def plot_dynamics(series: dict[str, list[dict]], path) -> None:
    """Fig. 6: global accuracy (x) at round t, mean local accuracy (•) half a round earlier, and arrows
    global(t-1) -> local(t) (local gain) -> global(t) (global gain); right: the gains per round."""
    fig, (ax, gx) = new_figure(2)
    for i, (name, rows) in enumerate(series.items()):
        color = f"C{i}"
        t = [r["round"] for r in rows]
        ax.plot([t[0] - 1] + t, [rows[0]["prev"]] + [r["global"] for r in rows], "x", color=color,
                label=f"{name}: global")
        ax.plot([x - 0.5 for x in t], [r["local"] for r in rows], "o", color=color, ms=3,
                label=f"{name}: mean local")
        for r in rows:
            x = r["round"]
            ax.annotate("", (x - 0.5, r["local"]), (x - 1, r["prev"]),
                        arrowprops={"arrowstyle": "->", "color": color, "alpha": 0.5, "lw": 0.8})
            ax.annotate("", (x, r["global"]), (x - 0.5, r["local"]),
                        arrowprops={"arrowstyle": "->", "color": color, "lw": 0.8})
        gx.plot(t, [r["d_local"] for r in rows], "--", color=color, label=f"{name}: ΔL")
        gx.plot(t, [r["d_global"] for r in rows], "-", color=color, label=f"{name}: ΔG")
    ax.set(xlabel="round", ylabel="test accuracy", title="global (x) and mean local (•) accuracy")
    gx.axhline(0, color="grey", lw=0.5)
    gx.set(xlabel="round", ylabel="gain", title="local gain ΔL and global gain ΔG")
    ax.legend(fontsize=7)
    gx.legend(fontsize=7)
    save_figure(fig, path)


def cmd_dynamics(args: argparse.Namespace) -> None:
    runs = load_runs(args.runs)
    out = output_dir(args.out, runs, writes=("dynamics.png", "dynamics.json"), force=args.force)
    series = {run.name: _federated(run) for run in runs}
    plot_dynamics(series, out / "dynamics.png")
    write_json(out / "dynamics.json", series)
    for name, rows in series.items():
        if rows:
            mean_l = sum(r["d_local"] for r in rows) / len(rows)
            mean_g = sum(r["d_global"] for r in rows) / len(rows)
            print(f"{name}: mean local gain {mean_l:+.4f}, mean global gain {mean_g:+.4f} over "
                  f"{len(rows)} rounds")
    print(f"wrote {out / 'dynamics.png'} and dynamics.json")


def register(sub) -> None:
    p = sub.add_parser("dynamics", help="local/global gain per round (Eq. 3, Fig. 6)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", metavar="RUN", help="federate run directories (drawn on one figure)")
    p.add_argument("--out", type=TEXT, help=OUT_HELP)
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.set_defaults(run=cmd_dynamics)
