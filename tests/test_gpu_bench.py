"""bench/gpu.sh: its CPU dry run takes every measurement of the GPU call and writes every line.

The dry run takes about 20 s on 2 cores (compiled rows with the aot_eager backend, Table 2 for 2 rounds on
200 images); it is the only check CI can make of the script that a GPU session runs first (issues 26, 40).
The GPU checks of issue 26 (``--checks``: pytest -m gpu, torchrun, Flower) take about 70 s dry, half of it
Ray's start: ``-m slow``.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


def _bench_module():
    sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location("gpu_bench", REPO / "bench" / "gpu_bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _dry_run(tmp_path, *args) -> list[dict]:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", str(REPO / "bench" / "gpu.sh"), "--dry-run", *args], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    files = list(tmp_path.glob("*.jsonl"))
    assert len(files) == 1, files
    return [json.loads(line) for line in files[0].read_text().splitlines()]


def test_dry_run_writes_every_measurement(tmp_path):
    records = _dry_run(tmp_path)
    assert all(r["status"] == "ok" and r["device"] == "cpu" and r["dry_run"] for r in records), records
    assert [r["bench"] for r in records] == ["environment", *["pretrain"] * 4, *["federate"] * 3,
                                             "table2", *["pretrain"] * 5, "federate"]
    rows = [r for r in records if r["bench"] == "pretrain"]
    assert [(r["method"], r["size"], r["compiled"], r["graphed"]) for r in rows] == [
        ("simsiam", 16, False, False), ("simsiam", 16, False, True), ("mocov2", 16, False, True),
        ("simsiam", 16, True, False), ("simsiam", 32, False, False), ("simsiam", 32, True, False),
        ("mocov2", 16, False, False), ("mocov2", 16, True, False), ("simsiam", 32, False, True)]
    assert all(r["pairs_per_s"] > 0 and r["steps"] == 3 for r in rows)
    # graphed rows: captured once in the warm-up epoch (one lr for both epochs), by the CPU stand-in
    assert all(r["captures"] == 1 and r["capture"] == "cpu stand-in" for r in rows if r["graphed"])
    assert {r["backend"] for r in rows if r["compiled"]} == {"aot_eager"}
    fed = {r["name"]: r for r in records if r["bench"] == "federate"}
    assert fed["one client at a time"]["client_batch"] == 1 and fed["vectorised"]["client_batch"] == 2
    assert [r["compiled"] for r in fed.values()] == [False, False, False, True]  # federate --compile, last
    assert [r["graphed"] for r in fed.values()] == [False, False, True, False]
    assert fed["vectorised, --cuda-graph"]["client_batch"] == 2
    assert all(r["image_steps_per_s"] > 0 and r["images"] > 0 for r in fed.values())
    table2 = next(r for r in records if r["bench"] == "table2")
    assert table2["rounds_run"] == 2 and len(table2["round_s"]) == 2
    steady = table2["round_s"][1]
    # round_s is rounded to 0.01 s: 99 of its rounding errors
    assert table2["extrapolated_100_rounds_s"] == pytest.approx(table2["round_s"][0] + 99 * steady, abs=0.6)


def test_the_check_finds_a_missing_or_failed_measurement(tmp_path, capsys):
    bench = _bench_module()
    sizes = bench.DRY
    names = [("pretrain", r.name) for r in (*sizes.first, *sizes.later)]
    names += [("federate", "one client at a time"), ("federate", "vectorised"),
              ("federate", "vectorised, --cuda-graph"), ("federate", "one client at a time, compiled"),
              ("table2", "fedavg-cifar10")]
    lines = [{"bench": "environment", "device": "cpu", "status": "ok"}]
    lines += [{"bench": b, "name": n, "device": "cpu", "status": "ok"} for b, n in names]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert bench.check(path, sizes) == []
    lines[3]["status"] = "failed"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines[:-1]))
    problems = bench.check(path, sizes)
    assert len(problems) == 2 and "failed" in problems[0] and "missing: table2" in problems[1]
    path.write_text("{not json\n")
    assert len(bench.check(path, sizes)) == 1


def test_a_failing_measurement_is_recorded_and_the_next_still_runs(tmp_path):
    bench = _bench_module()
    lines = bench.Lines(tmp_path / "r.jsonl", {"device": "cpu"}, budget_s=60)
    lines.measure("x", "bad", lambda: 1 / 0)
    lines.measure("x", "absent", lambda: (_ for _ in ()).throw(bench.Skip("not installed")))
    lines.measure("x", "good", lambda: {"v": 1})
    lines.measure("x", "late", lambda: {"v": 2}, need_s=61)
    saved = {r["name"]: r for r in map(json.loads, (tmp_path / "r.jsonl").read_text().splitlines())}
    assert saved["bad"]["status"] == "failed" and "ZeroDivisionError" in saved["bad"]["error"]
    assert saved["absent"]["status"] == "skipped" and saved["absent"]["reason"] == "not installed"
    assert saved["good"]["status"] == "ok" and saved["good"]["v"] == 1 and saved["good"]["device"] == "cpu"
    assert saved["late"]["status"] == "skipped" and "time budget" in saved["late"]["reason"]


def test_a_skipped_measurement_is_recorded_and_not_run(tmp_path):
    """SKIP (--skip) names rows an earlier call of the same lease measured: they are written as skipped and
    their function is never called; the other rows run."""
    bench = _bench_module()
    lines = bench.Lines(tmp_path / "r.jsonl", {"device": "cpu"}, budget_s=60, skip=frozenset({"done"}))
    lines.measure("x", "done", lambda: 1 / 0)
    lines.measure("x", "new", lambda: {"v": 1})
    saved = {r["name"]: r for r in map(json.loads, (tmp_path / "r.jsonl").read_text().splitlines())}
    assert saved["done"] == {"device": "cpu", "bench": "x", "name": "done", "status": "skipped",
                             "reason": "--skip", "wall_s": 0.0}
    assert saved["new"]["status"] == "ok" and saved["new"]["v"] == 1


@pytest.mark.slow
def test_dry_run_of_the_checks(tmp_path):
    records = _dry_run(tmp_path, "--checks")
    checks = {r["name"]: r for r in records if r["bench"] == "check"}
    assert set(checks) == {"pytest_gpu", "torchrun", "flower"}
    assert all(r["status"] in ("ok", "skipped") for r in checks.values()), checks
    if not torch.cuda.is_available():
        assert checks["pytest_gpu"]["all_skipped"] and checks["pytest_gpu"]["counts"]["skipped"] >= 4
    assert checks["torchrun"]["collective"] == {"backend": "gloo", "world": 1, "ok": True}
