"""`federate --config FILE` and `pretrain --config FILE` (issue 34): a run replayed from its own config.json
is the same run, bit for bit on CPU; a TOML file is typed as the flags are; flags beside a file win."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from federated.cli import main as federate
from pretrain.cli import main as pretrain
from tests.test_robustness import FED, PRE, one_line_error

VOLATILE = ("seconds", "pairs_per_s", "data_wait")  # wall-clock figures: everything else must be equal


def metrics(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in VOLATILE}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def config(run: Path) -> dict:
    return json.loads((run / "config.json").read_text())["config"]


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key, value in a.items():
        assert torch.equal(value, b[key]), key


def final_model(run: Path) -> dict:
    return torch.load(run / "final.pt", weights_only=True)["model"]


def test_federate_replays_a_run_from_its_config_json_bit_for_bit(tmp_path, capsys):
    x, y = tmp_path / "x", tmp_path / "y"
    argv = [*FED, "--algo", "fedprox", "--set", "mu=0.05", "--seed", "3", "--no-eval-local", "--out", str(x)]
    assert federate(argv) == 0
    assert federate(["--config", str(x / "config.json"), "--device", "cpu", "--quiet", "--out", str(y)]) == 0
    assert config(y) == config(x)
    assert metrics(y) == metrics(x) and len(metrics(x)) == 2
    assert_same_tensors(final_model(x), final_model(y))


def test_federate_reads_plugin_settings_written_as_tables(tmp_path, capsys):
    """[federate.partition_args] and [federate.data_args] tables are the flat keys they hold: the first
    was read and dropped before (a silent wrong run), the second taken unchecked."""
    toml = tmp_path / "run.toml"
    toml.write_text('[federate]\nwidth = 0.25\nclients = 3\nrounds = 1\nlocal_epochs = 1\nbatch_size = 32\n'
                    '[federate.partition_args]\nalpha = 0.05\n[federate.data_args]\ncrop_size = 64\n'
                    '[run]\ndevice = "cpu"\nprogress = false\n')
    out = tmp_path / "r"
    assert federate(["--config", str(toml), "--out", str(out)]) == 0
    saved = config(out)["federate"]
    assert saved["alpha"] == 0.05 and saved["crop_size"] == 64
    toml.write_text(toml.read_text().replace("alpha = 0.05", 'alpha = "x"'))
    assert federate(["--config", str(toml), "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "[federate.partition_args]" in err[0]


def test_federate_flags_beside_a_toml_file_win(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('[federate]\nwidth = 0.25\nclients = 3\nrounds = 2\nlocal_epochs = 1\nalpha = 1.0\n'
                    'batch_size = 32\nalgo = "fedprox"\nsave_local_models = [1]\n\n[algo]\nmu = 0.2\n\n'
                    '[run]\ndevice = "cpu"\nprogress = false\n')
    out = tmp_path / "r"
    argv = ["--config", str(toml), "--rounds", "1", "--save-local-models", "1", "--out", str(out)]
    assert federate(argv) == 0
    saved = config(out)
    assert saved["federate"]["rounds"] == 1 and saved["federate"]["clients"] == 3  # the flag, the file
    assert saved["federate"]["alpha"] == 1.0 and saved["algo"] == {"mu": 0.2}
    assert len(metrics(out)) == 1


def test_federate_drops_the_files_algorithm_settings_for_another_algo(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('[federate]\nalgo = "fedprox"\n\n[algo]\nmu = 0.2\n')
    out = tmp_path / "r"
    argv = ["--config", str(toml), *FED, "--rounds", "1", "--algo", "fedavgm", "--out", str(out)]
    assert federate(argv) == 0
    assert config(out)["federate"]["algo"] == "fedavgm" and "mu" not in config(out)["algo"]


@pytest.mark.parametrize("text,says", [
    ("[federate]\nroundz = 3\n", "unknown key 'roundz'"),
    ("[federate]\nrounds = \"many\"\n", "setting 'rounds' must be a int"),
    ("[federate]\nrounds = 0\n", "[federate]: setting 'rounds' must lie in [1, inf)"),
    ("[federate]\nalpha = -1\n", "'alpha' must lie in (0, inf)"),
    ("[federate.tracking]\nevery = \"x\"\n", "[federate.tracking]"),
    ("[algo]\nmu = 1\n", "fedavg has no setting 'mu'"),
    ("[run]\ndevice = \"tpu\"\n", "tpu"),
    ("[federat]\nrounds = 1\n", "unknown table 'federat'"),
    ("[federate\n", "not valid TOML"),
    ("rounds = 1\n", "unknown table 'rounds'"),
])
def test_a_bad_federate_file_is_one_line(tmp_path, capsys, text, says):
    toml = tmp_path / "bad.toml"
    toml.write_text(text)
    err = one_line_error(capsys, federate, ["--config", toml, "--out", tmp_path / "r"], root=tmp_path)
    assert says in err and not (tmp_path / "r").exists()


def test_a_missing_or_unknown_kind_of_file_is_one_line(tmp_path, capsys):
    assert "cannot read" in one_line_error(capsys, federate, ["--config", tmp_path / "none.toml"])
    (tmp_path / "c.yaml").write_text("rounds: 1\n")
    assert ".toml" in one_line_error(capsys, pretrain, ["--config", tmp_path / "c.yaml"])
    assert "FILE" in one_line_error(capsys, pretrain, ["--config"])


def test_pretrain_replays_a_run_from_its_config_json_bit_for_bit(tmp_path):
    x, y = tmp_path / "x.ckpt", tmp_path / "y.ckpt"
    assert pretrain(["fps", *PRE, "--epochs", "2", "--pairs-per-epoch", "16", "--method", "mocov2",
                     "--set", "bank_size=32", "--lr", "0.07", "--seed", "2", "--out", str(x)]) == 0
    assert pretrain(["--config", str(tmp_path / "x.run" / "config.json"), "--device", "cpu", "--quiet",
                     "--out", str(y)]) == 0
    xr, yr = tmp_path / "x.run", tmp_path / "y.run"
    assert config(yr) == config(xr) and config(xr)["method"]["lr"] == 0.07
    assert metrics(yr) == metrics(xr) and len(metrics(xr)) == 2
    backbones = [torch.load(path, weights_only=True)["backbone"] for path in (x, y)]
    assert_same_tensors(*backbones)


def test_pretrain_toml_with_flags_beside_it(tmp_path, capsys):
    toml = tmp_path / "p.toml"
    toml.write_text('[pretrain]\nsource = "multilabel"\narch = "resnet20"\nwidth = 0.25\nsize = 16\n'
                    'epochs = 1\nbatch_size = 8\npairs_per_epoch = 16\nn_classes = 7\n\n'
                    '[method]\nlr = 0.2\n\n[run]\ndevice = "cpu"\nprogress = false\n')
    out = tmp_path / "m.ckpt"
    assert pretrain(["--config", str(toml), "--classes", "5", "--out", str(out)]) == 0
    saved = config(tmp_path / "m.run")
    assert saved["pretrain"]["source"] == "multilabel" and saved["pretrain"]["n_classes"] == 5
    assert saved["method"]["lr"] == 0.2 and saved["pretrain"]["width"] == 0.25
    (tmp_path / "bad.toml").write_text('[method]\ntemperature = 0\n')  # SimSiam has no temperature
    err = one_line_error(capsys, pretrain, ["--config", tmp_path / "bad.toml", *PRE, "--out", tmp_path / "b"])
    assert "simsiam has no setting 'temperature'" in err
