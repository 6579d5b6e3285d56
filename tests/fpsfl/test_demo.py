"""fpsfl demo at the smoke budget: every step runs, report.md and its figures exist, numbers are finite."""

import json
import math
import re

from PIL import Image

from fpsfl.demo.cli import main

FIGURES = ("partition", "accuracy", "dynamics", "convex", "variance", "variance_hist")


def test_demo_smoke_writes_the_report(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--budget", "smoke", "--out", str(out), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    report = (out / "report.md").read_text()
    for name in FIGURES:
        assert f"figures/{name}.png" in report
        Image.open(out / "figures" / f"{name}.png").verify()
    rows = [line for line in report.splitlines() if line.startswith("| random") or line.startswith("| fps")]
    assert len(rows) == 2
    for row in rows:
        numbers = [float(x) for x in re.findall(r"-?\d+\.\d+", row)]
        assert len(numbers) == 4 and all(math.isfinite(x) for x in numbers)  # FL mean ± std, CL, ΔCL-FL
        fl, _, cl, delta = numbers
        assert abs(cl - fl - delta) < 0.11  # ΔCL-FL = CL − FL (rounded to one decimal)
        assert "(n=2)" in row  # the smoke budget's two seeds
    assert "| random" in printed  # the table is printed at the end
    # a second invocation finds every step done and only redoes the analyses and the report
    assert main(["demo", "--budget", "smoke", "--out", str(out), "--device", "cpu"]) == 0
    assert capsys.readouterr().out.count("already done") == 7  # pre-training, 2 x 2 federated, 2 centralised
    # issue 42: a step is done only for the settings and init that made it
    runs = sorted(p.name for p in (out / "runs").iterdir())
    report = (out / "report.md").read_bytes()
    assert main(["demo", "--budget", "default", "--out", str(out), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "smoke budget" in err and "other settings" in err
    assert sorted(p.name for p in (out / "runs").iterdir()) == runs
    assert (out / "report.md").read_bytes() == report
    (out / "fps.ckpt").write_bytes((out / "fps.ckpt").read_bytes() + b"\0")  # another file at the same path
    assert main(["demo", "--budget", "smoke", "--out", str(out), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "another --init file" in err
    (out / "demo.json").unlink()  # finished runs that nothing records
    assert main(["demo", "--budget", "smoke", "--out", str(out), "--device", "cpu"]) == 2
    assert "does not record its settings" in capsys.readouterr().err


def test_bad_budget_is_one_line_and_exit_2(capsys):
    assert main(["demo", "--budget", "huge"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_verdict_needs_last_round_and_tail_to_agree_beyond_noise():
    from fpsfl.demo.report import _verdict

    assert "helped" in _verdict(5.0, 4.0, 1.0) and "not" not in _verdict(5.0, 4.0, 1.0)
    assert "did **not** help" in _verdict(-5.0, -4.0, 1.0)
    assert "No clear difference" in _verdict(5.0, -4.0, 1.0)  # the sign flips over the last rounds
    assert "No clear difference" in _verdict(5.0, 4.0, 4.5)  # within the runs' round-to-round spread
    assert "No clear difference" in _verdict(0.5, 0.5, 1.0)


def test_paper_comparison_calls_small_changes_too_close():
    from fpsfl.demo.report import _agrees

    assert _agrees(-2.0, 1.0, "within 1 point") == "so it does here."  # lower, as the paper finds
    assert _agrees(2.0, 1.0, "within 1 point") == "here it does not."
    assert "too close to call" in _agrees(-0.7, 1.0, "within 1 point")
    assert "within 10%" in _agrees(0.05, 0.1, "within 10%")


def test_pretraining_step_names_the_method_pretrain_runs_by_default(tmp_path):
    """The demo's report times its pre-training under the step's name: it must name the method that
    ``pretrain fps`` actually runs (its default --recipe), not the paper's SimSiam."""
    from fpsfl.demo.cli import BUDGETS, plan
    from pretrain.recipe import DEFAULT_RECIPE, RECIPES

    method = RECIPES[DEFAULT_RECIPE].method
    shown = {"simsiam": "SimSiam", "mocov2": "MoCo-v2"}.get(method, method)
    name = plan(tmp_path, BUDGETS["default"], "cpu")[0].name
    assert shown in name and f"--recipe {DEFAULT_RECIPE}" in name


def test_the_report_says_how_the_pairs_were_made(tmp_path):
    """The report's pre-training line names the views' colours and flips, read from the run's own record:
    ``--recipe aligned`` and ``short`` differ only there, and their FPS rows are not the same experiment."""
    from fpsfl.demo.report import pretraining_line

    run = tmp_path / "fps.run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "loss": 9.5, "cos_init/layer3": 0.7,
                                                   "norm_ratio/layer3": 1.3}) + "\n")
    table = {"method": "mocov2", "pairs_per_epoch": 64, "init_scale": 0.1,
             "method_args": {"temperature": 0.5}}
    for extra, said in (({}, "colours own, fractal flips own, view flip p 0.5"),
                        ({"colours": "shared", "flips": "none", "method_args": {"flip_p": 0.0}},
                         "colours shared, fractal flips none, view flip p 0")):
        (run / "config.json").write_text(json.dumps({"config": {"pretrain": {**table, **extra}}}))
        assert f"init x0.1; {said}): 1 epochs" in pretraining_line(tmp_path)
