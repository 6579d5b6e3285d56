"""A new algorithm, dataset and partition are one file each: defined here, and nowhere else, they run
through ``federate`` end to end, the partition's and the dataset's own settings becoming command-line
flags."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from federated.algorithms import ALGORITHMS, AlgoConfig, FedAvg
from federated.cli import main as federate
from federated.datasets import DATASETS, DatasetSettings, Loaded, Preset, own_settings, register_dataset
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


# ---- the toy dataset: 3 classes of 16 px random images, embedded, drawn from its own --blob-seed
@dataclass(frozen=True)
class BlobSettings(DatasetSettings):
    SPLIT = ("blob_seed",)  # it draws the images: which samples a client holds
    blob_seed: int = setting(7, "seed of the toy images", within="[0, inf)", group="data")


def read_blobs(cfg, stored: int) -> Loaded:
    g = torch.Generator().manual_seed(own_settings(cfg).blob_seed)
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
                     preset=Preset(0.05, 8, "sgd"), hflip=False, settings=BlobSettings)(read_blobs)
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


def test_a_dataset_setting_is_a_flag_recorded_flat_and_replayed(tmp_path, plugins, capsys):
    """The toy dataset's --blob-seed, declared only above, reaches its reader, config.json (flat, as a
    partition's setting) and a --config replay; out of range it is one line (issue 39)."""
    from federated.datasets import DataConfig, load_dataset
    base = ["--dataset", "blobs", "--clients", "3", "--min-size", "1", "--rounds", "1", "--local-epochs", "1",
            "--width", "0.25", "--device", "cpu", "--quiet"]
    assert federate([*base, "--blob-seed", "3", "--out", str(tmp_path / "r")]) == 0, capsys.readouterr().err
    config = json.loads((tmp_path / "r" / "config.json").read_text())["config"]["federate"]
    assert config["blob_seed"] == 3 and "data_args" not in config
    replay = ["--config", str(tmp_path / "r" / "config.json"), "--out", str(tmp_path / "again")]
    assert federate(replay) == 0, capsys.readouterr().err
    replayed = json.loads((tmp_path / "again" / "config.json").read_text())["config"]["federate"]
    assert replayed["blob_seed"] == 3
    seeded = load_dataset(DataConfig("blobs", options={"blob_seed": 3}))
    assert not torch.equal(seeded.train_x, load_dataset(DataConfig("blobs")).train_x)
    assert "--blob-seed" in _help(capsys)
    assert federate([*base, "--blob-seed", "-1", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "blob-seed" in err


def test_a_dataset_setting_that_decides_the_samples_is_in_the_shard_manifest(plugins):
    """A setting the dataset's file names in SPLIT is what node-local shards are checked against, with no
    list elsewhere to extend (issue 39); inat-geo's --split-csv is one, its --test-csv is not."""
    from federated.experiment import FederateConfig
    from federated.shards import partition_settings

    settings = partition_settings(FederateConfig(dataset="blobs", clients=3, min_size=1, blob_seed=3))
    assert settings["blob_seed"] == 3 and settings["split_csv"] is None and "test_csv" not in settings
    other = partition_settings(FederateConfig(dataset="blobs", clients=3, min_size=1, blob_seed=4))
    assert other != settings


def _help(capsys) -> str:
    with pytest.raises(SystemExit):
        federate(["--help"])
    return capsys.readouterr().out


# ---- one hook, both loops: an algorithm's local term is written once (issue 39)
@pytest.fixture
def shrink():
    from tests.federated.toy_algorithm import Shrink
    ALGORITHMS.register(Shrink)
    yield Shrink
    ALGORITHMS.unregister("shrink")


def test_an_algorithm_of_one_hook_is_one_short_file(shrink):
    source = Path(sys.modules[shrink.__module__].__file__).read_text()
    assert len(source.splitlines()) < 60
    hooks = {k for k, v in vars(shrink).items() if callable(v) and not isinstance(v, type)}
    assert hooks == {"functional_loss"}


def test_the_one_hook_runs_in_the_one_client_loop_and_in_vectorised_clients(tmp_path, shrink):
    """The same float64 round with --client-batch 1 and 4; and the term acts: the weights are smaller
    than FedAvg's from the same start."""
    from tests.federated.test_algorithms import _cfg
    from tests.federated.test_batched import _close, _round
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = _cfg("shrink", clients=4, batch_size=12, local_epochs=1, alpha=0.5)
        seq, _ = _round(tmp_path, cfg, 1, "seq", dtype=torch.float64)
        bat, _ = _round(tmp_path, cfg, 4, "bat", dtype=torch.float64)
        plain, _ = _round(tmp_path, _cfg("fedavg", clients=4, batch_size=12, local_epochs=1, alpha=0.5), 1,
                          "fedavg", dtype=torch.float64)
    finally:
        torch.set_num_threads(threads)
    _close(seq, bat, rel=1e-10)
    def norm(state):
        return sum(float((v ** 2).sum()) for k, v in state.items() if k.endswith("weight"))
    assert norm(seq) < 0.99 * norm(plain)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_no_algorithm_writes_a_second_form_of_its_hooks(name):
    """The one-client entry points are derived from the functional hooks, never overridden."""
    for derived in ("local_loss", "before_step", "hook_tensors"):
        assert getattr(ALGORITHMS[name], derived) is getattr(FedAvg, derived), derived
