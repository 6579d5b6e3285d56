"""FederateConfig's settings groups (issue 39): nested frozen dataclasses, every setting also read by its
flat name, flags and --config files generated from the groups' fields, config.json flat as before."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from federated.cli import build_parser, config_from
from federated.experiment import FederateConfig
from federated.groups import DataGroup, TrainingGroup
from fpsfl.base.configfile import ConfigFileError
from fpsfl.base.settings import flat_fields, group_fields


def test_every_setting_lives_in_one_group_and_reads_flat():
    cfg = FederateConfig(rounds=3, dataset="digits", alpha=0.5, seed=4)
    groups = [f.name for f in dataclasses.fields(cfg)]
    assert groups == ["data", "partitioning", "training", "model", "run"]
    names = [f.name for f in flat_fields(FederateConfig)]
    assert len(names) == len(set(names))  # no setting in two groups
    for g in groups:
        for f in dataclasses.fields(getattr(cfg, g)):
            assert getattr(cfg, f.name) is getattr(getattr(cfg, g), f.name)
    assert (cfg.training.rounds, cfg.run.seed, cfg.partitioning.partition_args["alpha"]) == (3, 4, 0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.training.rounds = 5  # type: ignore[misc]


def test_a_flat_setting_wins_over_its_group_and_replace_keeps_the_rest():
    cfg = FederateConfig(training=TrainingGroup(rounds=7, local_epochs=2), rounds=4)
    assert (cfg.rounds, cfg.local_epochs) == (4, 2)
    moved = dataclasses.replace(cfg, init="random", data=DataGroup(val_fraction=0.1))
    assert (moved.rounds, moved.local_epochs, moved.val_fraction) == (4, 2, 0.1)
    assert moved == FederateConfig(rounds=4, local_epochs=2, val_fraction=0.1)
    with pytest.raises(TypeError, match="unexpected settings: nonsense"):
        FederateConfig(nonsense=1)
    with pytest.raises(ValueError, match="--rounds must lie in"):  # a group's range checked by flag name
        FederateConfig(training=TrainingGroup(rounds=0))


def test_the_record_is_flat_and_rebuilds_the_config():
    cfg = FederateConfig(rounds=3, alpha=0.5, clients=4, save_local_models=(2,))
    record = cfg.to_dict()
    assert not set(record) & {"data", "partitioning", "training", "model", "run"}
    assert set(n for n in (f.name for f in flat_fields(FederateConfig))
               if n not in ("partition_args", "data_args")) <= set(record)
    assert FederateConfig.from_dict(record).to_dict() == record
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert group_fields(FederateConfig, "model") == ("arch", "width", "init", "init_format")


def _cfg(tmp_path, text: str, *flags: str) -> FederateConfig:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return config_from(build_parser().parse_args(["--config", str(path), *flags]))


def test_a_config_file_may_write_its_settings_in_the_groups_tables(tmp_path):
    grouped = _cfg(tmp_path, "[federate.training]\nrounds = 2\nlr = 0.05\n"
                             "[federate.data]\nval_fraction = 0.1\n[federate.partitioning]\nclients = 4\n"
                             "[federate.partitioning.partition_args]\nalpha = 0.5\n")
    flat = _cfg(tmp_path, "[federate]\nrounds = 2\nlr = 0.05\nval_fraction = 0.1\nclients = 4\nalpha = 0.5\n")
    assert grouped == flat
    assert _cfg(tmp_path, "[federate.training]\nrounds = 2\n", "--rounds", "3").rounds == 3  # a flag wins


@pytest.mark.parametrize("text, message", [
    ("[federate.training]\nval_fraction = 0.1\n", r"\[federate.training\]: unknown key 'val_fraction'"),
    ("[federate.training]\nrounds = 0\n", r"\[federate.training\]: setting 'rounds' must lie in"),
    ("[federate]\ntraining = 3\n", "training must be a table"),
])
def test_a_setting_in_the_wrong_group_table_is_one_line(tmp_path, text, message):
    with pytest.raises(ConfigFileError, match=message):
        _cfg(tmp_path, text)
