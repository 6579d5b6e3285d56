"""Issue 24: no silent wrong result. A finished run that lost a metrics line, --client-batch where it cannot
equal one-at-a-time training, and the hostile inputs of the second probe round that were already right."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.cli import main as analyze
from federated import runner
from federated.cli import main as federate
from federated.experiment import FederateConfig, RunOptions
from fractals.cli import main as fractals
from tests.federated.test_algorithms import synthetic
from tests.test_robustness import FED, one_line_error


def _cfg(**kw) -> FederateConfig:
    return FederateConfig(width=0.25, clients=3, local_epochs=1, alpha=1.0, batch_size=32, **kw)


def _finished(tmp_path: Path, rounds: int = 3) -> Path:
    out = tmp_path / "r"
    runner.run(_cfg(rounds=rounds), RunOptions(out=out, device="cpu", progress=False), synthetic())
    return out


# ---- a finished run whose metrics lost a round ------------------------------------------------------
def test_a_finished_run_with_a_torn_last_line_is_refused_naming_the_round(tmp_path, capsys):
    out = _finished(tmp_path)
    path = out / "metrics.jsonl"
    text = path.read_text()
    path.write_text(text[: len(text) - len(text.splitlines()[-1]) // 2 - 1])  # round 3's line, torn
    err = one_line_error(capsys, analyze, ["report", out, "--out", tmp_path / "rep"])
    assert "round(s) 3" in err and not (tmp_path / "rep").exists()
    args = ["--out", out, *FED, "--rounds", "3", "--resume"]
    torn = path.read_text()
    err = one_line_error(capsys, federate, args)  # never "round 2/3" and exit 0
    assert "round(s) 3" in err and "torn" in err and path.read_text() == torn
    assert one_line_error(capsys, federate, args)  # and again: the run stays refused


def test_a_lost_middle_line_is_named_too(tmp_path, capsys):
    out = _finished(tmp_path)
    path = out / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + lines[2])
    err = one_line_error(capsys, analyze, ["dynamics", out, "--out", tmp_path / "d"])
    assert "round(s) 2 " in err
    err = one_line_error(capsys, federate, ["--out", out, *FED, "--rounds", "3", "--resume"])
    assert "round(s) 2," in err


def test_an_unfinished_run_reads_as_far_as_it_got(tmp_path, capsys):
    out = tmp_path / "r"
    runner.run(_cfg(rounds=3), RunOptions(out=out, device="cpu", progress=False, stop_after=2), synthetic())
    assert analyze(["dynamics", str(out), "--out", str(tmp_path / "d")]) == 0, capsys.readouterr().err


# ---- --client-batch ------------------------------------------------------------------------------------
def test_client_batch_on_a_cpu_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runner, "setup", lambda *a, **k: pytest.fail("data loaded before the refusal"))
    err = one_line_error(capsys, federate, ["--out", tmp_path / "r", *FED, "--client-batch", "10"])
    assert "--client-batch 10 on a CPU" in err and "--client-batch 1" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("value", ["0", "-1"])
def test_client_batch_below_one_is_one_line(tmp_path, capsys, value):
    err = one_line_error(capsys, federate, ["--out", tmp_path / "r", *FED, "--client-batch", value])
    assert "--client-batch must lie in [1, inf)" in err and not (tmp_path / "r").exists()


def test_engine_flower_with_client_batch_is_one_note_line(tmp_path, capsys):
    """The note the Flower engine prints (its host is replaced here by one that runs the rounds in
    process, so no Ray is needed); the CPU refusal is the in-process engine's only."""
    opts = RunOptions(out=tmp_path / "r", device="cpu", progress=False, engine="flower")
    rows = runner.run(_cfg(rounds=1, client_batch=3), opts, synthetic(),
                      host=lambda cfg, rounds: rounds(None))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(rows) == 1 and len(err) == 1 and "each Flower client trains alone" in err[0]


# ---- hostile inputs that were already right ------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--lr", "nan"], "--lr must lie in (0, inf), got nan"),
    (["--lr", "inf"], "--lr must lie in (0, inf), got inf"),
    (["--init", "no-such-name"], "--init no-such-name: no such file"),
])
def test_federate_hostile_values_are_one_line(tmp_path, capsys, args, message):
    err = one_line_error(capsys, federate, ["--out", tmp_path / "r", *FED, *args])
    assert message in err and not (tmp_path / "r").exists()


def test_an_unshipped_init_name_is_one_line(tmp_path, capsys, monkeypatch):
    from federated import initialisation

    monkeypatch.setitem(initialisation.SHIPPED, "fps-resnet20", tmp_path / "absent.ckpt")
    err = one_line_error(capsys, federate, ["--out", tmp_path / "r", *FED, "--init", "fps-resnet20"])
    assert "fps-resnet20" in err and not (tmp_path / "r").exists()


def test_a_billion_clients_is_one_line(tmp_path, capsys):
    err = one_line_error(capsys, federate, ["--out", tmp_path / "r", *FED, "--clients", "1000000000"])
    assert "1000000000 clients but only" in err and not (tmp_path / "r").exists()


def test_a_trillion_rounds_runs_and_resumes(tmp_path):
    cfg, out = _cfg(rounds=10**12), tmp_path / "r"
    runner.run(cfg, RunOptions(out=out, device="cpu", progress=False, stop_after=1), synthetic())
    rows = runner.run(cfg, RunOptions(out=out, device="cpu", progress=False, stop_after=1, resume=True),
                      synthetic())
    assert [r["round"] for r in rows] == [1, 2] and not (out / "final.pt").exists()


@pytest.mark.parametrize("args, message", [
    (["--look", "bogus"], "invalid choice: 'bogus'"),
    (["--pairs", "0"], "--pairs must be positive, got 0"),
    (["--size", "8"], "--size must be at least 16 px, got 8"),
])
def test_fractals_stats_hostile_values_are_one_line(capsys, args, message):
    err = one_line_error(capsys, fractals, ["stats", *args])
    assert message in err

