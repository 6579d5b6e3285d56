"""A Flower deployment on loopback (recipes/flower_deploy.sh): a SuperLink and two SuperNodes as separate
processes on 127.0.0.1 (free ports, no TLS), and ``flwr run`` of the repository's Flower app (pyproject.toml
[tool.flwr.app]), whose ServerApp runs one FedAvg round of federate on digits. Slow: every Flower process
and every ClientApp process starts Python and torch. Bounded in time, and every process it started is
stopped even when it fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "flower_deploy.sh"
LIMIT_S = 600


@pytest.mark.slow
def test_loopback_deployment_runs_a_fedavg_round(tmp_path):
    pytest.importorskip("flwr", reason="Flower is not installed (pip install -e '.[flower]')")
    work = tmp_path / "flower"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "CLIENTS": "2", "TIMEOUT": str(LIMIT_S - 60), "WORK": str(work), "OMP_NUM_THREADS": "1"}
    cmd = ["bash", str(RECIPE), str(tmp_path / "run"), "algo='fedavg'", "num-server-rounds=1",
           "local-epochs=1", "width=0.25", "device='cpu'", "eval-local=false"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=LIMIT_S)
    finally:
        _stop(proc, work / "flwr")
    assert proc.returncode == 0, err[-4000:]
    assert json.loads(out.splitlines()[-1])["rounds"] == 1
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1] and rows[0]["clients"] == [0, 1]
    assert 0 <= rows[0]["test_acc"] <= 1
    assert (tmp_path / "run" / "final.pt").is_file()


def _stop(proc: subprocess.Popen, flwr_home: Path) -> None:
    """Stop the recipe's process group, then any process it started in a session of its own (Flower's
    SuperExec, ServerApp and ClientApp processes), found by the FLWR_HOME this test gave them."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for _ in range(2):
        for pid in _started_with(f"FLWR_HOME={flwr_home}"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.5)


def _started_with(entry: str) -> list[int]:
    """The ids of this user's processes whose environment holds ``entry``."""
    found = []
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            if entry.encode() in env.read_bytes().split(b"\0"):
                found.append(int(env.parent.name))
        except OSError:
            continue
    return found
