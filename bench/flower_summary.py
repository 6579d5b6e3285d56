"""bench/flower.sh's summary: one JSON line per run, the comparisons, and the ClientApp cold-start breakdown.

Usage: python bench/flower_summary.py TMP RUN ...
(TMP holds RUN/metrics.jsonl, RUN.wall and, for a deployment, RUN-work/phases.jsonl)

The cold-start breakdown (federated/flower/phases.py) reads each deployment's phase log: a line per message
per process that handled it, with CPU and wall seconds per phase. ``deployment-cold`` (RUNNER=cold): every
message in a fresh ``flwr-clientapp`` process that trains itself (runtime: Python, Flower's runtime and its
exchange with the SuperNode; imports: torch and the run's code; shard; model; train; reply).
``deployment-worker`` (RUNNER=worker): the ClientApp process forwards to its SuperNode's worker (runtime,
forward), which pays imports, shard and model once, and trains warm from its second message on.
``deployment`` (the default, RUNNER=executor): no ClientApp process; the node's executor takes each task
(runtime: its exchange with the SuperNode) and trains in its one process. ``first_step_cpu_s`` is what a cold
process's training costs over the warm executor's (torch's one-off kernel set-up), medians over the clients.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path


def run_summary(tmp: Path, run: str) -> dict:
    rows = [json.loads(line) for line in (tmp / run / "metrics.jsonl").read_text().splitlines()]
    start, end = map(float, (tmp / f"{run}.wall").read_text().split())
    later = [r["seconds"] for r in rows[1:]] or [math.nan]
    return {"run": run, "rounds": len(rows), "wall_s": round(end - start, 1),
            "first_round_s": round(rows[0]["seconds"], 2), "round_s": round(statistics.mean(later), 3),
            "rounds_s": [round(r["seconds"], 1) for r in rows],
            "missing_clients": {r["round"]: r["missing_clients"] for r in rows if r.get("missing_clients")},
            "final_test_acc": round(rows[-1]["test_acc"], 4), "test_accs": [r["test_acc"] for r in rows]}


def phases(path: Path) -> dict:
    """Median CPU and wall seconds per phase, per (role, cold/warm), over the train messages of a log."""
    groups: dict[str, list[dict]] = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        entry = json.loads(line)
        if entry.get("kind") == "train":
            groups.setdefault(f"{entry['role']}-{'cold' if entry['cold'] else 'warm'}", []).append(entry)
    out = {}
    for group, entries in sorted(groups.items()):
        names = list(dict.fromkeys(k for e in entries for k in e["cpu"]))
        out[group] = {"messages": len(entries),
                      "cpu_s": {k: round(statistics.median(e["cpu"].get(k, 0.0) for e in entries), 3)
                                for k in names},
                      "wall_s": {k: round(statistics.median(e["wall"].get(k, 0.0) for e in entries), 3)
                                 for k in names}}
        out[group]["cpu_total_s"] = round(sum(out[group]["cpu_s"].values()), 3)
    return out


def main(tmp: Path, runs: list[str]) -> None:
    out = {}
    for run in runs:
        out[run] = run_summary(tmp, run)
        print(json.dumps({k: v for k, v in out[run].items() if k != "test_accs"}))
    a, b = out["inprocess"], out["flower"]
    comparison = {"flower_overhead_wall_s": round(b["wall_s"] - a["wall_s"], 1),
                  "flower_overhead_startup_s": round(b["first_round_s"] - a["first_round_s"], 2),
                  "flower_overhead_per_round_s": round(b["round_s"] - a["round_s"], 3),
                  "same_test_accs": a["test_accs"] == b["test_accs"]}
    for run in ("deployment", "deployment-insecure", "deployment-worker", "deployment-cold"):
        if run in out:
            comparison[f"{run}_vs_simulated_round"] = round(out[run]["round_s"] / b["round_s"], 2)
            comparison[f"{run}_same_test_accs"] = out[run]["test_accs"] == b["test_accs"][:out[run]["rounds"]]
    print(json.dumps(comparison))
    breakdown = {run: phases(tmp / f"{run}-work" / "phases.jsonl")
                 for run in ("deployment-cold", "deployment-worker", "deployment") if run in out}
    cold = breakdown.get("deployment-cold", {}).get("clientapp-cold", {}).get("cpu_s", {})
    warm = breakdown.get("deployment", {}).get("executor-warm", {}).get("cpu_s", {})
    if "train" in cold and "train" in warm:
        breakdown["first_step_cpu_s"] = round(cold["train"] - warm["train"], 3)
    print(json.dumps({"cold_start": breakdown}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
