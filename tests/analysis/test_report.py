"""`analyze report`: Federated / Centralised / ΔCL-FL tables (Tables 2-5), pure and on tiny runs."""

import dataclasses
import json
import shutil

import pytest

from analysis.cli import main
from analysis.report import build_tables, init_label, to_json, to_markdown
from analysis.runs import AnalysisError
from federated.datasets import DataConfig, load_dataset
from federated.experiment import FederateConfig, RunOptions
from federated.runner import run


def _cfg(**kw):
    return FederateConfig(dataset="cifar10", **kw)


def _row(table, label):
    return next(r for r in table.rows if r.label == label)


def test_mean_std_over_seeds_and_delta():
    # Prepare: three federated seeds and two centralised seeds of one setting
    entries = [(_cfg(seed=s), acc) for s, acc in enumerate([0.5, 0.6, 0.7])]
    entries += [(_cfg(seed=s, centralized=True), acc) for s, acc in enumerate([0.8, 0.9])]
    # Execute
    (table,) = build_tables(entries)
    # Assert
    row = _row(table, "random")
    assert row.federated.mean == pytest.approx(60.0) and row.federated.std == pytest.approx(10.0)
    assert row.centralised.mean == pytest.approx(85.0) and row.centralised.std == pytest.approx(7.0710678)
    assert row.delta == pytest.approx(25.0)
    assert row.federated.text() == "60.0 ± 10.0 (n=3)" and row.centralised.text() == "85.0 ± 7.1 (n=2)"
    assert "| random | 60.0 ± 10.0 (n=3) | 85.0 ± 7.1 (n=2) | 25.0 |" in to_markdown([table])
    assert table.notes == []


def test_one_seed_is_a_plain_number_and_missing_cells_are_dashes():
    tables = build_tables([(_cfg(), 0.4234), (_cfg(init="imagenet", centralized=True), 0.9)])
    (table,) = tables
    assert [r.label for r in table.rows] == ["random", "imagenet"]
    md = to_markdown(tables)
    assert "| random | 42.3 | – | – |" in md and "| imagenet | – | 90.0 | – |" in md
    assert to_json(tables)["tables"][0]["rows"][0]["centralised"] is None


def test_grouping_by_setting_and_init():
    entries = [
        (_cfg(seed=0), 0.5), (_cfg(seed=1), 0.7),  # pooled: differ only in seed
        (_cfg(init="/x/fps.ckpt"), 0.6), (_cfg(init="imagenet"), 0.8),  # rows of the same table
        (_cfg(alpha=1.0), 0.9),  # another dirichlet alpha: another table
        (_cfg(partition="iid", alpha=1.0), 0.3),  # alpha means nothing for iid: pooled with the next
        (_cfg(partition="iid", alpha=0.3, seed=1), 0.5),
        (_cfg(algo="fedprox"), 0.55),  # another algorithm: another table
    ]
    tables = build_tables(entries)
    assert len(tables) == 4
    first = tables[0]
    assert first.setting["alpha"] == 0.3 and first.setting["algo"] == "fedavg"
    assert [r.label for r in first.rows] == ["random", "imagenet", "fps"]
    assert _row(first, "random").federated.values == pytest.approx([50.0, 70.0])
    iid = next(t for t in tables if t.setting["partition"] == "iid")
    assert "alpha" not in iid.setting and _row(iid, "random").federated.mean == pytest.approx(40.0)
    assert iid.notes == []
    assert init_label("/x/fps.ckpt") == "fps" and init_label("imagenet") == "imagenet"


def test_centralised_runs_match_every_algorithm_and_participation():
    entries = [(_cfg(algo="fedavg"), 0.5), (_cfg(algo="fedprox", participation=0.5), 0.6),
               (_cfg(centralized=True, algo="fedprox", participation=0.2), 0.8),
               (_cfg(centralized=True, clients=5), 0.7)]  # no federated run of 5 clients: its own table
    tables = build_tables(entries)
    assert [t.setting["algo"] for t in tables] == ["fedavg", "fedprox", None]
    assert [_row(t, "random").delta for t in tables[:2]] == pytest.approx([30.0, 20.0])
    assert _row(tables[2], "random").federated is None and "centralised only" in to_markdown(tables)
    assert "| Federated (fedprox) | Centralised | ΔCL-FL |" in to_markdown(tables)


def test_runs_of_other_inputs_are_rows_of_their_own_and_repeated_seeds_are_noted():
    (table,) = build_tables([(_cfg(lr=0.1), 0.5), (_cfg(lr=0.01, seed=1), 0.6), (_cfg(lr=0.01, seed=1), 0.6)])
    assert [r.label for r in table.rows] == ["random (lr 0.1)", "random (lr 0.01)"]
    assert [len(r.federated.values) for r in table.rows] == [1, 2] and table.rows[0].inputs == {"lr": 0.1}
    assert table.notes == ["random (lr 0.01) / Federated has several runs with seed 1"]
    assert "| random (lr 0.1) | 50.0 | – | – |" in to_markdown([table])


