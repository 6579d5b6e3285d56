"""Issue 42, round 4: what `analyze` reads is what the runs made, and it says nothing they did not.

- a NaN or infinite metric is refused in one line naming the run's file and line, by every subcommand that
  reads metrics.jsonl (one reader, :func:`analysis.runs.read_metrics`);
- state.pt records a running sha256 of the metrics lines as written: a hand-edited line is refused, by
  `analyze` and by `--resume`, and a resume keeps the digest that of the file; runs from before the digest
  read with a warning;
- runs made from other inputs (another --init file of the same name, another lr) are never pooled;
- a federated self-pre-training run is said to be one, and no refused command is suggested.
"""

import dataclasses
import hashlib
import json
import re
import shutil

import pytest
import torch

from analysis.cli import main as analyze
from analysis.paper import build_paper, row_map
from analysis.report import build_tables
from analysis.runs import AnalysisError
from federated.cli import main as federate
from federated.datasets import DataConfig, load_dataset
from federated.experiment import FederateConfig, RunOptions
from federated.runner import run
from fpsfl.base.checkpoint import load_checkpoint, make_checkpoint, save_checkpoint
from fpsfl.base.rundir import RunDir, RunDirError
from pretrain.backbones import create_backbone

CFG = FederateConfig(dataset="digits", clients=2, rounds=2, local_epochs=1, arch="resnet20", width=0.25,
                     partition="iid", batch_size=64)


def _few():
    data = load_dataset(DataConfig("digits"))
    return dataclasses.replace(data, train_x=data.train_x[:200], train_y=data.train_y[:200],
                               test_x=data.test_x[:100], test_y=data.test_y[:100])


def _lines(run_dir):
    return (run_dir / "metrics.jsonl").read_text().splitlines(keepends=True)


def _state(run_dir):
    return torch.load(run_dir / "state.pt", weights_only=True)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _rewrite(run_dir, change, record: bool) -> None:
    """Change the last metrics line with ``change(row)``; ``record``: as the run would have written it (the
    state's digest follows), else as a hand edit (it does not)."""
    rows = [json.loads(line) for line in _lines(run_dir)]
    change(rows[-1])
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (run_dir / "metrics.jsonl").write_text(text)
    if record:
        torch.save({**_state(run_dir), "metrics_sha256": _sha(text)}, run_dir / "state.pt")


def _one_line(capsys, argv, code=2) -> str:
    got = analyze([str(a) for a in argv])
    err = capsys.readouterr().err
    assert got == code, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """'ok': a finished two-round run on 200 digits; 'nan': it with round 2's test_acc NaN, as a run that
    wrote it would have recorded it; 'edited': it with round 2's test_acc changed by hand."""
    root = tmp_path_factory.mktemp("records")
    run(CFG, RunOptions(out=root / "ok", device="cpu", progress=False), data=_few())
    for name in ("nan", "edited"):
        shutil.copytree(root / "ok", root / name)
    _rewrite(root / "nan", lambda row: row.update(test_acc=float("nan")), record=True)
    _rewrite(root / "edited", lambda row: row.update(test_acc=0.99), record=False)
    return root


def test_a_run_records_the_sha256_of_its_metrics_lines(runs):
    state, text = _state(runs / "ok"), (runs / "ok" / "metrics.jsonl").read_text()
    assert state["metrics_sha256"] == _sha(text) and state["metrics_lines"] == 2 == state["done"]


