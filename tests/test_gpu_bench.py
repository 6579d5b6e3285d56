"""bench/gpu.sh: its CPU dry run takes every step of the GPU verification and writes every section.

The dry run takes about 70 s on 2 cores (Flower's Ray start-up is half of it); it is the only check CI can
make of the script that the first GPU session runs before anything else (issue 26).
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
SECTIONS = ["environment", "install", "pytest_gpu", "pretrain", "federate", "torchrun", "flower"]


def _bench_module():
    spec = importlib.util.spec_from_file_location("gpu_bench", REPO / "bench" / "gpu_bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_dry_run_writes_every_section(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", str(REPO / "bench" / "gpu.sh"), "--dry-run"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu.json").read_text())
    assert list(report) == SECTIONS
    assert all(report[s]["status"] == "ok" for s in SECTIONS), {s: report[s] for s in SECTIONS}
    assert report["environment"]["dry_run"] is True
    if not torch.cuda.is_available():
        assert report["pytest_gpu"]["all_skipped"] and report["pytest_gpu"]["counts"]["skipped"] >= 4
    rows = report["pretrain"]["rows"]
    assert {(r["size"], r["workers"], r["amp"]) for r in rows} == {(s, w, a) for s in (16, 32) for w in (0, 1)
                                                                  for a in (False, True)}
    assert all(r["pairs_per_s"] > 0 and r["renderer_feed_pairs_per_s"] > 0 for r in rows)
    assert {(r["algo"], r["client_batch"]) for r in report["federate"]["rows"]} == {
        (a, k) for a in ("fedavg", "scaffold") for k in (1, "auto")}
    assert report["torchrun"]["collective"] == {"backend": "gloo", "world": 1, "ok": True}
    assert len(report["flower"]["seconds_per_round"]) == 1


def test_a_failing_section_is_recorded_and_the_next_still_runs(tmp_path):
    bench = _bench_module()
    report = bench.Report(tmp_path / "r.json", budget_s=60)
    report.section("bad", lambda: 1 / 0)
    report.section("absent", lambda: (_ for _ in ()).throw(bench.Skip("not installed")))
    report.section("good", lambda: {"x": 1})
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["bad"]["status"] == "failed" and "ZeroDivisionError" in saved["bad"]["error"]
    assert saved["absent"] == {"status": "skipped", "reason": "not installed", "seconds": 0.0}
    assert saved["good"]["status"] == "ok" and saved["good"]["x"] == 1
    late = bench.Report(tmp_path / "late.json", budget_s=0)
    late.section("any", lambda: {"x": 1})
    assert json.loads((tmp_path / "late.json").read_text())["any"]["status"] == "skipped"
