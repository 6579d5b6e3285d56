"""config.json's format and its one migration (issue 39): a run written before a setting existed, or before
its default changed, replays, resumes and is analysed as it ran; a newer format is refused in one line."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from analysis.runs import AnalysisError, load_run
from federated.cli import main as federate
from fpsfl.base.migrate import FORMAT, FormatError, migrate
from pretrain.cli import main as pretrain
from tests.test_robustness import FED, PRE, one_line_error


def _record(run: Path) -> dict:
    return json.loads((run / "config.json").read_text())


def _as_format_1(run: Path, drop_federate=(), drop_algo=(), drop_pretrain=()) -> None:
    """Rewrite a run's config.json as a run of format 1 would have left it: no format key, and the settings
    that came later missing from its tables."""
    data = _record(run)
    data.pop("config_format")
    for table, keys in (("federate", drop_federate), ("algo", drop_algo), ("pretrain", drop_pretrain)):
        for key in keys:
            del data["config"][table][key]
    (run / "config.json").write_text(json.dumps(data))


def v1_federate(algo: str, resolved: dict) -> dict:
    return {"config": {"federate": {"algo": algo, "algo_args": {}, "rounds": 2}, "algo": resolved},
            "code_version": "old"}


def test_new_runs_record_the_format(tmp_path):
    assert federate([*FED, "--rounds", "1", "--out", str(tmp_path / "r")]) == 0
    assert _record(tmp_path / "r")["config_format"] == FORMAT


@pytest.mark.parametrize(("resolved", "pinned"), [({"beta": 0.9}, False), ({"nesterov": False}, False),
                                                  ({"nesterov": True}, True)])
def test_format_1_fedavgm_replays_the_momentum_it_ran(resolved, pinned):
    """Before issue 30 FedAvgM was heavy-ball (no nesterov setting, or nesterov False by default); a format-1
    replay took today's default (Nesterov) since only --set was replayed."""
    old = v1_federate("fedavgm", resolved)
    new = migrate(old, "config.json")
    assert new["config"]["federate"]["algo_args"] == {"nesterov": pinned}
    assert new["config"]["algo"]["nesterov"] is pinned and new["config_format"] == FORMAT
    assert old == v1_federate("fedavgm", resolved)  # the input is not changed


def test_format_1_fills_settings_added_later_with_what_its_runs_had():
    new = migrate(v1_federate("fedvc", {}), "config.json")["config"]
    assert new["federate"]["algo_args"] == {"draw": "epoch"}  # FedVC drew every epoch before issue 30
    assert {k: new["federate"][k] for k in ("amp", "balance", "deal", "noise_scale")} == {
        "amp": False, "balance": "niid-bench", "deal": "balanced", "noise_scale": "std"}
    pre = migrate({"config": {"pretrain": {"method": "simsiam"}}, "code_version": "old"}, "c")["config"]
    assert pre["pretrain"]["init_scale"] == 1.0  # every run before issue 38 trained from the He init
    kept = migrate({"config": {"federate": {"algo": "fedavg", "amp": True}}}, "c")["config"]["federate"]
    assert kept["amp"] is True and kept["algo_args"] == {}  # what a record holds is never replaced


def test_format_1_self_pretraining_gains_only_what_its_record_holds():
    """Self-pre-training's federate table holds the data, partition and model settings: a migration that
    added federate's training settings (amp, algo_args) to it would refuse the --resume of every older run."""
    old = {"config": {"self_pretrain": {"algo": "orchestra"}, "federate": {"dataset": "digits"}}}
    assert migrate(old, "c")["config"]["federate"] == {
        "dataset": "digits", "balance": "niid-bench", "deal": "balanced", "noise_scale": "std"}


def test_a_current_record_is_left_as_it_is(tmp_path):
    assert federate([*FED, "--rounds", "1", "--algo", "fedavgm", "--out", str(tmp_path / "r")]) == 0
    data = _record(tmp_path / "r")
    assert migrate(copy.deepcopy(data), "c") == data


@pytest.mark.parametrize("version", [FORMAT + 1, 0, "2", True])
def test_a_format_it_cannot_read_is_one_line(version):
    with pytest.raises(FormatError, match="config.json"):
        migrate({"config_format": version, "config": {}}, "config.json")