# ---- 1. a non-finite metric: refused by every subcommand that reads metrics.jsonl -------------------------
COMMANDS = {
    "report": lambda r, out: ["report", r["nan"], "--out", out],
    "dynamics": lambda r, out: ["dynamics", r["nan"], "--out", out],
    "convex": lambda r, out: ["convex", r["nan"], "--out", out],
    "variance": lambda r, out: ["variance", r["nan"], "--out", out],
    "landscape": lambda r, out: ["landscape", r["ok"], r["ok"], r["nan"], "--device", "cpu", "--out", out],
    "budget": lambda r, out: ["budget", "any.ckpt", "--runs", r["nan"], "--device", "cpu", "--out", out],
    "tensorboard": lambda r, out: ["tensorboard", r["nan"], "--out", out],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_nan_metric_is_refused_naming_the_run_and_the_line(runs, tmp_path, capsys, command):
    paths = {name: runs / name for name in ("ok", "nan")}
    err = _one_line(capsys, COMMANDS[command](paths, tmp_path / "out"))
    assert f"{runs / 'nan' / 'metrics.jsonl'}, line 2 (round 2): test_acc is NaN, not a finite number" in err
    assert not (tmp_path / "out").exists()  # no report.json with a NaN (nor a null) in it


def test_infinity_inside_a_nested_record_is_refused_too(runs, tmp_path, capsys):
    shutil.copytree(runs / "ok", tmp_path / "inf")
    _rewrite(tmp_path / "inf", lambda row: row.update(client_sizes=[100, float("-inf")]), record=True)
    err = _one_line(capsys, ["report", tmp_path / "inf", "--out", tmp_path / "rep"])
    assert "line 2 (round 2): client_sizes.1 is -Infinity" in err


# ---- 2. a hand-edited metrics.jsonl --------------------------------------------------------------------
@pytest.mark.parametrize("command", ["report", "dynamics", "tensorboard"])
def test_an_edited_metrics_line_is_refused(runs, tmp_path, capsys, command):
    err = _one_line(capsys, [command, runs / "edited", "--out", tmp_path / "out"])
    assert f"{runs / 'edited' / 'metrics.jsonl'} is not what the run wrote" in err and "digest" in err
    assert not (tmp_path / "out").exists()


def test_a_run_from_before_the_digest_reads_with_a_warning(runs, tmp_path, capsys):
    old = tmp_path / "old"
    shutil.copytree(runs / "ok", old)
    state = _state(old)
    del state["metrics_sha256"], state["metrics_lines"]
    torch.save(state, old / "state.pt")
    assert analyze(["report", str(old), "--out", str(tmp_path / "rep")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "warning" in line] == [
        f"analyze: warning: {old}: its state.pt records no digest of metrics.jsonl (a run from before "
        f"digests were recorded), so an edit of its lines cannot be detected"]


def test_a_line_after_those_the_state_counts_is_left_out_with_a_warning(runs, tmp_path, capsys):
    """What a crash between a round's line and its state leaves, or a line added by hand: never the result."""
    extra = tmp_path / "extra"
    shutil.copytree(runs / "ok", extra)
    last = json.loads(_lines(extra)[-1])
    with (extra / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({**last, "test_acc": 0.99}) + "\n")
    assert analyze(["report", str(extra), "--out", str(tmp_path / "rep")]) == 0
    captured = capsys.readouterr()
    assert "line(s) 3 come after the 2 that state.pt counts" in captured.err and "left out" in captured.err
    (row,) = json.loads((tmp_path / "rep" / "report.json").read_text())["tables"][0]["rows"]
    assert row["federated"]["values"] == [pytest.approx(100 * last["test_acc"])]


def _session(path, resume, appends, states):
    """A RunDir session: ``appends`` metrics lines, a state saved after each of the first ``states``."""
    rundir = RunDir(path)
    with rundir.session(resume):
        if resume:
            done = rundir.load_state({"federate": {}}, compare=())["done"]
        else:
            rundir.create({"federate": {}}, {})
            done = 0
        for i in range(1, appends + 1):
            rundir.append_metrics({"round": done + i, "test_acc": 0.1 * (done + i)})
            if i <= states:
                rundir.save_state({"done": done + i})


def test_resume_keeps_the_digest_that_of_the_file_and_refuses_an_edited_one(tmp_path):
    path = tmp_path / "r"
    _session(path, resume=False, appends=3, states=2)  # killed after round 3's line, before its state
    lines = _lines(path)
    assert _state(path)["metrics_sha256"] == _sha("".join(lines[:2])) and _state(path)["metrics_lines"] == 2
    _session(path, resume=True, appends=2, states=2)  # round 3's line dropped, rounds 3 and 4 again
    text = (path / "metrics.jsonl").read_text()
    assert text.splitlines(keepends=True)[:2] == lines[:2] and len(text.splitlines()) == 4
    assert _state(path)["metrics_sha256"] == _sha(text) and _state(path)["metrics_lines"] == 4
    (path / "metrics.jsonl").write_text(text.replace('"test_acc": 0.2', '"test_acc": 0.9'))
    with pytest.raises(RunDirError, match="is not what the run wrote"):
        _session(path, resume=True, appends=0, states=0)


def test_resuming_a_run_from_before_the_digest_records_one(tmp_path):
    path = tmp_path / "r"
    _session(path, resume=False, appends=2, states=2)
    state = _state(path)
    del state["metrics_sha256"], state["metrics_lines"]
    torch.save(state, path / "state.pt")
    _session(path, resume=True, appends=1, states=1)
    assert _state(path)["metrics_sha256"] == _sha((path / "metrics.jsonl").read_text())


# ---- 3. runs made from other inputs are not pooled --------------------------------------------------------
def _checkpoint(path, seed):
    torch.manual_seed(seed)
    save_checkpoint(make_checkpoint(create_backbone("resnet20", 0.25), arch="resnet20", width=0.25,
                                    method="simsiam", source="fps", epoch=1, config={}), path)


def test_runs_from_two_init_files_of_one_name_are_two_rows(tmp_path, capsys):
    """The file behind --init was replaced between the two runs: their init_sha256 tells them apart."""
    init, few = tmp_path / "fps.ckpt", _few()
    cfg = dataclasses.replace(CFG, rounds=1, init=str(init))
    for seed in (0, 1):
        _checkpoint(init, seed)
        run(dataclasses.replace(cfg, seed=seed), RunOptions(out=tmp_path / f"g{seed}", device="cpu",
                                                             progress=False), data=few)
    runs = [tmp_path / "g0", tmp_path / "g1"]
    shas = [json.loads((r / "config.json").read_text())["config"]["init_sha256"] for r in runs]
    assert shas[0] != shas[1]
    assert analyze(["report", *map(str, runs), "--out", str(tmp_path / "rep")]) == 0
    printed = capsys.readouterr().out
    assert "n=2" not in printed
    assert all(f"| fps (init sha256 {sha[:12]}) |" in printed for sha in shas)
    rows = json.loads((tmp_path / "rep" / "report.json").read_text())["tables"][0]["rows"]
    assert [r["inputs"] for r in rows] == [{"init_sha256": s} for s in shas]
    assert [r["federated"]["runs"] for r in rows] == [["g0"], ["g1"]]


def test_a_centralised_run_joins_the_federated_row_it_matches():
    fl = [(dataclasses.replace(CFG, lr=lr, seed=s), 0.5, f"fl{s}") for lr in (0.1, 0.01) for s in (0, 1)]
    cl = [(dataclasses.replace(CFG, lr=0.01, centralized=True, algo="fedprox"), 0.9, "cl"),
          (dataclasses.replace(CFG, lr=0.05, centralized=True), 0.8, "cl-other")]
    (table,) = build_tables(fl + cl)
    assert [(r.label, r.federated is not None, r.centralised is not None) for r in table.rows] == [
        ("random (lr 0.1)", True, False), ("random (lr 0.01)", True, True), ("random (lr 0.05)", False, True)]
    assert table.rows[1].delta == pytest.approx(40.0)
    algo = [(dataclasses.replace(CFG, seed=s), 0.5, f"a{s}", {"algo": {"mu": mu}})
            for s, mu in ((0, 0.1), (1, 1.0))]
    assert [r.label for r in build_tables(algo)[0].rows] == ["random (algo.mu 0.1)", "random (algo.mu 1)"]
    fps = dataclasses.replace(CFG, init="/w/fps.ckpt")  # one run records its init's sha256, one (older) not
    (table,) = build_tables([(fps, 0.5, "new", {"init_sha256": "c0ffee" * 10 + "abcd"}), (fps, 0.6, "old")])
    assert [(r.label, r.inputs) for r in table.rows] == [
        ("fps (init sha256 c0ffeec0ffee)", {"init_sha256": "c0ffee" * 10 + "abcd"}),
        ("fps (init sha256 unrecorded)", {"init_sha256": None})]


def test_a_paper_cell_of_runs_made_from_other_inputs_is_refused():
    cifar = FederateConfig(dataset="cifar10")
    entries = [(cifar, 0.8, "a", {"init_sha256": "a" * 64}), (dataclasses.replace(cifar, seed=1), 0.82, "b",
                                                              {"init_sha256": "b" * 64})]
    with pytest.raises(AnalysisError, match=r"--paper table2: Random / Federated would pool runs made from "
                                            r"different inputs \(init_sha256 differ"):
        build_paper("table2", entries, row_map([]))
    with pytest.raises(AnalysisError, match=r"lr differ"):
        build_paper("table2", [(cifar, 0.8), (dataclasses.replace(cifar, lr=0.1, seed=1), 0.8)], row_map([]))
    two = [(dataclasses.replace(cifar, init=f"/w/{name}.ckpt"), 0.8, name) for name in ("a", "b")]
    with pytest.raises(AnalysisError, match=r"FPS / Federated would pool .*\(init differ"):
        build_paper("table2", two, row_map(["a=FPS", "b=FPS"]))  # two checkpoints mapped to one row


# ---- 4. what a run is, and commands that are not refused ---------------------------------------------------
def test_a_self_pretraining_run_is_said_to_be_one_and_no_refused_command_is_suggested(tmp_path, capsys):
    ckpt = tmp_path / "sp.ckpt"
    assert federate(["self-pretrain", "--clients", "2", "--rounds", "1", "--local-epochs", "1", "--width",
                     "0.25", "--batch-size", "64", "--partition", "iid", "--device", "cpu", "--quiet",
                     "--out", str(ckpt)]) == 0
    capsys.readouterr()
    err = _one_line(capsys, ["report", tmp_path / "sp.run", "--out", tmp_path / "rep"])
    assert "is a federated self-pre-training run (federate self-pretrain)" in err
    assert f"it wrote the backbone checkpoint {ckpt} for federate --init" in err
    assert "rounds done" not in err and "--resume" not in err
    load_checkpoint(ckpt)  # what it names is a checkpoint federate --init takes


def test_the_suggested_resume_command_finishes_the_run(tmp_path, capsys):
    """A bare `federate --resume --out RUN` compares the default settings with the run's and is refused; the
    command analyze suggests takes the run's own."""
    out = tmp_path / "r"
    run(dataclasses.replace(CFG, lr=0.05, eval_local=False), RunOptions(out=out, device="cpu", progress=False,
                                                                        stop_after=1))
    err = _one_line(capsys, ["report", out, "--out", tmp_path / "rep"])
    assert "1 of 2 rounds done" in err
    command = re.search(r"finish it with federate (.*?), or leave it out", err).group(1)
    assert federate([*command.split(), "--quiet"]) == 0, capsys.readouterr().err
    assert analyze(["report", str(out), "--out", str(tmp_path / "rep")]) == 0


@pytest.mark.parametrize("text", ['[1]', '"config"', '{"config": [1]}', '{"config": {"federate": 3}}'])
def test_a_config_json_of_another_shape_is_one_line(tmp_path, capsys, text):
    """Read once, migrated once: JSON that is not a run's record is named, not a traceback."""
    (tmp_path / "config.json").write_text(text)
    (tmp_path / "metrics.jsonl").write_text("")
    err = _one_line(capsys, ["report", tmp_path, "--out", tmp_path / "rep"])
    assert f"{tmp_path / 'config.json'}: unreadable (" in err
    assert "re-run federate into a new directory" in err
