"""Flower rounds with nodes that fail, restart or hold only their own data (issue 25): ``--min-replies``
(enough replies: the round aggregates over them and names the missing clients; too few: one line, and
``--resume`` continues), nodes re-sampled every round (a restarted SuperNode rejoins under a new node id), and
node-local shards (``federate export-partitions``; a node's shard checked by the node and by the server).

The nodes here are our ClientApp called in this process through a Grid stand-in (:class:`LocalGrid`), so
these tests run in seconds; the same over real SuperNode processes is test_flower_deploy.py (slow).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from federated.cli import main
from federated.experiment import FederateConfig, needed_replies

from .flower_grid import TINY, LocalGrid, flower_identity
from .flower_grid import rows as _rows
from .flower_grid import serve as _serve


@pytest.fixture(autouse=True)
def _flower(monkeypatch):
    flower_identity(monkeypatch)


# ---- --min-replies ----------------------------------------------------------------------------------
@pytest.mark.parametrize("spec,selected,need", [("1.0", 10, 10), ("0.8", 10, 8), ("0.75", 10, 8),
                                                ("8", 10, 8), ("12", 10, 10), ("1", 10, 1), ("0.01", 3, 1)])
def test_min_replies_is_a_count_or_a_fraction(spec, selected, need):
    assert needed_replies(spec, selected) == need


@pytest.mark.parametrize("spec", ["0", "1.5", "-2", "2.5", "most"])
def test_a_bad_min_replies_is_one_line_and_exit_2(tmp_path, capsys, spec):
    assert main(["--engine", "flower", "--min-replies", spec, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--min-replies" in err and len(err.splitlines()) == 1


def test_a_round_with_enough_replies_aggregates_over_them_and_names_the_missing(tmp_path):
    """Client 2's node goes offline after round 1: round 2 goes on with clients 0 and 1, their FedAvg
    weights renormalised over the two (the global model is their size-weighted mean)."""
    grid = LocalGrid(3)
    _serve(grid, tmp_path, stop_after=1)
    grid.down.add(102)
    grid.replies.clear()
    _serve(grid, tmp_path, resume=True, min_replies="0.6")
    rows = _rows(tmp_path)
    assert "missing_clients" not in rows[0] and rows[1]["missing_clients"] == [2]
    assert rows[1]["clients"] == [0, 1] and len(rows[1]["client_sizes"]) == 2
    from federated.flower.records import read_state

    states = [read_state(r.content["arrays"]) for r in grid.replies]
    weights = torch.tensor([float(r.content["metrics"]["num-examples"]) for r in grid.replies],
                           dtype=torch.float64)
    final = torch.load(tmp_path / "final.pt", weights_only=True)["model"]
    for key, value in final.items():
        if value.is_floating_point():
            mean = sum(w * s[key].double() for w, s in zip(weights / weights.sum(), states, strict=True))
            assert torch.allclose(value.double(), mean, atol=1e-6), key


def test_too_few_replies_end_the_run_in_one_line_and_resume_continues(tmp_path):
    from federated.flower import FlowerError

    grid = LocalGrid(3)
    _serve(grid, tmp_path, stop_after=1)
    grid.mute.add(101)  # client 1's ClientApp hangs in round 2
    with pytest.raises(FlowerError) as failed:
        _serve(grid, tmp_path, resume=True, min_replies="3")
    message = str(failed.value)
    assert "round 2: 2 of 3 clients replied, --min-replies 3 needs 3" in message
    assert "client 1: no reply within --flower-timeout 0.5 s" in message
    assert "--resume continues" in message and "\n" not in message
    assert [r["round"] for r in _rows(tmp_path)] == [1]
    grid.mute.clear()
    _serve(grid, tmp_path, resume=True)
    assert [r["round"] for r in _rows(tmp_path)] == [1, 2]


def test_a_restarted_node_rejoins_under_a_new_node_id(tmp_path):
    """A restarted insecure SuperNode comes back with a new node id (its old one may still be listed): the
    next round asks it which client it serves and sends that client's message there."""
    grid = LocalGrid(3)
    _serve(grid, tmp_path, stop_after=1)
    grid.add_node(202, 2)  # client 2 again, on a new node; node 102 not yet offline
    grid.mute.add(102)
    _serve(grid, tmp_path, resume=True)
    rows = _rows(tmp_path)
    assert rows[1]["clients"] == [0, 1, 2] and "missing_clients" not in rows[1]


