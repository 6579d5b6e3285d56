"""Federated self-pre-training on Flower (docs/self-pretraining.md): over our ClientApp through a Grid
stand-in (LocalGrid: nodes in this process, on the whole dataset or on node-local shards, one with a
tampered reply), the same run as the in-process engine; the run config of ``flwr run .``; and (slow)
Flower's simulation runtime for 2 rounds."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from federated.cli import main as federate
from federated.experiment import FederateConfig
from federated.selfsup.config import SelfPretrainConfig, SelfPretrainOptions
from federated.selfsup.rounds import select_clients
from federated.selfsup.runner import run
from fpsfl.base.checkpoint import load_checkpoint

from .flower_grid import LocalGrid, flower_identity

DATA = dict(dataset="digits", width=0.25, clients=20, participation=0.1, alpha=1.0, seed=1)
METHOD = {"local_clusters": "3", "global_clusters": "2", "memory": "8", "hidden_dim": "16", "proj_dim": "16",
          "server_steps": "5"}


@pytest.fixture(autouse=True)
def _flower(monkeypatch):
    flower_identity(monkeypatch)


@pytest.fixture(scope="module")
def inprocess(tmp_path_factory) -> Path:
    """The in-process run the Flower runs must equal (its run directory and checkpoint in the folder)."""
    path = tmp_path_factory.mktemp("inprocess")
    run(*_configs(path, "inprocess"))
    return path


def _configs(tmp_path: Path, name: str, engine: str = "inprocess", **opts):
    fed = FederateConfig(**DATA)
    sp = SelfPretrainConfig(rounds=1, local_epochs=1, algo_args=METHOD)
    return fed, sp, SelfPretrainOptions(out=tmp_path / f"{name}.ckpt", run_dir=tmp_path / f"{name}.run",
                                        device="cpu", progress=False, engine=engine, **opts)


def _over(grid, tmp_path: Path, name: str, **opts) -> list[dict]:
    from federated.flower.selfsup import SelfPretrainDispatch

    fed, sp, options = _configs(tmp_path, name, "flower", **opts)
    dispatch = SelfPretrainDispatch(grid, fed, sp, options, wait_s=0.5)
    return run(fed, sp, options, host=lambda rounds: rounds(dispatch))


def _rows(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _same_checkpoint(a: Path, b: Path) -> None:
    ca, cb = load_checkpoint(a)["backbone"], load_checkpoint(b)["backbone"]
    assert ca.keys() == cb.keys() and all(torch.equal(ca[k], cb[k]) for k in ca)


def test_flower_messages_give_the_in_process_run(tmp_path, inprocess):
    grid = LocalGrid(20)
    _over(grid, tmp_path, "flower")
    assert _rows(inprocess / "inprocess.run") == _rows(tmp_path / "flower.run")
    _same_checkpoint(inprocess / "inprocess.ckpt", tmp_path / "flower.ckpt")
    from federated.flower.records import read_state

    sent = [m for m in grid.sent if m.metadata.message_type == "train.selfpretrain"]
    assert len(sent) == 2 * 2  # rounds 0-1, 2 clients each
    assert all("centroids" in read_state(m.content["arrays"]) for m in sent)
    assert all(r.content["fpsfl.extra.arrays"] for r in grid.replies)  # the local centroids
    assert all(len(ctx.state) == 0 for ctx in grid.contexts.values())  # stateless clients: nothing kept


def test_nodes_on_their_own_shards_give_the_same_run(tmp_path, inprocess):
    shards = tmp_path / "shards"
    assert federate(["export-partitions", "--dataset", "digits", "--clients", "20", "--alpha", "1.0",
                     "--seed", "1", "--quiet", "--out", str(shards)]) == 0
    grid = LocalGrid(20, {"data-dir": str(shards)})
    _over(grid, tmp_path, "shards", shards=shards)
    assert all("fpsfl.node" in r.content for r in grid.replies)
    assert _rows(inprocess / "inprocess.run") == _rows(tmp_path / "shards.run")
    _same_checkpoint(inprocess / "inprocess.ckpt", tmp_path / "shards.ckpt")


def test_a_tampered_reply_is_refused_and_its_client_counted_missing(tmp_path):
    from flwr.app import Message

    from federated.flower.records import put_tree

    grid = LocalGrid(20)
    selected = select_clients([1] * 20, DATA["seed"], 1, DATA["participation"])  # round 1's two clients

    def nan_centroids(message, reply):
        content = reply.content
        put_tree(content, "fpsfl.extra", {"local_centroids": torch.full((3, 16), float("nan"))})
        return Message(content, reply_to=message)

    grid.tamper[(100 + selected[0], 1)] = nan_centroids
    rows = _over(grid, tmp_path, "run", min_replies="1")
    assert rows[1]["missing_clients"] == [selected[0]] and rows[1]["clients"] == [selected[1]]
    assert "local_centroids is not finite" in rows[1]["missing_reasons"][str(selected[0])]


def test_the_apps_run_config_selects_self_pretraining():
    from federated.flower.selfsup import options_from_sp_run_config

    fed, sp, opts = options_from_sp_run_config({
        "self-pretrain": "orchestra", "num-server-rounds": 3, "lr": "", "batch-size": "", "local-epochs": 2,
        "set": "local_clusters=4 global_clusters=2", "out": "/tmp/x/sp.ckpt", "alpha": 0.1, "clients": 5,
        "algo": "fedavg", "device": "cpu", "min-replies": "0.8"})
    assert (sp.algo, sp.rounds, sp.lr, sp.batch_size, sp.local_epochs) == ("orchestra", 3, 0.003, 32, 2)
    assert sp.algo_args == {"local_clusters": "4", "global_clusters": "2"}
    assert (fed.alpha, fed.clients) == (0.1, 5)
    assert (opts.out, opts.run_dir, opts.engine, opts.min_replies) == (
        Path("/tmp/x/sp.ckpt"), Path("/tmp/x/sp.run"), "flower", "0.8")


@pytest.mark.slow  # a few minutes on the loaded 2-core CPU VM: Ray's start-up, not the rounds
def test_flower_simulation_of_two_rounds_equals_in_process(tmp_path):
    pytest.importorskip("ray", reason="Flower's simulation engine needs Ray (pip install -e '.[flower]')")
    from federated.flower.selfsup import run_simulation

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each one-CPU Ray actor: the same float sums
    try:
        fed, sp, opts = _configs(tmp_path, "inprocess")
        sp = dataclasses.replace(sp, rounds=2)
        run(fed, sp, opts)
        fed, _, opts = _configs(tmp_path, "flower", "flower")
        rows = run_simulation(fed, sp, opts)
    finally:
        torch.set_num_threads(threads)
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert _rows(tmp_path / "inprocess.run") == _rows(tmp_path / "flower.run")
    _same_checkpoint(tmp_path / "inprocess.ckpt", tmp_path / "flower.ckpt")
