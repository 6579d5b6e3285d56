"""A Flower deployment on loopback (recipes/flower_deploy.sh): a SuperLink and SuperNodes as separate
processes on 127.0.0.1 (free ports; TLS and SuperNode authentication unless SECURE=0), each SuperNode with a
warm worker and only its own shard of ``federate export-partitions``, and ``flwr run`` of the repository's
Flower app (pyproject.toml [tool.flwr.app]), whose ServerApp runs federate on digits and checks every reply.
Slow: many processes, each starting Python. Bounded in time, and every process it started is stopped even
when it fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from federated.cli import main

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "flower_deploy.sh"
LIMIT_S = 600


def _deploy(tmp_path, clients, entries, out="run", **env_extra):
    """The recipe's run on node-local shards into ``tmp_path / out`` (a run directory, or the checkpoint of
    self-pre-training, ``sp.ckpt``, its run directory beside it); (its JSON summary, metrics rows, stderr).
    Its logs stay in ``tmp_path / "flower" / "logs"`` (WORK is the caller's: the recipe leaves it)."""
    pytest.importorskip("flwr", reason="Flower is not installed (pip install -e '.[flower]')")
    shards = tmp_path / "shards"
    assert main(["export-partitions", "--clients", str(clients), "--alpha", "1.0", "--quiet",
                 "--out", str(shards)]) == 0
    work = tmp_path / "flower"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "CLIENTS": str(clients), "TIMEOUT": str(LIMIT_S - 60), "WORK": str(work), "OMP_NUM_THREADS": "1",
           "SHARDS": str(shards), "TMPDIR": str(tmp_path / "tmp"), **env_extra}
    (tmp_path / "tmp").mkdir()
    cmd = ["bash", str(RECIPE), str(tmp_path / out), "alpha=1.0", "local-epochs=1", "width=0.25",
           "batch-size=32", "device='cpu'", "eval-local=false", *entries]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        printed, err = proc.communicate(timeout=LIMIT_S)
    finally:
        _stop(proc, work / "flwr")
    assert proc.returncode == 0, err[-4000:]
    assert not list((tmp_path / "tmp").glob("fpsfl-deploy.*"))  # the recipe removed what it made there
    run_dir = tmp_path / (out.removesuffix(".ckpt") + ".run" if out.endswith(".ckpt") else out)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert (tmp_path / out if out.endswith(".ckpt") else run_dir / "final.pt").is_file()
    return json.loads(printed.splitlines()[-1]), rows, err


