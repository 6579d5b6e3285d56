"""The `federate` CLI and model initialisation: a digits run, pretrain checkpoints, one-line errors."""

import json

import pytest
import torch

from federated.cli import main
from federated.experiment import FederateConfig
from federated.initialisation import InitError, check_partition, initialise, pretraining_size
from federated.setup import setup
from fpsfl.base.checkpoint import make_checkpoint, save_checkpoint
from pretrain.backbones import create_backbone

TINY = ["--width", "0.25", "--clients", "3", "--rounds", "1", "--local-epochs", "1", "--device", "cpu",
        "--quiet", "--alpha", "1.0", "--batch-size", "32"]


def _cli(args, capsys):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _ckpt(path, arch="resnet20", width=0.25, seed=1):
    torch.manual_seed(seed)
    net = create_backbone(arch, width)
    save_checkpoint(make_checkpoint(net, arch=arch, width=width, method="simsiam", source="fps", epoch=1,
                                    config={}), path)
    return net


def test_digits_run_writes_the_run_directory(tmp_path, capsys):
    code, out, err = _cli(["--out", tmp_path / "d", *TINY, "--save-local-models", "1"], capsys)
    assert code == 0, err
    assert "test acc" in out
    run = tmp_path / "d"
    for name in ("config.json", "metrics.jsonl", "partition.json", "partition.png", "state.pt", "final.pt"):
        assert (run / name).is_file(), name
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert row["round"] == 1 and 0 <= row["test_acc"] <= 1 and len(row["local_accs"]) == 3
    config = json.loads((run / "config.json").read_text())["config"]["federate"]
    assert config["lr"] == 0.02 and config["batch_size"] == 32 and config["optimizer"] == "sgd"  # resolved
    assert sorted(p.name for p in (run / "local" / "round_0001").iterdir()) == [
        "client_000.pt", "client_001.pt", "client_002.pt", "global.pt"]


def test_init_from_a_pretrain_checkpoint_loads_every_backbone_tensor(tmp_path):
    net = _ckpt(tmp_path / "fps.ckpt")
    cfg = FederateConfig(width=0.25, init=str(tmp_path / "fps.ckpt"), clients=3)
    s = setup(cfg, torch.device("cpu"))
    loaded = s.model.backbone.state_dict()
    assert set(loaded) == set(net.state_dict())
    assert all(torch.equal(loaded[k], v) for k, v in net.state_dict().items())
    n = len(net.state_dict())
    assert f"{n}/{n} backbone tensors loaded" in s.init_report


def test_torchvision_state_dict_and_imagenet_cache(tmp_path, monkeypatch):
    net = create_backbone("resnet18")
    state = {f"module.{k}": v for k, v in net.state_dict().items()}
    state["module.fc.weight"] = torch.zeros(365, 512)  # a Places365 head is skipped
    torch.save({"state_dict": state}, tmp_path / "places.pth")
    fresh = create_backbone("resnet18")
    assert "tensors loaded" in initialise(fresh, "resnet18", 1.0, str(tmp_path / "places.pth"), "torchvision")
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in net.state_dict().items())
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    with pytest.raises(InitError, match="resnet18-f37072fd.pth"):
        initialise(fresh, "resnet18", 1.0, "imagenet")


def test_places365_file_as_published_loads_its_backbone(tmp_path):
    """--init places365:FILE reads the Places365 project's resnet18_places365.pth.tar (legacy torch format,
    state_dict under module., 365-way fc), the Tiny-ImageNet init of §4.1; other files are refused."""
    from recipes.smoke_data import write_places365

    path = tmp_path / "resnet18_places365.pth.tar"
    state = write_places365(path, seed=3)
    fresh = create_backbone("resnet18")
    report = initialise(fresh, "resnet18", 1.0, f"places365:{path}")
    assert "Places365" in report and f"{len(fresh.state_dict())} backbone tensors" in report
    assert all(torch.equal(v, state[k]) for k, v in fresh.state_dict().items())  # fc skipped, all else equal
    plain = {k: v for k, v in state.items()}
    torch.save(plain, tmp_path / "plain.pth")  # no state_dict wrapper: not the published file
    with pytest.raises(InitError, match="no 'state_dict'.*--init-format torchvision"):
        initialise(create_backbone("resnet18"), "resnet18", 1.0, f"places365:{tmp_path / 'plain.pth'}")
    torch.save({"state_dict": {**plain, "fc.weight": torch.zeros(1000, 512)}}, tmp_path / "in1k.pth")
    with pytest.raises(InitError, match="not the Places365 classifier's 365 outputs"):
        initialise(create_backbone("resnet18"), "resnet18", 1.0, f"places365:{tmp_path / 'in1k.pth'}")
    with pytest.raises(InitError, match="no such file"):
        initialise(create_backbone("resnet18"), "resnet18", 1.0, f"places365:{tmp_path / 'none.tar'}")
    check_partition(f"places365:{path}", "fpsfl", {})  # no partition recorded: nothing to refuse
    assert pretraining_size(f"places365:{path}") is None