# ---- end to end on tiny digits runs ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A federated and a centralised one-round run on 200 digits, a second seed of the federated one, and
    'unfinished', a copy of the first whose config asks for two rounds."""
    root = tmp_path_factory.mktemp("report")
    data = load_dataset(DataConfig("digits"))
    few = dataclasses.replace(data, train_x=data.train_x[:200], train_y=data.train_y[:200],
                              test_x=data.test_x[:100], test_y=data.test_y[:100])
    cfg = FederateConfig(dataset="digits", clients=2, rounds=1, local_epochs=1, arch="resnet20", width=0.25,
                         partition="iid", batch_size=64, eval_local=False)
    run(cfg, RunOptions(out=root / "fl0", device="cpu", progress=False), data=few)
    cl = dataclasses.replace(cfg, centralized=True)
    run(cl, RunOptions(out=root / "cl0", device="cpu", progress=False), data=few)
    seed1 = dataclasses.replace(cfg, seed=1)
    run(seed1, RunOptions(out=root / "fl1", device="cpu", progress=False), data=few)
    shutil.copytree(root / "fl0", root / "unfinished")
    _edit(root / "unfinished", rounds=2)
    return root


def _edit(run_dir, **values):
    config = json.loads((run_dir / "config.json").read_text())
    config["config"]["federate"].update(values)
    (run_dir / "config.json").write_text(json.dumps(config))


def test_report_on_runs(runs, capsys):
    out = runs / "out"
    assert main(["report", *(str(runs / n) for n in ("fl0", "fl1", "cl0")), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed == (out / "report.md").read_text()
    assert "digits · resnet20 ×0.25 · iid · 2 clients" in printed and "(n=2)" in printed
    record = json.loads((out / "report.json").read_text())
    (row,) = record["tables"][0]["rows"]
    assert row["federated"]["runs"] == ["fl0", "fl1"] and row["federated"]["seeds"] == [0, 1]
    assert row["centralised"]["runs"] == ["cl0"]
    assert row["delta_cl_fl"] == pytest.approx(row["centralised"]["mean"] - row["federated"]["mean"])


def test_unfinished_or_missing_runs_exit_2(runs, capsys):
    assert main(["report", str(runs / "fl0"), str(runs / "unfinished"), "--out", str(runs / "bad")]) == 2
    err = capsys.readouterr().err
    unfinished = runs / "unfinished"
    assert "1 of 2 rounds done" in err and f"federate --config {unfinished / 'config.json'} --resume" in err
    assert main(["report", str(runs / "nowhere")]) == 2
    assert "not a federate run directory" in capsys.readouterr().err


# ---- --paper: the paper's tables beside the measured ones --------------------------------------------------


def test_paper_table2_puts_each_number_beside_its_cell():
    from analysis.paper import build_paper, paper_markdown, row_map

    entries = [(_cfg(seed=s), acc) for s, acc in enumerate([0.80, 0.82, 0.84])]
    entries += [(_cfg(centralized=True), 0.90), (_cfg(init="/w/fps-resnet20.ckpt"), 0.85)]
    report = build_paper("table2", entries, row_map(["fps-resnet20=FPS"]))
    md = paper_markdown(report)
    assert report.rows == ["Random", "FPS", "ImageNet"]  # the paper's rows, in its order
    assert "| init | Federated | Centralised | ΔCL-FL |" in md
    assert "| Random | 82.0 ± 2.0 (n=3) · paper 82.7 | 90.0 · paper 91.7 | 8.0 · paper 9.0 |" in md
    assert "| FPS | 85.0 · paper 84.9 | – · paper 92.0 | – · paper 7.1 |" in md
    assert "| ImageNet | – · paper 90.8 | – · paper 93.3 | – · paper 2.5 |" in md


def test_a_departure_is_marked_beside_the_papers_number_and_in_the_record():
    from analysis.paper import build_paper, paper_json, paper_markdown, row_map

    entries = [(_cfg(), 0.80), (_cfg(centralized=True), 0.90), (_cfg(init="/w/fps-resnet20.ckpt"), 0.85)]
    report = build_paper("table2", entries, row_map(["fps-resnet20=FPS"]),
                         ["*/Centralised=500 epochs", "FPS/Federated=SimSiam, not MoCo", "FPS/Centralised=x"])
    md = paper_markdown(report)
    assert "| Random | 80.0 · paper 82.7 | 90.0 · paper 91.7 †1 | 10.0 · paper 9.0 |" in md
    assert "| FPS | 85.0 · paper 84.9 †2 | – · paper 92.0 †3 |" in md
    assert "†2 FPS / Federated: this cell departs from the paper's: SimSiam, not MoCo." in md
    assert "†3 FPS / Centralised: this cell departs from the paper's: 500 epochs; x." in md  # both said
    cells = {r["row"]: r["cells"] for r in paper_json(report)["rows"]}
    assert cells["ImageNet"]["Centralised"]["departure"] == "500 epochs"
    assert cells["Random"]["Federated"]["departure"] is None
    plain = paper_markdown(build_paper("table2", entries, row_map([])))
    assert "†" not in plain
    for bad, says in (("FPS/Federated", "ROW/COLUMN=TEXT"), ("FPS=x", "ROW/COLUMN=TEXT"),
                      ("FPS/C10=x", "no column 'C10'"), ("Nobody/Federated=x", "no such row")):
        with pytest.raises(AnalysisError, match=says):
            build_paper("table2", entries, row_map([]), [bad])


def test_departure_without_paper_exits_2(runs, capsys):
    assert main(["report", str(runs / "fl0"), "--departure", "Random/Federated=x", "--out",
                 str(runs / "dep")]) == 2
    assert "give --paper TABLE too" in capsys.readouterr().err


def test_paper_table4_columns_come_from_the_geo_split_and_table6_from_the_dataset():
    from analysis.paper import build_paper, paper_markdown, row_map

    geo = dict(dataset="inat-geo", partition="natural")
    report = build_paper("table4", [
        (FederateConfig(**geo, split_csv="/d/federated_train_geo_10k.csv"), 0.30),
        (FederateConfig(**geo, split_csv="/d/federated_train_geo_3k.csv"), 0.20),
        (FederateConfig(**geo, split_csv="/d/federated_train_geo_3k.csv", centralized=True), 0.45)],
        row_map([]))
    assert report.value("Random", "Avg. ΔCL-FL") == pytest.approx(20.0)  # 45 - (30 + 20) / 2
    assert "| Random | 30.0 · paper 20.9 | 20.0 · paper 12.2 | 45.0 · paper 48.5 | 20.0 · paper 32.0 |" in \
        paper_markdown(report)
    six = build_paper("table12", [(FederateConfig(dataset="cifar100", alpha=0.1, init="/w/ml.ckpt"), 0.5),
                                  (FederateConfig(dataset="tinyimagenet", init="/w/other.ckpt"), 0.4)],
                      row_map(["ml=Fractal + Multi-label"]))
    md = paper_markdown(six)
    assert "| Fractal + Multi-label | – · paper 73.0 ± 0.43 | 50.0 · paper 51.0 ± 0.44 |" in md
    assert six.rows[-1] == "other" and "rows the paper does not have: other" in md  # listed after the paper's
    with pytest.raises(AnalysisError, match="federated runs only"):
        build_paper("table6", [(_cfg(centralized=True), 0.5)], row_map([]))
    with pytest.raises(AnalysisError, match="does not belong in table3"):
        build_paper("table3", [(_cfg(), 0.5)], row_map([]))
    with pytest.raises(AnalysisError, match="10k or 3k"):
        build_paper("table4", [(FederateConfig(**geo, split_csv="/d/split.csv"), 0.3)], row_map([]))
    with pytest.raises(AnalysisError, match="LABEL=ROW"):
        row_map(["fps"])


def test_every_paper_table_has_its_numbers_cited():
    from analysis.paper import TABLES, paper_numbers

    sizes = {"table2": 9, "table3": 9, "table4": 12, "table5": 9, "table6": 15, "table12": 27, "table7": 12,
             "sec4.5": 3}
    for key, table in TABLES.items():
        numbers = paper_numbers(key)
        assert len(numbers) == sizes[key], key
        assert {c for _, c in numbers} <= set(table.columns)
        assert all(("Table" in n.cite or "§" in n.cite) and 0 < n.value < 100 for n in numbers.values())
    for key in ("table2", "table3", "table5"):  # a misread number shows: the paper's ΔCL-FL is its CL - FL
        numbers = paper_numbers(key)
        for row in {r for r, _ in numbers}:
            cl, fl = numbers[row, "Centralised"].value, numbers[row, "Federated"].value
            assert numbers[row, "ΔCL-FL"].value == pytest.approx(cl - fl, abs=0.05), (key, row)
    t4 = paper_numbers("table4")
    for row in ("Random", "FPS", "ImageNet"):
        fl = (t4[row, "GEO-10K"].value + t4[row, "GEO-3K"].value) / 2
        assert t4[row, "Avg. ΔCL-FL"].value == pytest.approx(t4[row, "Centralised"].value - fl, abs=0.06)