@pytest.mark.parametrize("given", [True, False])
def test_the_recipe_removes_only_what_it_made(tmp_path, given):
    """WORK=~/experiments must survive the recipe (issue 31): a folder it is given is left with the user's
    files in it; its own temporary folders are removed, here after the SuperLink fails to start."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "flower-superlink").write_text("#!/bin/sh\nexit 1\n")
    (fake / "flower-superlink").chmod(0o755)
    work, tmp = tmp_path / "experiments", tmp_path / "tmp"
    work.mkdir(), tmp.mkdir()
    (work / "keep.txt").write_text("mine")
    path = os.pathsep.join([str(fake), str(Path(sys.executable).parent), os.environ["PATH"]])
    env = {**os.environ, "PATH": path, "TMPDIR": str(tmp), "SECURE": "0",
           **({"WORK": str(work)} if given else {})}
    done = subprocess.run(["bash", str(RECIPE), str(tmp_path / "run")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and "the SuperLink exited" in done.stderr, done.stderr[-2000:]
    assert (work / "keep.txt").read_text() == "mine"
    assert not list(tmp.glob("fpsfl-deploy.*")) and not list(tmp.glob("tmp.*"))
    if given:
        assert (work / "logs" / "superlink.log").is_file()  # the logs of the failed run, for the user


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["executor", "worker", "cold"])
def test_loopback_deployment_on_node_local_shards_runs_fedavg(tmp_path, runner):
    """Each way a node runs its ClientApp tasks (the recipe's RUNNER) gives, bit for bit, the rounds of our
    ClientApp served in this process: the fpsfl executor (one long-lived process, the default), Flower's
    per-message processes with a warm worker, and cold per-message processes."""
    summary, rows, _ = _deploy(tmp_path, 2, ["algo='fedavg'", "num-server-rounds=2"], RUNNER=runner)
    assert summary["rounds"] == 2 and [r["round"] for r in rows] == [1, 2] and rows[1]["clients"] == [0, 1]
    expected = _in_process(tmp_path / "here", lambda grid, run: run(), clients=2, algo="fedavg", rounds=2)
    assert [_strip(r) for r in rows] == [_strip(r) for r in expected]
    a, b = (torch.load(p / "final.pt", weights_only=False) for p in (tmp_path / "run", tmp_path / "here"))
    assert _tensors(a) == _tensors(b)


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


@pytest.mark.slow
def test_an_authenticated_deployment_refuses_an_unregistered_node_and_an_impostor(tmp_path):
    """TLS and --enable-supernode-auth (the recipe's default): a SuperNode whose key was never registered is
    refused by the SuperLink, and a registered one (registered as client 1's) that claims partition-id 0 is
    left out by the ServerApp in one line naming both nodes; the run goes on with the rightful nodes."""
    _, rows, _ = _deploy(tmp_path, 2, ["algo='fedavg'", "num-server-rounds=1"], INTRUDE="1:0")
    assert rows[0]["clients"] == [0, 1] and "missing_clients" not in rows[0]
    logs = tmp_path / "flower" / "logs"
    server = (logs / "flwr-run.log").read_text()
    claim = [line for line in server.splitlines() if "claims partition-id" in line]
    assert len(claim) == 1, server[-3000:]
    assert re.search(r"Flower node \d+ registered as 'fpsfl-client-1' for client 1, claims partition-id 0, "
                     r"which is client 0's, registered as 'fpsfl-client-0' \(node \d+\); it is left out",
                     claim[0]), claim
    assert "Failed to activate SuperNode" in (logs / "supernode-stranger.log").read_text()
    assert "federate: round 1/1: test_acc" in server  # the per-round line flwr log shows
    assert (tmp_path / "flower" / "tls" / "ca.pem").is_file()


@pytest.mark.slow
def test_a_node_that_answers_late_leaves_no_trace(tmp_path):
    """SCAFFOLD over real SuperNodes: node 1 sleeps past --flower-timeout before round 2 (the SLOW drill),
    answers late, and then serves round 3. The run equals, bit for bit, the one in which client 1 missed
    round 2 (its node offline; computed in this process), whose c is the mean of the aggregated c_i
    (test_flower_replies.py): the late state was staged, never confirmed, and discarded."""
    timeout = 60
    entries = ["algo='scaffold'", "num-server-rounds=3", "min-replies=0.6", f"flower-timeout={timeout}"]
    _, rows, _ = _deploy(tmp_path, 3, entries, SLOW=f"1:2:{timeout + 15}")
    assert rows[1]["missing_clients"] == [1] and "missing_clients" not in rows[2], rows

    def missed(grid, run):  # client 1's node is offline for round 2
        run(stop_after=1)
        grid.down.add(101)
        run(resume=True, stop_after=1)
        grid.down.clear()
        run(resume=True)

    expected = _in_process(tmp_path / "missed", missed, clients=3, algo="scaffold", rounds=3,
                           min_replies="0.6")
    assert [_strip(r) for r in rows] == [_strip(r) for r in expected]
    for name in ("final.pt", "state.pt"):
        a, b = (torch.load(p / name, weights_only=False) for p in (tmp_path / "run", tmp_path / "missed"))
        assert _tensors(a) == _tensors(b), name


def _in_process(path, drive, clients, **settings) -> list[dict]:
    """The metrics rows of federate run into ``path`` with our ClientApp behind an in-process Grid of
    ``clients`` nodes, at one thread as each deployed node (OMP_NUM_THREADS=1); ``drive(grid, run)`` calls
    ``run(**options)`` (flower_grid.serve's) as often as it likes."""
    from .flower_grid import LocalGrid, flower_identity, rows, serve

    monkeypatch = pytest.MonkeyPatch()
    threads = torch.get_num_threads()
    try:
        flower_identity(monkeypatch)
        torch.set_num_threads(1)
        grid = LocalGrid(clients)
        drive(grid, lambda **options: serve(grid, path, clients=clients, **settings, **options))
    finally:
        torch.set_num_threads(threads)
        monkeypatch.undo()
    return rows(path)


def _strip(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("seconds", "missing_reasons", "late_replies")}


def _tensors(tree, path=""):
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() for k, v in _tensors(value, f"{path}/{key}").items()}
    if isinstance(tree, list | tuple):
        return {k: v for i, value in enumerate(tree) for k, v in _tensors(value, f"{path}/{i}").items()}
    return {path: tree.tolist()} if isinstance(tree, torch.Tensor) else {}


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