def test_a_restarted_node_of_a_stateful_algorithm_says_its_state_is_lost(tmp_path):
    from federated.flower import FlowerError

    grid = LocalGrid(3)
    _serve(grid, tmp_path, stop_after=1, algo="scaffold")
    grid.down.add(102)
    grid.add_node(202, 2)  # an empty Context: SCAFFOLD's c_2 is gone
    with pytest.raises(FlowerError, match=r"client\(s\) 2: their scaffold state is gone"):
        _serve(grid, tmp_path, resume=True, algo="scaffold")


# ---- node-local shards --------------------------------------------------------------------------------
def _export(path, *args):
    assert main(["export-partitions", "--clients", "3", "--alpha", "1.0", "--quiet", "--out", str(path),
                 *args]) == 0
    return path


def test_export_writes_each_clients_samples_once_with_their_hashes(tmp_path):
    from federated.setup import partitioned
    from federated.shards import load_shard, read_manifest, shard_digest

    out = _export(tmp_path / "shards")
    manifest = read_manifest(out)
    data, _, parts = partitioned(FederateConfig(**TINY))
    assert manifest["sizes"] == [len(p) for p in parts]
    assert manifest["settings"]["alpha"] == 1.0 and manifest["settings"]["clients"] == 3
    seen = []
    for client, part in enumerate(parts):
        shard = load_shard(out, client)
        assert torch.equal(shard.data.train_x, data.train_x[part]) and torch.equal(shard.data.train_y,
                                                                                    data.train_y[part])
        assert len(shard.data.test_x) == 0 and len(shard.data.val_x) == 0  # a node never holds the test set
        digest = shard_digest(shard.data.train_x.numpy(), shard.data.train_y.numpy(), shard.index.numpy())
        assert shard.sha256 == manifest["shards"][client]["sha256"] == digest
        seen.extend(shard.index.tolist())
        assert torch.equal(shard.to_local(torch.as_tensor(part[::-1].copy())),
                           torch.arange(len(part)).flip(0))
    assert sorted(seen) == sorted(np.concatenate(parts).tolist()) and len(seen) == len(set(seen))


def test_a_changed_shard_is_refused(tmp_path):
    from federated.shards import ShardError, load_shard

    out = _export(tmp_path / "shards")
    with np.load(out / "client-0001.npz") as npz:
        x, y, index = npz["x"].copy(), npz["y"], npz["index"]
    x[0, 0, 0, 0] ^= 1
    np.savez(out / "client-0001.npz", x=x, y=y, index=index)
    load_shard(out, 0)
    with pytest.raises(ShardError, match="client-0001.npz: its contents do not match the manifest"):
        load_shard(out, 1)
    with pytest.raises(ShardError, match="no shard manifest"):
        load_shard(tmp_path, 0)


@pytest.mark.parametrize("algo", ["fedavg", "fedvc"])  # fedvc: the server draws pools in global positions
def test_nodes_on_their_own_shards_give_the_run_of_nodes_with_the_whole_dataset(tmp_path, algo):
    out = _export(tmp_path / "shards")
    _serve(LocalGrid(3), tmp_path / "whole", algo=algo)
    grid = LocalGrid(3, {"data-dir": str(out)})
    _serve(grid, tmp_path / "shards-run", algo=algo, shards=out)
    assert all("fpsfl.node" in r.content for r in grid.replies)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(_rows(tmp_path / "whole")) == strip(_rows(tmp_path / "shards-run"))


def test_the_server_refuses_a_node_without_the_manifests_shard(tmp_path):
    from federated.flower import FlowerError

    out = _export(tmp_path / "shards")
    grid = LocalGrid(3, {"data-dir": str(out)})
    grid.add_node(102, 2)  # client 2's node holds the whole dataset, not its shard
    with pytest.raises(FlowerError, match=r"client 2: its reply was refused: its node trained on no shard "
                                          r"\(its SuperNode has no data-dir\), not the manifest's"):
        _serve(grid, tmp_path / "run", shards=out)


def test_shards_of_another_partition_are_refused_by_node_and_server(tmp_path):
    from federated.flower import FlowerError
    from federated.shards import ShardError

    other = _export(tmp_path / "other", "--seed", "1")
    with pytest.raises(ShardError, match="other settings: seed 1 \\(run: 0\\)"):
        _serve(LocalGrid(3), tmp_path / "server", shards=other)
    with pytest.raises(FlowerError, match="client 0: .*other settings: seed 1"):
        _serve(LocalGrid(3, {"data-dir": str(other)}), tmp_path / "node")


