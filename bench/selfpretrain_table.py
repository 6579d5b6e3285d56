"""The table of bench/selfpretrain.sh: probes of each SP checkpoint against its starting point, and FedAvg
after SP against FedAvg without it, mean ± std over the seeds found in OUT (Chen et al. §5, Table 7).

Usage: python bench/selfpretrain_table.py OUT FT_ROUNDS TOTAL_ROUNDS
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def rows(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def acc_at(run: Path, rnd: int, last: int = 1) -> float | None:
    """Test accuracy (%) at round ``rnd``, or the mean of rounds rnd - last + 1 .. rnd (the test set is
    small and FedAvg at Dir(0.1) swings from round to round)."""
    found = [r["test_acc"] for r in rows(run) if rnd - last < r["round"] <= rnd]
    return 100 * sum(found) / last if len(found) == last else None


def stat(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    spread = f" ± {statistics.stdev(values):.1f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.1f}{spread} (n={len(values)})"


def main(out: Path, ft: int, total: int) -> None:
    fps_probe = json.loads((out / "probe-fps" / "probe.json").read_text())["rows"][0]["probe"] \
        if (out / "probe-fps" / "probe.json").exists() else None
    print(f"{'init':24s} {'probe kNN start -> SP':28s} {'linear start -> SP':28s} "
          f"{f'FedAvg {ft} no SP':18s} {f'SP + FedAvg {ft}':18s} {f'FedAvg {total} no SP':18s}")
    for init in ("random", "fps-mocov2-resnet20-cpu-1m"):
        seeds = sorted({p.name.rsplit("-s", 1)[1].removesuffix(".run")
                        for p in out.glob(f"sp-{init}-s*.run")})
        knn, lin, knn0, lin0 = [], [], [], []
        for s in seeds:
            probe = out / f"probe-{init}-s{s}" / "probe.json"
            if probe.exists():
                row = json.loads(probe.read_text())["rows"][0]
                knn.append(100 * row["probe"]["knn_acc"])
                lin.append(100 * row["probe"]["linear_acc"])
                start = row["random_init"] if init == "random" else fps_probe
                if start is not None:
                    knn0.append(100 * start["knn_acc"])
                    lin0.append(100 * start["linear_acc"])
        print(f"{init:24s} {stat(knn0) + ' -> ' + stat(knn):28s} {stat(lin0) + ' -> ' + stat(lin):28s}")
        for last in (1, 3):
            no_sp = [acc_at(out / f"ft-{init}-s{s}", ft, last) for s in seeds]
            with_sp = [acc_at(out / f"ft-sp-{init}-s{s}", ft, last) for s in seeds]
            long = [acc_at(out / f"ft-{init}-s{s}", total, last) for s in seeds]
            what = "last round" if last == 1 else f"mean of the last {last} rounds"
            print(f"  {what:53s}  {stat(no_sp):18s} {stat(with_sp):18s} {stat(long):18s}")
            for s, a, b, c in zip(seeds, no_sp, with_sp, long, strict=True):
                print(f"    seed {s}: FedAvg {ft} {a}, SP + FedAvg {ft} {b}, FedAvg {total} {c}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
