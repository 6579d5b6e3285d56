"""--tensorboard DIR and analyze tensorboard (issue 34): every metrics line as TensorBoard scalars, read back
with tensorboard's own reader (EventAccumulator) and compared with metrics.jsonl, the record."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from analysis.cli import main as analyze
from federated.cli import main as federate
from fpsfl.base.tensorboard import ScalarWriter, run_log_dir, scalars
from pretrain.cli import main as pretrain
from tests.test_robustness import FED, PRE, one_line_error

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def events(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] as TensorBoard reads the folder."""
    acc = event_accumulator.EventAccumulator(str(log_dir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def expected(run: Path, step: str) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] from metrics.jsonl."""
    out: dict[str, list[tuple[int, float]]] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        for tag, value in scalars(row):
            out.setdefault(tag, []).append((row[step], value))
    return out


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for tag, points in want.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in points], rel=1e-6, abs=1e-7), tag


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """A federate run of 2 rounds that tracks the §6.2 analyses, with --tensorboard."""
    root = tmp_path_factory.mktemp("tb")
    argv = [*FED, "--track", "convex,variance", "--track-every", "2", "--variance-samples", "3",
            "--convex-epochs", "1", "--out", str(root / "fed"), "--tensorboard", str(root / "live")]
    assert federate(argv) == 0
    return root


def test_federate_writes_every_metrics_line_while_it_runs(tracked_run):
    got = events(run_log_dir(tracked_run / "live", tracked_run / "fed"))
    assert_same(got, expected(tracked_run / "fed", "round"))
    assert {"test_acc", "train_loss", "local_acc", "convex/convex_acc", "variance/var"} <= got.keys()
    assert [s for s, _ in got["test_acc"]] == [1, 2] and [s for s, _ in got["variance/var"]] == [2]


def test_analyze_tensorboard_writes_the_same_events_after_the_fact_with_the_gains(tracked_run):
    assert analyze(["tensorboard", str(tracked_run / "fed"), "--out", str(tracked_run / "after")]) == 0
    got = events(run_log_dir(tracked_run / "after", tracked_run / "fed"))
    live = events(run_log_dir(tracked_run / "live", tracked_run / "fed"))
    assert {tag: got[tag] for tag in live} == live
    rows = [json.loads(x) for x in (tracked_run / "fed" / "metrics.jsonl").read_text().splitlines()]
    d_global = [r["test_acc"] - r["local_acc"] for r in rows]  # Eq. 3: ΔG = Acc(global) - mean local acc
    assert [v for _, v in got["analysis/d_global"]] == pytest.approx(d_global, abs=1e-6)
    assert set(got) - set(live) == {"analysis/d_local", "analysis/d_global"}


def test_pretrain_writes_its_epochs_and_rankme(tmp_path):
    out = tmp_path / "fps.ckpt"
    argv = ["fps", *PRE, "--epochs", "2", "--pairs-per-epoch", "16", "--out", str(out), "--tensorboard",
            str(tmp_path / "tb")]
    assert pretrain(argv) == 0
    got = events(run_log_dir(tmp_path / "tb", tmp_path / "fps.run"))
    assert_same(got, expected(tmp_path / "fps.run", "epoch"))
    assert {"loss", "rankme", "z_std", "lr"} <= got.keys() and [s for s, _ in got["loss"]] == [1, 2]


def test_a_resumed_writer_replaces_the_steps_it_does_again(tmp_path):
    first = ScalarWriter(tmp_path)
    for step, acc in ((1, 0.1), (2, 0.2), (3, 0.3)):
        first.write({"round": step, "test_acc": acc})
    first.close()
    again = ScalarWriter(tmp_path)  # a run resumed after round 1 (rounds 2 and 3 were lost)
    for step, acc in ((2, 0.25), (3, 0.35)):
        again.write({"round": step, "test_acc": acc})
    again.close()
    assert events(tmp_path)["test_acc"] == [(1, pytest.approx(0.1)), (2, pytest.approx(0.25)),
                                            (3, pytest.approx(0.35))]


def test_without_the_package_asking_for_events_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    err = one_line_error(capsys, federate, [*FED, "--out", tmp_path / "r", "--tensorboard", tmp_path / "tb"])
    assert "pip install 'fpsfl[tensorboard]'" in err and not (tmp_path / "r").exists()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"epoch": 1, "loss": 1.0}\n')
    err = one_line_error(capsys, analyze, ["tensorboard", tmp_path / "run", "--out", tmp_path / "tb"])
    assert "tensorboard package" in err and not (tmp_path / "tb").exists()


def test_analyze_tensorboard_bad_input_is_one_line(tmp_path, capsys):
    err = one_line_error(capsys, analyze, ["tensorboard", tmp_path / "none", "--out", tmp_path / "tb"])
    assert "no metrics.jsonl" in err and not (tmp_path / "tb").exists()
    for parent in ("a", "b"):
        (tmp_path / parent / "x").mkdir(parents=True)
        (tmp_path / parent / "x" / "metrics.jsonl").write_text('{"round": 1, "test_acc": 0.5}\n')
    assert analyze([str(a) for a in ("tensorboard", tmp_path / "a" / "x", tmp_path / "b" / "x", "--out",
                                     tmp_path / "tb")]) == 0
    capsys.readouterr()
    err = one_line_error(capsys, analyze, ["tensorboard", tmp_path / "b" / "x", "--out", tmp_path / "tb"])
    assert "already holds" in err  # a second export never overwrites the first


def test_two_runs_of_the_same_name_keep_their_own_curves(tmp_path):
    """e1/x and e2/x with one --tensorboard root (issue 42): each run its own folder, so the second's purge
    of the steps it writes cannot delete the first's curve."""
    for parent in ("e1", "e2"):
        argv = [*FED, "--out", str(tmp_path / parent / "x"), "--tensorboard", str(tmp_path / "tb")]
        assert federate(argv) == 0
    folders = sorted(p.name for p in (tmp_path / "tb").iterdir())
    assert len(folders) == 2 and all(f.startswith("x-") for f in folders)
    for parent in ("e1", "e2"):
        got = events(run_log_dir(tmp_path / "tb", tmp_path / parent / "x"))
        assert_same(got, expected(tmp_path / parent / "x", "round"))


# CI's 20-minute budget (2026-12-02): 40 s; federate's rounds are the test above
@pytest.mark.slow
def test_self_pretraining_writes_its_rounds(tmp_path):
    """federate self-pretrain --tensorboard wrote nothing (issue 42)."""
    argv = ["self-pretrain", "--dataset", "digits", "--clients", "2", "--rounds", "1", "--width", "0.25",
            "--quiet", "--out", str(tmp_path / "sp.ckpt"), "--tensorboard", str(tmp_path / "tb")]
    assert federate(argv) == 0
    got = events(run_log_dir(tmp_path / "tb", tmp_path / "sp.run"))
    assert_same(got, expected(tmp_path / "sp.run", "round"))


@pytest.mark.parametrize("main, base", [(federate, FED), (pretrain, ["fps", *PRE])],
                         ids=["federate", "pretrain"])
def test_a_tensorboard_folder_that_cannot_be_made_is_one_line_before_the_run(tmp_path, capsys, main, base):
    """A file where the folder should be, a file above it, or a root nobody can make folders in (/proc):
    exit 2 in one line before anything runs, not a traceback at the first metrics line."""
    (tmp_path / "a-file").write_text("x")
    bad = [tmp_path / "a-file", tmp_path / "a-file" / "below"]
    bad += [Path("/proc/fpsfl-no-such-folder")] if Path("/proc/self").is_dir() else []
    for target in bad:
        out = tmp_path / "r.ckpt" if main is pretrain else tmp_path / "r"
        err = one_line_error(capsys, main, [*base, "--out", out, "--tensorboard", target], root=tmp_path)
        assert "--tensorboard" in err and not out.exists(), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
