"""federate --track and the analyze commands on tiny digits runs (Chen et al., ICLR 2023, §6)."""

import dataclasses
import json

import pytest
from PIL import Image

from analysis.cli import main as analyze
from analysis.output import DPI, FIGSIZE
from federated.cli import main as federate
from federated.datasets import DataConfig, load_dataset
from federated.experiment import FederateConfig, RunOptions
from federated.oracle.tracking import TrackConfig
from federated.runner import run

TINY = ["--width", "0.25", "--clients", "3", "--local-epochs", "1", "--device", "cpu", "--quiet",
        "--alpha", "1.0", "--batch-size", "32", "--convex-epochs", "1", "--variance-samples", "20"]


def _rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _size(path, panels=1):
    assert Image.open(path).size == (FIGSIZE[0] * DPI * panels, FIGSIZE[1] * DPI)


@pytest.fixture(scope="module")
def few():
    """300 training and 120 test digits: a tracked round costs seconds instead of minutes."""
    data = load_dataset(DataConfig())
    return dataclasses.replace(data, train_x=data.train_x[:300], train_y=data.train_y[:300],
                               test_x=data.test_x[:120], test_y=data.test_y[:120])


def _tiny(**kw):
    return FederateConfig(width=0.25, clients=3, local_epochs=1, alpha=1.0, batch_size=32, **kw)


@pytest.fixture(scope="module")
def tracked(tmp_path_factory, few):
    path = tmp_path_factory.mktemp("runs") / "tracked"
    tracking = TrackConfig(track=("convex", "variance"), every=1, convex_epochs=1, variance_samples=20)
    run(_tiny(rounds=2, tracking=tracking), RunOptions(out=path, device="cpu", progress=False), data=few)
    return path


def test_tracked_round_logs_fedavg_convex_and_variance(tracked):
    rows = _rows(tracked)
    assert "init_test_acc" in rows[0] and "init_test_acc" not in rows[1]
    for row in rows:
        convex, variance = row["convex"], row["variance"]
        # FedAvg's combination is what FedAvg aggregates to: its accuracy is the round's test accuracy
        assert convex["fedavg_acc"] == pytest.approx(row["test_acc"])
        assert convex["convex_acc"] >= convex["fedavg_acc"]
        assert sum(convex["lambda"]) == pytest.approx(1) and len(convex["lambda"]) == 3
        assert len(variance["losses"]) == 20 and variance["p2_5"] <= variance["mean"] <= variance["p97_5"]


def test_optimal_convex_aggregation_uses_lambda_star(tmp_path, few):
    tracking = TrackConfig(track=("convex",), every=1, convex_epochs=1, aggregation="optimal-convex")
    run(_tiny(rounds=1, tracking=tracking), RunOptions(out=tmp_path / "oc", device="cpu", progress=False),
        data=few)
    row = _rows(tmp_path / "oc")[0]
    assert row["test_acc"] == pytest.approx(row["convex"]["convex_acc"])


def test_analyze_commands_write_figures_of_the_expected_size(tracked, tmp_path, capsys):
    out = tmp_path / "fig"
    for command in ("dynamics", "convex", "variance"):
        assert analyze([command, str(tracked), "--out", str(out)]) == 0, capsys.readouterr().err
    for name in ("dynamics", "convex", "variance"):
        _size(out / f"{name}.png", panels=2)
        assert json.loads((out / f"{name}.json").read_text())["tracked"]
    _size(out / "variance_hist.png", panels=2)  # the two tracked rounds
    gains = json.loads((out / "dynamics.json").read_text())["tracked"]
    rows = _rows(tracked)
    assert gains[0]["prev"] == rows[0]["init_test_acc"] and gains[1]["global"] == rows[1]["test_acc"]


def test_analyze_convex_from_saved_client_models(tmp_path, capsys):
    run = tmp_path / "saved"
    assert federate(["--out", str(run), *TINY, "--rounds", "1", "--save-local-models", "1"]) == 0
    assert analyze(["convex", str(run), "--device", "cpu", "--convex-epochs", "1"]) == 0, \
        capsys.readouterr().err
    rows = json.loads((run / "figures" / "convex.json").read_text())["saved"]
    assert rows[0]["round"] == 1 and rows[0]["convex_acc"] >= rows[0]["fedavg_acc"]
    assert rows[0]["fedavg_acc"] == pytest.approx(_rows(run)[0]["test_acc"])


@pytest.mark.parametrize("args, message", [
    (["convex"], "no run directories"),
    (["dynamics", "/nonexistent/run"], "not a federate run directory"),
    (["variance", "--hist-rounds", "9"], "were not tracked"),
])
def test_bad_input_is_one_line_and_exit_2(tracked, args, message, capsys):
    args = [a for a in args] + ([str(tracked)] if "--hist-rounds" in args else [])
    assert analyze(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_run_that_tracked_nothing_says_what_to_rerun(tmp_path, capsys):
    run = tmp_path / "plain"
    assert federate(["--out", str(run), *TINY, "--rounds", "1"]) == 0
    assert analyze(["variance", str(run)]) == 2
    assert "--track variance" in capsys.readouterr().err
    assert federate(["--out", str(tmp_path / "x"), *TINY, "--track", "bogus"]) == 2