@pytest.mark.parametrize("argv,says", [
    (["export-partitions", "--clients", "0"], "clients"),
    (["export-partitions", "--dataset", "cifar10", "--data-root", "/nonexistent"], "cifar"),
    (["--shards", "shards"], "--shards: node-local shards are for flwr run ."),
])
def test_bad_shard_commands_are_one_line_and_exit_2(tmp_path, capsys, argv, says):
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err.lower() or says in err, err
    assert len(err.splitlines()) == 1


# ---- who may serve a client --------------------------------------------------------------------------------
def test_with_node_names_a_node_claiming_another_clients_partition_is_left_out_in_one_line(tmp_path, capsys):
    """Clients 0-2 are served by the nodes registered as c-0..c-2 (their SuperLink's registry names them,
    not the node); node 200, registered as c-2, claims partition-id 0 and is refused in one line naming both
    nodes; node 201, registered under no name of this run, and node 202 with no name are left out too."""
    grid = LocalGrid(0)
    for client in range(3):
        grid.add_node(100 + client, client, name=f"c-{client}")
    grid.add_node(200, 0, name="c-2")
    grid.add_node(201, 1, name="mallory")
    grid.add_node(202, 2)
    _serve(grid, tmp_path, names="c-{i}", rounds=1)
    assert _rows(tmp_path)[0]["clients"] == [0, 1, 2]
    err = capsys.readouterr().err.splitlines()
    claims = [line for line in err if "node 200" in line]
    assert claims == ["federate: Flower node 200 registered as 'c-2' for client 2, claims partition-id 0, "
                      "which is client 0's, registered as 'c-0' (node 100); it is left out"]
    assert any("node 201 is registered as 'mallory', which is none of this run's node-names" in line
               for line in err)
    assert any("node 202 is registered as '', which is none" in line for line in err)
    trained = {m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == "train"}
    assert trained == {100, 101, 102}


@pytest.mark.parametrize("spec,says", [("a,b", "expected 3 distinct names"), ("a,a,b", "distinct"),
                                       ("a,,b", "distinct")])
def test_node_names_are_one_distinct_name_per_client(spec, says):
    from federated.flower.nodes import node_names

    assert node_names("n{i}", 3) == ["n0", "n1", "n2"] and node_names(" a, b ,c", 3) == ["a", "b", "c"]
    with pytest.raises(ValueError, match=says):
        node_names(spec, 3)


def test_a_federation_of_another_size_is_refused_at_once(tmp_path):
    """Flower's simulation sets num-partitions: 3 clients on a federation of 2 end the run in one line
    instead of a first round that waits for a node that never comes."""
    from federated.flower import FlowerError

    with pytest.raises(FlowerError, match="the run has clients=3, but its Flower federation has "
                                          "num-partitions=2") as refused:
        _serve(LocalGrid(3, {"num-partitions": 2}), tmp_path)
    assert "\n" not in str(refused.value)


# ---- the warm worker ---------------------------------------------------------------------------------------
@pytest.fixture
def worker(tmp_path):
    """A node worker (python -m federated.flower.worker) serving a socket, stopped after the test."""
    import os
    import subprocess
    import sys

    folder = tmp_path / "sock"
    folder.mkdir(mode=0o700)
    sock = folder / "node.sock"
    proc = subprocess.Popen([sys.executable, "-m", "federated.flower.worker", str(sock)],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not sock.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.1)
        yield sock
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert not sock.exists()  # the worker removes its socket when stopped


# CI's 20-minute budget (2026-12-02): 35 s
@pytest.mark.slow
def test_nodes_with_a_warm_worker_give_the_run_of_nodes_that_train_themselves(tmp_path, worker, capsys):
    """SCAFFOLD, whose client state travels to the worker and back in the Context: the same metrics,
    weights and state; a node whose worker is gone (client 2's) trains itself, saying so in one line."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the worker
    try:
        _serve(LocalGrid(3), tmp_path / "itself", algo="scaffold")
        grid = LocalGrid(3, {"worker": str(worker)})
        grid.add_node(102, 2, {"worker": str(tmp_path / "gone.sock")})
        _serve(grid, tmp_path / "worker", algo="scaffold")
    finally:
        torch.set_num_threads(threads)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(_rows(tmp_path / "itself")) == strip(_rows(tmp_path / "worker"))
    a, b = (torch.load(tmp_path / run / "state.pt", weights_only=False) for run in ("itself", "worker"))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    ca, cb = a["algo"]["server"]["c"], b["algo"]["server"]["c"]
    assert ca.keys() == cb.keys() and all(torch.equal(ca[k], cb[k]) for k in ca)
    assert "no worker at" in capsys.readouterr().err
