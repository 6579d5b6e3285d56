"""The demo's ``report.md``: Table-2-style numbers, figures, timings and an honest reading of them.

Chen et al., ICLR 2023, Table 2 (Federated, Centralised, ΔCL-FL per init), Fig. 6 (dynamics), Fig. 7
(convex gap) and Fig. 8 (loss variance). Whether FPS helped is computed from the runs, never assumed.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis.cli import main as analyze
from analysis.output import new_figure, save_figure
from analysis.report import build_tables, final_entry, to_markdown
from analysis.runs import AnalysisError, Run, load_runs

NOISE = 1.0  # accuracy points: below this, one seed cannot tell two inits apart on digits' 360 test images
TAIL = 3  # rounds: the last rounds averaged next to the final one, since one round can swing by points
VARIANCE_NOISE = 0.1  # relative: loss variances within 10% are not told apart (one seed, 50 λ samples)


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


@dataclass(frozen=True)
class Curve:
    """A run's test accuracy in points: the final round, the mean and std of the last TAIL rounds."""
    final: float
    tail_mean: float
    tail_std: float

    @classmethod
    def of(cls, run: Run) -> Curve:
        accs = 100 * np.array([r["test_acc"] for r in run.rows_with("test_acc")][-TAIL:])
        return cls(float(accs[-1]), float(accs.mean()), float(accs.std()))


def _curves(runs: list[Run]) -> dict[str, Curve]:
    return {run.name: Curve.of(run) for run in runs}


def _verdict(final_diff: float, tail_diff: float, noise: float) -> str:
    """Helped / did not help only when the last round and the last-rounds mean agree beyond the noise."""
    if abs(final_diff) < noise or abs(tail_diff) < noise or (final_diff > 0) != (tail_diff > 0):
        return (f"No clear difference at this budget: the gap is within the noise of one seed ({noise:.1f} "
                "points, the larger of 1 point and the runs' round-to-round spread) or changes sign.")
    return ("FPS pre-training helped at this budget." if final_diff > 0 else
            "FPS pre-training did **not** help at this budget.")


def reading(runs: list[Run], note: str) -> list[str]:
    """What the numbers say, computed from them, and how the budget differs from the paper's."""
    c = _curves(runs)
    fl_r, fl_f, cl_r, cl_f = c["fl-random"], c["fl-fps"], c["cl-random"], c["cl-fps"]
    noise = max(NOISE, fl_r.tail_std, fl_f.tail_std)
    final_diff, tail_diff = fl_f.final - fl_r.final, fl_f.tail_mean - fl_r.tail_mean
    lines = [f"- Federated: FPS init {fl_f.final:.1f}% vs random init {fl_r.final:.1f}% at the last round "
             f"({final_diff:+.1f} points); over the last {TAIL} rounds {fl_f.tail_mean:.1f}% vs "
             f"{fl_r.tail_mean:.1f}% ({tail_diff:+.1f}), with a round-to-round spread (std) of "
             f"{fl_f.tail_std:.1f} and {fl_r.tail_std:.1f} points. One seed. "
             + _verdict(final_diff, tail_diff, noise)]
    gap_r, gap_f = cl_r.final - fl_r.final, cl_f.final - fl_f.final
    lines.append(f"- ΔCL-FL (centralised − federated): random {gap_r:.1f} points, FPS {gap_f:.1f} points. "
                 "The paper finds pre-training shrinks this gap; "
                 + _agrees(gap_f - gap_r, noise, f"within {noise:.1f} points"))
    lines += _oracle_lines({r.name: r for r in runs})
    lines.append(f"- Budget: {note}. The paper's gains come from its full budget; a tiny pre-training run "
                 "mostly teaches low-level filters, so expect smaller or no gains here, and one seed on "
                 "360 test images can move by several points from round to round.")
    return lines


def _tracked(run: Run) -> tuple[float, float, int] | None:
    """(mean optimal-convex minus FedAvg accuracy in points, last loss variance over λ, its round)."""
    convex = [r["convex"]["convex_acc"] - r["convex"]["fedavg_acc"] for r in run.rows_with("convex")]
    variance = run.rows_with("variance")
    if not convex or not variance:
        return None
    return 100 * float(np.mean(convex)), variance[-1]["variance"]["var"], variance[-1]["round"]