def test_an_existing_run_is_not_overwritten(tmp_path, capsys):
    assert _cli(["--out", tmp_path / "d", *TINY], capsys)[0] == 0
    before = (tmp_path / "d" / "metrics.jsonl").read_text()
    code, _, err = _cli(["--out", tmp_path / "d", *TINY], capsys)
    assert code == 2 and "--resume" in err
    assert (tmp_path / "d" / "metrics.jsonl").read_text() == before


@pytest.mark.parametrize("args,message", [
    (["--dataset", "cifar10"], "cifar10"),
    (["--dataset", "cifar10", "--data-root", "/no/such/dir"], "/no/such/dir"),
    (["--dataset", "mnist"], "unknown dataset"),
    (["--partition", "zipf"], "zipf"),
    (["--algo", "fedsgd"], "fedsgd"),
    (["--alpha", "0"], "alpha"),
    (["--alpha", "-1"], "alpha"),
    (["--clients", "5000"], "clients"),
    (["--participation", "0"], "participation"),
    (["--participation", "1.5"], "participation"),
    (["--set", "mu=0.1"], "mu"),
    (["--algo", "fedprox", "--set", "mu=abc"], "mu"),
    (["--arch", "resnet99"], "resnet99"),
    (["--init", "/no/such.ckpt"], "/no/such.ckpt"),
    (["--resume"], "no training state"),
    (["--init", "fps-mocov2-resnet20"], "ships no"),
    (["--track", "bogus"], "bogus"),
    (["--track", "convex", "--track-every", "0"], "--track-every"),
    (["--track", "convex", "--convex-data", "val", "--val-fraction", "0"], "validation split"),
    (["--cuda-graph"], "--cuda-graph needs a CUDA device"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    code, _, err = _cli(["--out", tmp_path / "r", "--device", "cpu", "--quiet", *args], capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_checkpoint_of_another_arch_is_refused(tmp_path, capsys):
    _ckpt(tmp_path / "r32.ckpt", arch="resnet32")
    code, _, err = _cli(["--out", tmp_path / "r", *TINY, "--init", tmp_path / "r32.ckpt"], capsys)
    assert code == 2 and "resnet32" in err and len(err.strip().splitlines()) == 1


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for flag in ("--dataset", "--data-root", "--partition", "--alpha", "--clients", "--participation",
                 "--rounds", "--local-epochs", "--algo", "--init", "--seed", "--out", "--resume", "--device",
                 "--centralized", "--bn", "--save-local-models", "--init-format"):
        assert flag in text


def test_a_plugin_setting_is_in_its_own_help_section_wherever_it_is_a_flag(capsys):
    """A dataset's settings carry their help section (cityscapes: "segmentation (cityscapes)"); a parser
    with sections gives them that one, not its general options (self-pre-training did, issue 39)."""
    from federated.selfsup.cli import build_parser as self_pretrain

    for parser in (main, lambda argv: self_pretrain().parse_args(argv)):
        with pytest.raises(SystemExit):
            parser(["--help"])
        text = capsys.readouterr().out
        section = text[text.index("\nsegmentation (cityscapes):"):]
        assert "--crop-size" in section.split("\n\n")[0] and "--eval-size" in section.split("\n\n")[0]


def test_export_partitions_help_has_sections(capsys):
    """``federate export-partitions --help`` groups its flags as ``federate --help`` does: a partition's
    settings under partition, a dataset's under its own section, the seed and --out under run."""
    with pytest.raises(SystemExit):
        main(["export-partitions", "--help"])
    text = capsys.readouterr().out

    def section(name):
        return text[text.index(f"\n\n{name}:\n") + 2:].split("\n\n")[0]

    assert "--dataset" in section("data") and "--alpha" in section("partition")
    assert all(flag in section("run") for flag in ("--seed", "--out", "--quiet"))
    assert "--crop-size" in section("segmentation (cityscapes)")
    assert "--alpha" not in section("options")


def test_a_plugin_flag_the_run_does_not_read_is_named(monkeypatch, capsys):
    """--partition iid --alpha 0.5 runs IID: federate says --alpha is not read, in one note line, and
    stays silent for settings the run's partition and dataset read (issue 39)."""
    import federated.cli as cli
    from federated.flags import unread_settings

    monkeypatch.setattr(cli.runner, "run", lambda cfg, opts: [])
    assert main(["--partition", "iid", "--alpha", "0.5", "--device", "cpu", "--quiet"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "note:" in err[0] and "--alpha" in err[0] and "dirichlet" in err[0]
    assert main(["--partition", "dirichlet", "--alpha", "0.5", "--device", "cpu", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert unread_settings(["split_csv", "alpha"], "dirichlet", "cifar10") == [
        "--split-csv is a setting of --dataset inat-geo; this run (--partition dirichlet, --dataset cifar10) "
        "does not read it"]
    assert unread_settings(["split_csv", "rounds"], "natural", "inat-geo") == []


def test_divergence_stops_with_one_line_and_keeps_the_finished_rounds(tmp_path, capsys):
    code, _, err = _cli(["--out", tmp_path / "d", *TINY, "--lr", "1e12"], capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "loss became" in err
    assert "Traceback" not in err and "no round finished" in err
    assert not (tmp_path / "d").exists()  # a run that finished no round leaves nothing behind


def test_a_checkpoint_sets_the_input_size_it_was_pre_trained_at(tmp_path, capsys):
    """A 16 px checkpoint fine-tunes at 16 px unless --input-size says otherwise (recorded in config.json,
    kept on --resume even after the checkpoint moved)."""
    net = create_backbone("resnet20", 0.25)
    save_checkpoint(make_checkpoint(net, arch="resnet20", width=0.25, method="simsiam", source="fps", epoch=1,
                                    config={"pretrain": {"size": 16}}), tmp_path / "c16.ckpt")
    code, _, err = _cli(["--out", tmp_path / "r", *TINY, "--init", tmp_path / "c16.ckpt", "--rounds", "1"],
                        capsys)
    assert code == 0, err
    config = json.loads((tmp_path / "r" / "config.json").read_text())["config"]["federate"]
    assert config["input_size"] == 16
    argv = ["--out", tmp_path / "e", *TINY, "--init", tmp_path / "c16.ckpt", "--input-size", "32"]
    assert _cli(argv, capsys)[0] == 0
    assert json.loads((tmp_path / "e" / "config.json").read_text())["config"]["federate"]["input_size"] == 32



def test_init_is_opened_once_per_run(tmp_path, capsys, monkeypatch):
    """--init resolved once (issue 39): one read of the checkpoint a run, however many checks use it (the
    arch and width check, the partition check, the input size, the verdict, the loading itself)."""
    from federated import initialisation

    net = create_backbone("resnet20", 0.25)
    save_checkpoint(make_checkpoint(net, arch="resnet20", width=0.25, method="simsiam", source="fps", epoch=1,
                                    config={"pretrain": {"size": 16}}), tmp_path / "c.ckpt")
    opened = []
    real = initialisation.load_checkpoint
    monkeypatch.setattr(initialisation, "load_checkpoint", lambda path: opened.append(path) or real(path))
    argv = ["--out", tmp_path / "r", *TINY, "--init", tmp_path / "c.ckpt", "--rounds", "1"]
    code, _, err = _cli(argv, capsys)
    assert code == 0, err
    assert opened == [tmp_path / "c.ckpt"]
    record = json.loads((tmp_path / "r" / "config.json").read_text())["config"]
    assert record["init_sha256"] == initialisation.file_sha256(tmp_path / "c.ckpt")


def test_the_loader_settings_are_the_data_group():
    """A dataset flag is declared once per config (FederateConfig's data group, DataConfig) and copied by
    name (federated.setup.data_config); self-pre-training takes the whole group (issue 39)."""
    from dataclasses import fields

    from federated.datasets import DataConfig
    from federated.selfsup.config import DATA_FIELDS
    from federated.setup import _AS_NAMED, data_config
    from fpsfl.base.settings import group_fields

    data_group = set(group_fields(FederateConfig, "data"))
    loader = {_AS_NAMED.get(f.name, f.name) for f in fields(DataConfig)}
    assert loader - {"seed"} <= data_group and data_group - loader == {"input_size"}  # input_size: the model
    assert data_group <= set(DATA_FIELDS)
    cfg = FederateConfig(data_root="x", decode="memory", verify=False, val_fraction=0.1, seed=4)
    assert (data_config(cfg).root, data_config(cfg).decode, data_config(cfg).seed) == ("x", "memory", 4)


def test_a_run_resumes_however_its_algorithm_setting_was_spelled(tmp_path, capsys):
    """``--set mu=0.01``, ``--set mu=0.010`` and a file's ``mu = 0.01`` are one setting: the run resumes
    with any of them, also from a record written before settings were typed (the text "0.01"); another
    value is refused, by name."""
    run = ["--out", tmp_path / "d", *TINY, "--algo", "fedprox"]
    assert _cli([*run, "--set", "mu=0.01"], capsys)[0] == 0
    record = tmp_path / "d" / "config.json"
    saved = json.loads(record.read_text())
    assert saved["config"]["federate"]["algo_args"] == {"mu": 0.01}
    assert _cli([*run, "--set", "mu=0.010", "--resume"], capsys)[0] == 0
    saved["config"]["federate"]["algo_args"]["mu"] = "0.01"  # as runs before the fix recorded it
    record.write_text(json.dumps(saved))
    assert _cli([*run, "--set", "mu=1e-2", "--resume"], capsys)[0] == 0
    code, _, err = _cli([*run, "--set", "mu=0.02", "--resume"], capsys)
    assert code == 2 and "algo_args.mu differ" in err
