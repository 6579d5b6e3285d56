"""A new algorithm, dataset and partition are one file each: defined here, and nowhere else, they run
through ``federate`` end to end, the partition's own setting becoming a command-line flag."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from federated.algorithms import ALGORITHMS, AlgoConfig, FedAvg
from federated.cli import main as federate
from federated.datasets import DATASETS, Loaded, Preset, register_dataset
from federated.partitions import PARTITIONS, Partition, PartitionSettings
from fpsfl.base.settings import setting


# ---- the toy algorithm: FedAvg whose server step halves the move towards the clients' average
@dataclass(frozen=True)
class HalfStepConfig(AlgoConfig):
    step: float = setting(0.5, "fraction of the averaged update applied", within="(0, 1]")


class HalfStep(FedAvg):
    name = "halfstep"
    Config = HalfStepConfig

    def server_update(self, global_params, params, results):
        avg = super().server_update(global_params, params, results)
        return {k: w + self.cfg.step * (avg[k] - w) for k, w in global_params.items()}


# ---- the toy dataset: 3 classes of 16 px random images, embedded
def read_blobs(cfg, stored: int) -> Loaded:
    g = torch.Generator().manual_seed(7)
    y, ty = torch.arange(60) % 3, torch.arange(12) % 3
    x = torch.randint(0, 256, (60, stored, stored, 3), dtype=torch.uint8, generator=g)
    tx = torch.randint(0, 256, (12, stored, stored, 3), dtype=torch.uint8, generator=g)
    return Loaded(x, y, tx, ty, ["a", "b", "c"])


# ---- the toy partition: sample i goes to client (i + offset) mod N
@dataclass(frozen=True)
class RoundRobinSettings(PartitionSettings):
    rr_offset: int = setting(0, "client of sample 0", within="[0, inf)", group="partition")


class RoundRobin(Partition):
    name = "roundrobin"
    Config = RoundRobinSettings

    def split(self, labels, clients, rng):
        owner = (np.arange(len(labels)) + self.cfg.rr_offset) % clients
        return [np.flatnonzero(owner == c).astype(np.int64) for c in range(clients)]


@pytest.fixture
def plugins():
    ALGORITHMS.register(HalfStep)
    register_dataset("blobs", store_size=16, input_size=16, needs_root=False, description="toy blobs",
                     preset=Preset(0.05, 8, "sgd"), hflip=False)(read_blobs)
    PARTITIONS.register(RoundRobin)
    yield
    ALGORITHMS.unregister("halfstep")
    DATASETS.unregister("blobs")
    PARTITIONS.unregister("roundrobin")


def test_a_toy_algorithm_dataset_and_partition_run_through_federate(tmp_path, plugins, capsys):
    argv = ["--dataset", "blobs", "--partition", "roundrobin", "--rr-offset", "1", "--algo", "halfstep",
            "--set", "step=0.25", "--clients", "3", "--min-size", "1", "--rounds", "2", "--local-epochs", "1",
            "--width", "0.25", "--device", "cpu", "--quiet", "--out", str(tmp_path / "r")]
    assert federate(argv) == 0, capsys.readouterr().err
    config = json.loads((tmp_path / "r" / "config.json").read_text())["config"]
    assert config["federate"]["rr_offset"] == 1 and config["federate"]["lr"] == 0.05  # the toy preset
    assert config["algo"] == {"step": 0.25}
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    # 59 training samples (1 of 60 is the 2% validation split): sample i on client (i + 1) mod 3
    assert [r["round"] for r in rows] == [1, 2] and rows[0]["client_sizes"] == [19, 20, 20]
    partition = json.loads((tmp_path / "r" / "partition.json").read_text())
    assert partition["summary"]["sizes"] == [19, 20, 20] and partition["config"]["rr_offset"] == 1
    assert "--rr-offset" in _help(capsys) and "halfstep" in _help(capsys)


def test_a_plugin_setting_out_of_range_is_one_line(tmp_path, plugins, capsys):
    argv = ["--dataset", "blobs", "--partition", "roundrobin", "--rr-offset", "-1", "--device", "cpu",
            "--out", str(tmp_path / "r")]
    assert federate(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "rr_offset" in err


def _help(capsys) -> str:
    with pytest.raises(SystemExit):
        federate(["--help"])
    return capsys.readouterr().out