def test_format_1_run_replays_resumes_and_is_analysed_as_it_ran(tmp_path, capsys):
    x, y = tmp_path / "x", tmp_path / "y"
    assert federate([*FED, "--algo", "fedavgm", "--set", "nesterov=false", "--out", str(x)]) == 0
    data = _record(x)  # then written as a format-1 run would be: no --set, the settings of later issues gone
    data["config"]["federate"]["algo_args"] = {}
    (x / "config.json").write_text(json.dumps(data))
    _as_format_1(x, drop_federate=("amp", "balance", "deal", "noise_scale"))
    assert federate(["--config", str(x / "config.json"), "--device", "cpu", "--quiet", "--out", str(y)]) == 0
    assert _record(y)["config"]["algo"]["nesterov"] is False  # the heavy-ball run it was, not today's default
    assert (json.loads((y / "metrics.jsonl").read_text().splitlines()[-1])["test_acc"]
            == json.loads((x / "metrics.jsonl").read_text().splitlines()[-1])["test_acc"])
    assert load_run(x).config.algo_config().nesterov is False
    assert load_run(x).config.balance == "niid-bench"
    argv = ["--config", str(x / "config.json"), "--rounds", "3", "--device", "cpu", "--quiet",
            "--out", str(x), "--resume"]
    err = one_line_error(capsys, federate, argv)  # 3 rounds differ from its 2: refused, naming the setting
    assert "rounds" in err and "nesterov" not in err and "amp" not in err


def test_a_newer_format_is_refused_by_every_reader(tmp_path, capsys):
    x = tmp_path / "x"
    assert federate([*FED, "--rounds", "1", "--out", str(x)]) == 0
    data = _record(x)
    data["config_format"] = FORMAT + 1
    (x / "config.json").write_text(json.dumps(data))
    err = one_line_error(capsys, federate, ["--config", str(x / "config.json"), "--out", str(tmp_path / "y")])
    assert "newer fpsfl" in err
    with pytest.raises(AnalysisError, match="newer fpsfl"):
        load_run(x)


def test_format_1_pretrain_run_replays_its_he_init(tmp_path):
    x, y = tmp_path / "x.ckpt", tmp_path / "y.ckpt"
    assert pretrain(["fps", *PRE, "--pairs-per-epoch", "16", "--method", "simsiam", "--init-scale", "1",
                     "--out", str(x)]) == 0
    _as_format_1(tmp_path / "x.run", drop_pretrain=("init_scale",))
    assert pretrain(["--config", str(tmp_path / "x.run" / "config.json"), "--device", "cpu", "--quiet",
                     "--out", str(y)]) == 0
    saved = _record(tmp_path / "y.run")["config"]["pretrain"]
    assert saved["init_scale"] == 1.0 and saved["method"] == "simsiam"


def test_merge_layers_later_win_and_groups_merge_key_by_key():
    from federated.experiment import merge

    file = {"algo": "fedprox", "algo_args": {"mu": 0.2}, "rounds": 7, "tracking": {"every": 3}, "alpha": 1.0}
    assert merge(file, {"rounds": 2}).algo_config().mu == 0.2  # the file's FedProx mu, its algo kept
    cfg = merge(file, {"rounds": 2, "tracking": {"data": "test"}})
    assert (cfg.rounds, cfg.alpha, cfg.tracking.every, cfg.tracking.data) == (2, 1.0, 3, "test")
    other = merge(file, {"algo": "scaffold"})
    assert other.algo == "scaffold" and other.algo_args == {}  # another algo: the file's mu is not its
    assert merge(file, {"algo_args": {"mu": 0.5}}).algo_args == {"mu": 0.5}


@pytest.mark.parametrize("entry", ["federate", "self-pretrain", "flower", "record"])
def test_every_entry_point_builds_its_config_through_merge(entry, monkeypatch):
    """One door (issue 39): each way settings come in reaches FederateConfig through experiment.merge."""
    import federated.cli
    import federated.experiment
    import federated.flower.run_config
    import federated.selfsup.cli

    calls = []
    real = federated.experiment.merge

    def spy(*layers):
        calls.append(layers)
        return real(*layers)

    for module in (federated.cli, federated.experiment, federated.flower.run_config, federated.selfsup.cli):
        monkeypatch.setattr(module, "merge", spy)
    if entry == "federate":
        federated.cli.options_from(federated.cli.build_parser().parse_args(["--rounds", "3"]))
    elif entry == "self-pretrain":
        args = federated.selfsup.cli.build_parser().parse_args(["--rounds", "3"])
        federated.selfsup.cli.configs_from(args)
    elif entry == "flower":
        federated.flower.run_config.options_from_run_config({"num-server-rounds": 3})
    else:
        federated.experiment.FederateConfig.from_dict({"rounds": 3})
    assert len(calls) == 1 and any(layer.get("rounds") == 3 for layer in calls[0])


