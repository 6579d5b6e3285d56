"""A Flower deployment on loopback (recipes/flower_deploy.sh): a SuperLink and SuperNodes as separate
processes on 127.0.0.1 (free ports, no TLS), each SuperNode holding only its own shard of ``federate
export-partitions``, and ``flwr run`` of the repository's Flower app (pyproject.toml [tool.flwr.app]),
whose ServerApp runs federate on digits and checks every reply's shard against the manifest. Slow: every
Flower process and every ClientApp process starts Python and torch. Bounded in time, and every process it
started is stopped even when it fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from federated.cli import main

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "flower_deploy.sh"
LIMIT_S = 600


def _deploy(tmp_path, clients, entries, out="run", **env_extra):
    """The recipe's run on node-local shards into ``tmp_path / out`` (a run directory, or the checkpoint of
    self-pre-training, ``sp.ckpt``, its run directory beside it); (its JSON summary, metrics rows, stderr)."""
    pytest.importorskip("flwr", reason="Flower is not installed (pip install -e '.[flower]')")
    shards = tmp_path / "shards"
    assert main(["export-partitions", "--clients", str(clients), "--alpha", "1.0", "--quiet",
                 "--out", str(shards)]) == 0
    work = tmp_path / "flower"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "CLIENTS": str(clients), "TIMEOUT": str(LIMIT_S - 60), "WORK": str(work), "OMP_NUM_THREADS": "1",
           "SHARDS": str(shards), **env_extra}
    cmd = ["bash", str(RECIPE), str(tmp_path / out), "alpha=1.0", "local-epochs=1", "width=0.25",
           "device='cpu'", "eval-local=false", *entries]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        printed, err = proc.communicate(timeout=LIMIT_S)
    finally:
        _stop(proc, work / "flwr")
    assert proc.returncode == 0, err[-4000:]
    run_dir = tmp_path / (out.removesuffix(".ckpt") + ".run" if out.endswith(".ckpt") else out)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert (tmp_path / out if out.endswith(".ckpt") else run_dir / "final.pt").is_file()
    return json.loads(printed.splitlines()[-1]), rows, err


@pytest.mark.slow
def test_loopback_deployment_on_node_local_shards_runs_fedavg(tmp_path):
    summary, rows, _ = _deploy(tmp_path, 2, ["algo='fedavg'", "num-server-rounds=1"])
    assert summary["rounds"] == 1 and [r["round"] for r in rows] == [1] and rows[0]["clients"] == [0, 1]
    assert 0 <= rows[0]["test_acc"] <= 1


@pytest.mark.slow
def test_loopback_deployment_on_node_local_shards_self_pretrains(tmp_path):
    """Federated self-pre-training (Orchestra, docs/self-pretraining.md) by the same app: the ServerApp sees
    self-pretrain in its run config, the SuperNodes train on their shards, and the checkpoint loads."""
    from fpsfl.base.checkpoint import load_checkpoint

    summary, rows, _ = _deploy(tmp_path, 2, ["self-pretrain='orchestra'", "num-server-rounds=1"], "sp.ckpt")
    assert summary["rounds"] == 1 and [r["round"] for r in rows] == [0, 1] and rows[1]["clients"] == [0, 1]
    assert load_checkpoint(tmp_path / "sp.ckpt")["method"] == "orchestra"


@pytest.mark.slow
def test_a_killed_and_restarted_supernode_misses_rounds_and_rejoins(tmp_path):
    """SuperNode 2 of 3 is killed (SIGKILL) as round 3 starts and started again as round 5 starts; with
    --min-replies 0.6 the rounds go on without it (named in metrics.jsonl) and it rejoins, under a new node
    id, by the last round."""
    _, rows, err = _deploy(tmp_path, 3, ["algo='fedavg'", "num-server-rounds=7", "min-replies=0.6",
                                         "flower-timeout=30"], KILL="2:3:5")
    assert [r["round"] for r in rows] == list(range(1, 8))
    missing = {r["round"]: r.get("missing_clients", []) for r in rows}
    assert missing[1] == missing[2] == [] and missing[4] == [2], missing  # down for all of round 4
    assert all(missing[r] in ([], [2]) for r in (3, 5, 6)), missing
    assert rows[-1]["clients"] == [0, 1, 2] and missing[7] == [], missing
    assert "killed SuperNode 2" in err and "started SuperNode 2 again" in err


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
