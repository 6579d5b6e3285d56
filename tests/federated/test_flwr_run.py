"""`flwr run .` as a Flower user runs the app (issue 25): the repository's `[tool.flwr.app]` section,
Flower's own simulation runtime (a local SuperLink that `flwr run` starts), typed run-config keys, and the
run directory the ServerApp writes. Slow (about a minute: the SuperLink, Ray and two ClientApp actors)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr")

ROOT = Path(__file__).resolve().parents[2]


def _superlinks() -> set[int]:
    """Process ids of running local SuperLinks (`flwr run` leaves the one it starts running, as Flower
    intends)."""
    found = subprocess.run(["pgrep", "-f", "flower-superlink"], capture_output=True, text=True).stdout.split()
    return {int(pid) for pid in found}


@pytest.mark.slow
def test_flwr_run_completes_a_two_round_digits_run(tmp_path):
    flwr = shutil.which("flwr", path=str(Path(sys.executable).parent)) or shutil.which("flwr")
    if flwr is None or shutil.which("pgrep") is None:
        pytest.skip("needs the flwr command (the [flower] extra) and pgrep")
    before = _superlinks()
    out = tmp_path / "run"
    env = dict(os.environ, FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1", OMP_NUM_THREADS="1")
    run_config = f"clients=2 num-server-rounds=2 local-epochs=1 width=0.25 eval-local=false out='{out}'"
    try:
        done = subprocess.run([flwr, "run", ".", "--stream", "--federation-config", "num-supernodes=2",
                               "--run-config", run_config], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=600)
    finally:
        for pid in _superlinks() - before:  # stop only the SuperLink this test started
            subprocess.run(["kill", str(pid)], check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["clients"] == [0, 1] for r in rows)
    assert all(0.0 <= r["test_acc"] <= 1.0 for r in rows)
    federate = json.loads((out / "config.json").read_text())["config"]["federate"]
    assert (federate["rounds"], federate["clients"], federate["width"]) == (2, 2, 0.25)
