"""Which frozen signal of an FPS checkpoint tells its FedAvg gain? (issue 38)

Chen et al. (ICLR 2023) measure pre-training by FedAvg fine-tuned from it (Table 6), not by frozen probes.
docs/fedavg-gain.json lists every FPS checkpoint we fine-tuned with bench/fps_fedavg.sh's arm over FL
seeds 0-2, with its signals. Per file the gain is its final accuracy minus random init's on the same
host and FL seed (each seed its own partition), averaged over the seeds. Per signal this prints
Spearman's rank correlation of the gain with the signal, over every file and over the CPU files alone,
with Holm's adjustment of the p-values over the signals (several signals are tried, so the smallest
raw p understates the chance of a spurious hit).

    python bench/fedavg_gain.py docs/fedavg-gain.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from scipy.stats import spearmanr

from fpsfl.base.cli import Parser, run_main

SIGNALS = ("layer3_cos", "knn", "linear", "digits_knn")


class BadTable(ValueError):
    """The JSON table is not usable as it stands."""


def gains(table: dict) -> list[float]:
    """Per file: mean over FL seeds of (its final accuracy - random init's, same host and seed)."""
    out = []
    for f in table["files"]:
        base = table["random"].get(f["host"])
        if base is None:
            raise BadTable(f"{f['name']}: no random-init arm for host {f['host']!r}")
        if len(base) != len(f["fedavg"]):
            raise BadTable(f"{f['name']}: {len(f['fedavg'])} FL seeds against {len(base)} of random init")
        out.append(statistics.fmean(a - b for a, b in zip(f["fedavg"], base, strict=True)))
    return out


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment: family-wise error controlled over the signals tried."""
    order = sorted(range(len(pvalues)), key=pvalues.__getitem__)
    adjusted, running = [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def correlations(table: dict, gain: list[float], device: str | None = None) -> dict:
    """Spearman's rho, p and Holm-adjusted p of the per-file ``gain`` with each signal, over the files of
    ``device`` (every file when None)."""
    keep = [i for i, f in enumerate(table["files"]) if device is None or f["device"] == device]
    rows = {}
    for name in SIGNALS:
        rho, p = spearmanr([gain[i] for i in keep], [table["files"][i][name] for i in keep])
        rows[name] = {"rho": round(float(rho), 3), "p": round(float(p), 3)}
    for name, adj in zip(SIGNALS, holm([rows[n]["p"] for n in SIGNALS]), strict=True):
        rows[name]["p_holm"] = round(adj, 3)
    return {"files": len(keep), "device": device or "all", **rows}


def load(path: Path) -> tuple[dict, list[float]]:
    """The table and its per-file gains; BadTable (one line, exit code 2) when it cannot be used."""
    try:
        table = json.loads(path.read_text())
        files = table["files"]
        for f in files:
            if not all(isinstance(f[n], (int, float)) and math.isfinite(f[n]) for n in SIGNALS):
                raise BadTable(f"{f['name']}: a signal is not a finite number")
        if len(files) < 3:
            raise BadTable(f"{len(files)} files: a rank correlation needs at least 3")
        return table, gains(table)
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise BadTable(f"{path}: {type(err).__name__}: {err}") from None


def report(args: argparse.Namespace) -> None:
    table, gain = load(args.table)
    for f, g in zip(table["files"], gain, strict=True):
        print(json.dumps({"file": f["name"], "gain": round(g, 2), **{n: f[n] for n in SIGNALS}}))
    for device in (None, "cpu"):
        print(json.dumps(correlations(table, gain, device)))


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="fedavg_gain", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", type=Path, help="the JSON table (docs/fedavg-gain.json)")
    parser.set_defaults(run=report)
    return run_main("fedavg_gain", parser, argv, (BadTable,))


if __name__ == "__main__":
    sys.exit(main())
