"""Where analyze writes by default (issue 24): beside the runs or checkpoints it reads, never into the
working directory: from a clone's root, ``./analysis`` is the analysis package itself."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from analysis.cli import main as analyze
from federated.datasets import DataConfig, load_dataset
from federated.experiment import FederateConfig, RunOptions
from federated.oracle.tracking import TrackConfig
from federated.runner import run
from pretrain.cli import main as pretrain

REPO = Path(__file__).resolve().parents[2]


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def clone(tmp_path, monkeypatch):
    """A fresh clone of this repository (its committed tree), as the working directory."""
    path = tmp_path / "clone"
    _git("clone", "--quiet", "--no-hardlinks", str(REPO), str(path), cwd=tmp_path)
    monkeypatch.chdir(path)
    return path


def _runs(root: Path) -> list[Path]:
    """Three one-round digits runs (seeds 0-2) on 200 images, the first tracking convex and variance."""
    data = load_dataset(DataConfig())
    few = dataclasses.replace(data, train_x=data.train_x[:200], train_y=data.train_y[:200],
                              test_x=data.test_x[:100], test_y=data.test_y[:100])
    paths = []
    for seed in range(3):
        track = TrackConfig(track=("convex", "variance"), every=1, convex_epochs=1, variance_samples=5)
        cfg = FederateConfig(width=0.25, clients=2, rounds=1, local_epochs=1, batch_size=64, partition="iid",
                             seed=seed, tracking=track if seed == 0 else TrackConfig())
        paths.append(root / f"run{seed}")
        run(cfg, RunOptions(out=paths[-1], device="cpu", progress=False), data=few)
    return paths


@pytest.mark.slow
def test_every_analyze_command_leaves_a_clone_clean(clone, tmp_path, capsys):
    runs = [str(p) for p in _runs(tmp_path / "runs")]
    ckpt = tmp_path / "ckpts" / "p.ckpt"
    assert pretrain(["fps", "--arch", "resnet20", "--width", "0.25", "--size", "16", "--epochs", "1",
                     "--pairs-per-epoch", "16", "--batch-size", "16", "--device", "cpu", "--quiet",
                     "--out", str(ckpt)]) == 0
    commands = {
        ("dynamics", runs[0]): Path(runs[0]) / "figures" / "dynamics.json",
        ("dynamics", *runs): tmp_path / "runs" / "analysis" / "dynamics.json",
        ("convex", runs[0], "--device", "cpu"): Path(runs[0]) / "figures" / "convex.json",
        ("variance", runs[0]): Path(runs[0]) / "figures" / "variance.json",
        ("landscape", *runs, "--grid", "2", "--eval-samples", "16", "--device", "cpu"):
            tmp_path / "runs" / "analysis" / "landscape_anchors.json",
        ("report", *runs): tmp_path / "runs" / "analysis" / "report.md",
        ("probe", str(ckpt), "--device", "cpu"): tmp_path / "ckpts" / "analysis" / "probe.json",
        ("budget", str(ckpt), "--device", "cpu"): tmp_path / "ckpts" / "analysis" / "budget.json",
    }
    for args, expected in commands.items():
        assert analyze(list(args)) == 0, capsys.readouterr().err
        assert expected.is_file(), args
        assert _git("status", "--porcelain", "--untracked-files=all", cwd=clone) == "", args


def test_a_missing_checkpoint_creates_no_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for command in ("probe", "budget"):
        assert analyze([command, "missing.ckpt", "--device", "cpu"]) == 2
        err = capsys.readouterr().err
        assert "missing.ckpt" in err and len(err.strip().splitlines()) == 1
        assert list(tmp_path.iterdir()) == []


def test_runs_in_a_source_tree_need_an_explicit_out(tmp_path, monkeypatch, capsys):
    """Runs whose common parent holds an ``analysis`` package (a clone's root) are refused, not written."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    (tmp_path / "analysis").mkdir()
    (tmp_path / "analysis" / "__init__.py").write_text("")
    from analysis.output import default_dir
    from fpsfl.base.cli import UsageError

    with pytest.raises(UsageError, match="give --out"):
        default_dir([tmp_path / "a", tmp_path / "b"])
    beside = default_dir([tmp_path / "a" / "x", tmp_path / "a" / "y"])
    assert beside == (tmp_path / "a" / "analysis").resolve()


def test_a_second_analysis_into_the_same_folder_is_refused_unless_forced(tmp_path, capsys):
    """Issue 42: two reports of other runs into one --out (or one run's figures/ twice) never replace
    the first one's files silently: one line, exit 2, the files untouched; --force replaces them."""
    runs = [str(p) for p in _runs(tmp_path / "runs")]
    out = tmp_path / "out"
    assert analyze(["report", *runs[:2], "--out", str(out)]) == 0
    first = (out / "report.md").read_text()
    assert analyze(["dynamics", runs[0]]) == 0  # into RUN/figures
    capsys.readouterr()
    for args in (["report", runs[2], "--out", str(out)], ["dynamics", runs[0]]):
        assert analyze(args) == 2, args
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "--force" in err, err
    assert (out / "report.md").read_text() == first
    assert analyze(["report", runs[2], "--out", str(out), "--force"]) == 0
    assert (out / "report.md").read_text() != first