def _oracle_lines(by_name: dict[str, Run]) -> list[str]:
    """§6.2's two findings, random init against each FPS init: pre-training leaves less to gain from a
    better convex combination (Fig. 7) and makes the loss less sensitive to the weights λ (Fig. 8)."""
    base = _tracked(by_name["fl-random"])
    lines = []
    for name in ("fl-fps", "fl-fps-paper"):
        other = _tracked(by_name[name]) if name in by_name else None
        if base is None or other is None:
            continue
        label = name.removeprefix("fl-")
        lines += [
            f"- Optimal convex aggregation minus FedAvg (an oracle on the test set, mean over the tracked "
            f"rounds): random {base[0]:.1f} points, {label} {other[0]:.1f} points. The paper finds "
            "pre-training shrinks this gap (§6.2, Fig. 7); "
            + _agrees(other[0] - base[0], NOISE, f"within {NOISE:g} point"),
            f"- Test-loss variance over λ ~ Dir(1) at round {other[2]}: random {base[1]:.3g}, {label} "
            f"{other[1]:.3g}. The paper finds pre-training lowers it (Fig. 8); "
            + _agrees((other[1] - base[1]) / max(base[1], 1e-12), VARIANCE_NOISE,
                      f"within {VARIANCE_NOISE:.0%}")]
    return lines


def _agrees(change: float, noise: float, within: str) -> str:
    """Whether an FPS-minus-random ``change`` goes the paper's way (down), beyond ``noise``."""
    if abs(change) < noise:
        return f"here the two are {within} of each other: too close to call with one seed."
    return "so it does here." if change < 0 else "here it does not."


def pretraining_line(out: Path) -> str:
    """The demo's pre-training run in one line: pairs seen, last loss and whether SimSiam collapsed."""
    rows = [json.loads(line) for line in (out / "fps.run" / "metrics.jsonl").read_text().splitlines()]
    config = json.loads((out / "fps.run" / "config.json").read_text())["config"]
    spread = 1 / math.sqrt(config["method"]["proj_dim"])  # z_std of l2-normalised outputs that spread
    last = rows[-1]
    state = "collapsed" if last["z_std"] < 0.1 * spread else "not collapsed"
    return (f"Pre-training (FPS + SimSiam, ResNet20, 32 px): {len(rows)} epochs × "
            f"{config['pretrain']['pairs_per_epoch']:,} pairs, last epoch's loss {last['loss']:.3f} (−1: the "
            f"two views agree perfectly), projector-output spread z_std {last['z_std']:.4f} ({state}; about "
            f"{spread:.3f} while the outputs spread, 0 when SimSiam collapses).")


def write_report(out: Path, steps, budget, budget_name: str, t0: float) -> str:
    """Run the analyses, write ``out/report.md``; returns the markdown table."""
    fig = out / "figures"
    fig.mkdir(parents=True, exist_ok=True)
    runs = load_runs([str(s.extra["run"]) for s in steps if s.extra])
    fl = [r for r in runs if not r.config.centralized]
    seconds = {s.name: s.seconds for s in steps}
    seconds.update(_analyses(fl, fig))
    table = to_markdown(build_tables([final_entry(r) for r in runs]), title=False, level=3)
    plot_accuracy(runs, fig / "accuracy.png")
    shutil.copyfile(fl[0].path / "partition.png", fig / "partition.png")
    timing = ["| step | seconds |", "|---|---:|"] + [
        f"| {name} | {'done earlier' if s is None else f'{s:.0f}'} |" for name, s in seconds.items()]
    total = time.perf_counter() - t0
    md = [f"# fpsfl demo ({budget_name} budget)", "",
          "FPS pre-training vs random init for FedAvg on scikit-learn's digits (10 clients, Dir(α = 0.1), "
          "full participation, seed 0), after Chen et al., ICLR 2023, Table 2 and §6.", "",
          "## Results", "",
          "Final-round test accuracy (%) on digits' 360 test images, one seed; ΔCL-FL = Centralised − "
          "Federated (Table 2's layout). A centralised 'round' is the same number of local epochs on the "
          "union of the clients' data.", "", table, pretraining_line(out), "",
          "## What the numbers say", "", *reading(runs, budget.note), "",
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
