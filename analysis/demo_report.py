"""The demo's ``report.md``: Table-2-style numbers, figures, timings and an honest reading of them.

Chen et al., ICLR 2023, Table 2 (Federated, Centralised, ΔCL-FL per init), Fig. 6 (dynamics), Fig. 7
(convex gap) and Fig. 8 (loss variance). Whether FPS helped is computed from the runs, never assumed.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np

from .cli import main as analyze
from .output import new_figure, save_figure
from .report import build_tables, final_entry, to_markdown
from .runs import AnalysisError, Run, load_runs

NOISE = 1.0  # accuracy points: below this, one seed cannot tell two inits apart on digits' 360 test images


def _analyses(fl: list[Run], fig: Path) -> dict[str, float]:
    seconds = {}
    for command in ("dynamics", "convex", "variance"):
        t0 = time.perf_counter()
        if analyze([command, *[str(r.path) for r in fl], "--out", str(fig)]) != 0:
            raise AnalysisError(f"analyze {command} failed on {', '.join(str(r.path) for r in fl)}")
        seconds[f"analyze {command}"] = time.perf_counter() - t0
    return seconds


def plot_accuracy(runs: list[Run], path: Path) -> None:
    """Test accuracy per round (a centralised 'round' is local-epochs epochs on the union of clients)."""
    fig, (ax,) = new_figure()
    for i, run in enumerate(runs):
        style = "--" if run.config.centralized else "-"
        ax.plot([r["round"] for r in run.metrics], [r["test_acc"] for r in run.metrics], style,
                color=f"C{i // 2}", label=run.name)
    ax.set(xlabel="round", ylabel="test accuracy", title="global test accuracy (dashed: centralised)")
    ax.legend(fontsize=7)
    save_figure(fig, path)


def _final(runs: list[Run], name: str) -> float | None:
    run = next((r for r in runs if r.name == name), None)
    return None if run is None else run.metrics[-1]["test_acc"]


def _verdict(diff: float) -> str:
    if abs(diff) < NOISE:
        return f"No clear difference at this budget (under {NOISE:g} point, within seed-to-seed noise)."
    return ("FPS pre-training helped at this budget." if diff > 0 else
            "FPS pre-training did **not** help at this budget.")


def reading(runs: list[Run], note: str) -> list[str]:
    """What the numbers say, computed from them, and how the budget differs from the paper's."""
    fl_random, fl_fps = _final(runs, "fl-random"), _final(runs, "fl-fps")
    cl_random, cl_fps = _final(runs, "cl-random"), _final(runs, "cl-fps")
    diff = 100 * (fl_fps - fl_random)
    lines = [f"- Federated: FPS init {100 * fl_fps:.1f}% vs random init {100 * fl_random:.1f}% "
             f"({diff:+.1f} points, one seed). " + _verdict(diff)]
    gap_r, gap_f = 100 * (cl_random - fl_random), 100 * (cl_fps - fl_fps)
    lines.append(f"- ΔCL-FL (centralised − federated): random {gap_r:.1f} points, FPS {gap_f:.1f} points. "
                 "The paper finds pre-training shrinks this gap; " +
                 ("here the difference is within noise." if abs(gap_f - gap_r) < NOISE else
                  "so it does here." if gap_f < gap_r else "here it does not."))
    for run in runs:
        convex = [r["convex"]["convex_acc"] - r["convex"]["fedavg_acc"] for r in run.rows_with("convex")]
        variance = run.rows_with("variance")
        if convex and variance:
            lines.append(f"- {run.name}: optimal convex aggregation beats FedAvg by "
                         f"{100 * np.mean(convex):.1f} points on average over {len(convex)} tracked rounds "
                         "(an oracle on the test set); "
                         f"test-loss variance over λ at round {variance[-1]['round']}: "
                         f"{variance[-1]['variance']['var']:.3g}.")
    lines.append(f"- Budget: {note}. The paper's gains come from its full budget; a tiny pre-training run "
                 "mostly teaches low-level filters, so expect smaller or no gains here.")
    return lines


def write_report(out: Path, steps, budget, budget_name: str, t0: float) -> str:
    """Run the analyses, write ``out/report.md``; returns the markdown table."""
    fig = out / "figures"
    fig.mkdir(parents=True, exist_ok=True)
    runs = load_runs([str(s.extra["run"]) for s in steps if s.extra])
    fl = [r for r in runs if not r.config.centralized]
    seconds = {s.name: s.seconds for s in steps}
    seconds.update(_analyses(fl, fig))
    table = to_markdown(build_tables([final_entry(r) for r in runs]))
    table = table.split("\n", 1)[1].lstrip()  # our own title below
    plot_accuracy(runs, fig / "accuracy.png")
    shutil.copyfile(fl[0].path / "partition.png", fig / "partition.png")
    timing = ["| step | seconds |", "|---|---:|"] + [
        f"| {name} | {'done earlier' if s is None else f'{s:.0f}'} |" for name, s in seconds.items()]
    total = time.perf_counter() - t0
    md = [f"# fpsfl demo ({budget_name} budget)", "",
          "FPS pre-training vs random init for FedAvg on scikit-learn's digits (10 clients, Dir(α = 0.1), "
          "full participation, seed 0), after Chen et al., ICLR 2023, Table 2 and §6.", "",
          "## Results", "", table, "## What the numbers say", "", *reading(runs, budget.note), "",
          "## Figures", "",
          "Partition (clients × classes):", "", "![partition](figures/partition.png)", "",
          "Test accuracy per round:", "", "![accuracy](figures/accuracy.png)", "",
          "Training dynamics: local gain ΔL and global gain ΔG (Eq. 3, Fig. 6):", "",
          "![dynamics](figures/dynamics.png)", "",
          "FedAvg vs optimal convex aggregation (oracle on the test set; Eq. 4, Fig. 7):", "",
          "![convex](figures/convex.png)", "",
          "Test loss over λ ~ Dirichlet(1), 95% band, and its variance (Fig. 8):", "",
          "![variance](figures/variance.png)", "", "![variance histograms](figures/variance_hist.png)", "",
          "## Time", "", *timing, "", f"Total wall time of this invocation: {total:.0f} s.", ""]
    (out / "report.md").write_text("\n".join(md))
    return table