# the method settings each format N -> N + 1 added (fpsfl.base.migrate._METHOD_ADDED): older records lack them
_ADDED_AFTER = {2: {"mocov2": ("head_bn",)}, 3: {"mocov2": ("keep",)},
                4: {m: ("crop_min", "jitter", "jitter_p", "grayscale_p", "blur_p", "flip_p")
                    for m in ("mocov2", "simsiam")},
                5: {m: ("lr_schedule", "warmup_epochs")
                    for m in ("mocov2", "simsiam", "multilabel", "supervised")},
                6: {"mocov2": ("bank_start",)}, 7: {"mocov2": ("feature_uniformity",)},
                8: {"mocov2": ("symmetric",)}, 9: {m: ("background_p",) for m in ("mocov2", "simsiam")},
                10: {}, 11: {"mocov2": ("head_layers",)},
                12: {m: ("last_stage_lr",) for m in ("mocov2", "simsiam", "multilabel", "supervised")}}
_PRETRAIN_AFTER = {9: ("colours",), 10: ("flips",)}  # the pretrain table's settings format N -> N + 1 added
_SMALL = {"mocov2": ["--set", "hidden_dim=8", "--set", "bank_size=32"], "simsiam": ["--set", "hidden_dim=8"]}


@pytest.mark.parametrize(("version", "method", "key", "value"),
                         [(2, "mocov2", "head_bn", False), (3, "mocov2", "keep", "query"),
                          (4, "mocov2", "crop_min", 0.2), (4, "simsiam", "jitter", 1.0),
                          (5, "mocov2", "lr_schedule", "cosine"), (5, "simsiam", "warmup_epochs", 0.0),
                          (6, "mocov2", "bank_start", "random"), (7, "mocov2", "feature_uniformity", 0.0),
                          (8, "mocov2", "symmetric", False), (9, "mocov2", "background_p", 0.0),
                          (9, "simsiam", "background_p", 0.0), (9, "mocov2", "pretrain.colours", "own"),
                          (10, "mocov2", "pretrain.flips", "own"), (11, "mocov2", "head_layers", 2),
                          (12, "mocov2", "last_stage_lr", 1.0), (12, "simsiam", "last_stage_lr", 1.0)])
def test_a_run_written_before_a_method_setting_resumes(tmp_path, capsys, monkeypatch, version, method, key,
                                                       value):
    """MoCo-v2's head_bn came in format 3, keep in format 4, the views' settings of both self-supervised
    methods in format 5, every method's lr_schedule and warmup_epochs in format 6, MoCo-v2's bank_start in
    format 7, feature_uniformity in format 8, symmetric in format 9 and the views' background_p in format 10
    (with the pretrain table's colours), the pretrain table's flips in format 11, MoCo-v2's head_layers in
    format 12 and every method's last_stage_lr in format 13; an older run's method table lacks them, and
    --resume compares that table whole, so without the steps every earlier run of the method was refused."""
    import dataclasses

    import pretrain.cli as pcli

    out, train = tmp_path / "m.ckpt", pcli.train
    args = ["fps", *PRE, "--epochs", "2", "--pairs-per-epoch", "16", "--method", method, *_SMALL[method],
            "--out", str(out)]
    with monkeypatch.context() as mp:  # killed after its first epoch
        mp.setattr(pcli, "train", lambda cfg, opts: train(cfg, dataclasses.replace(opts, stop_after=1)))
        assert pretrain(args) == 0
    data = _record(tmp_path / "m.run")
    data["config_format"] = version
    for later in range(version, FORMAT):  # what the older format did not record
        for name in _ADDED_AFTER[later].get(method, ()):
            del data["config"]["method"][name]
        for name in _PRETRAIN_AFTER.get(later, ()):
            del data["config"]["pretrain"][name]
    (tmp_path / "m.run" / "config.json").write_text(json.dumps(data))
    table, _, name = key.rpartition(".")
    assert migrate(data, "config.json")["config"][table or "method"][name] == value
    assert pretrain([*args, "--resume"]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "m.run" / "metrics.jsonl").read_text().splitlines()[-1])["epoch"] == 2


def test_every_older_format_has_its_step():
    from fpsfl.base.migrate import STEPS

    assert sorted(STEPS) == list(range(1, FORMAT))  # raising FORMAT without a step would skip a migration


def test_a_config_json_that_is_not_an_object_is_one_line_for_every_reader(tmp_path, capsys):
    """migrate refuses a JSON value that is not an object as every reader's unreadable file (--resume's
    comparison gave an AttributeError traceback once migrate stood in front of it)."""
    x = tmp_path / "x"
    assert federate([*FED, "--rounds", "1", "--out", str(x)]) == 0
    (x / "config.json").write_text("[1]")
    err = one_line_error(capsys, federate, [*FED, "--out", str(x), "--resume"])
    assert "config.json is missing or unreadable (expected a JSON object, got list)" in err
    with pytest.raises(AnalysisError, match=r"config.json: unreadable \(expected a JSON object, got list\)"):
        load_run(x)
