"""The paper's tables beside the measured ones: ``analyze report RUN... --paper TABLE --row LABEL=ROW``.

Chen et al., ICLR 2023 report final test accuracy (mIoU for Cityscapes) in Tables 2-7 and 12 and §4.5; their
numbers are in ``paper_numbers.csv`` beside this file, one line per number citing table and row. A paper
table has the paper's rows (inits) and columns:

- Tables 2, 3, 5 and §4.5: Federated, Centralised, ΔCL-FL (CL − FL of the means); a centralised run feeds
  Centralised, any other Federated;
- Table 4 (iNaturalist-GEO): GEO-10K and GEO-3K (the federated run's ``--split-csv`` names 10k or 3k),
  Centralised, and Avg. ΔCL-FL (CL − the mean of the two federated means);
- Tables 6, 12 and 7: one column per dataset (C10, C100, Tiny), federated runs.

A run's row is its init's label (random, imagenet, places365, or the checkpoint's file stem) mapped by
``--row LABEL=ROW`` (random, imagenet and places365 map to Random, ImageNet and Places365 unless told
otherwise). Runs of one cell are pooled over seeds as mean ± sample std; every cell shows the paper's number
beside it, and a measured row the paper lacks is listed after the paper's rows. A cell whose runs were made
from different inputs (another --init file, lr, any recorded setting but the seed: :func:`.cells.inputs_of`)
is refused in one line: a paper cell is one setting.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cells import CL_IGNORED, IGNORED, MISSING, Cell, Entry, check_pooled, init_label, pool_notes
from .runs import AnalysisError

PAPER_CSV = Path(__file__).with_name("paper_numbers.csv")
DEFAULT_ROWS = {"random": "Random", "imagenet": "ImageNet", "places365": "Places365"}
DATASET_COLUMNS = {"cifar10": "C10", "cifar100": "C100", "tinyimagenet": "Tiny"}


def _fl_cl(cfg: Any) -> str:
    return "Centralised" if cfg.centralized else "Federated"


def _geo(cfg: Any) -> str:
    """Table 4's column of a run: Centralised, or the GEO split its --split-csv names."""
    if cfg.centralized:
        return "Centralised"
    name = Path(cfg.split_csv or "").name.lower()
    for tag, column in (("10k", "GEO-10K"), ("3k", "GEO-3K")):
        if tag in name:
            return column
    raise AnalysisError(f"Table 4: cannot tell whether split CSV {cfg.split_csv!r} is GEO-10K or GEO-3K (its "
                        f"name should contain 10k or 3k, as Hsu et al.'s federated_train_geo_*.csv)")


def _dataset(cfg: Any) -> str:
    if cfg.centralized:
        raise AnalysisError("Tables 6, 7 and 12 hold federated runs only; leave out the centralised ones")
    if cfg.dataset not in DATASET_COLUMNS:
        raise AnalysisError(f"Tables 6, 7 and 12 have columns for {', '.join(DATASET_COLUMNS)}, not "
                            f"{cfg.dataset}")
    return DATASET_COLUMNS[cfg.dataset]


def _delta(cells: dict[str, Cell]) -> float | None:
    if "Federated" in cells and "Centralised" in cells:
        return cells["Centralised"].mean - cells["Federated"].mean
    return None


def _avg_delta(cells: dict[str, Cell]) -> float | None:
    if all(c in cells for c in ("GEO-10K", "GEO-3K", "Centralised")):
        return cells["Centralised"].mean - (cells["GEO-10K"].mean + cells["GEO-3K"].mean) / 2
    return None


@dataclass(frozen=True)
class PaperTable:
    title: str
    columns: tuple[str, ...]
    column_of: Callable[[Any], str]  # the measured column a run feeds
    datasets: tuple[str, ...]  # the datasets its runs may be on
    derived: dict[str, Callable[[dict[str, Cell]], float | None]] = field(default_factory=dict)


_FL_CL = ("Federated", "Centralised", "ΔCL-FL")
TABLES = {
    "table2": PaperTable("Table 2: test accuracy (%) on CIFAR-10 (α = 0.3)", _FL_CL, _fl_cl, ("cifar10",),
                         {"ΔCL-FL": _delta}),
    "table3": PaperTable("Table 3: test accuracy (%) on Tiny-ImageNet (α = 0.3)", _FL_CL, _fl_cl,
                         ("tinyimagenet",), {"ΔCL-FL": _delta}),
    "table4": PaperTable("Table 4: test accuracy (%) on iNaturalist-GEO", ("GEO-10K", "GEO-3K", "Centralised",
                         "Avg. ΔCL-FL"), _geo, ("inat-geo",), {"Avg. ΔCL-FL": _avg_delta}),
    "table5": PaperTable("Table 5: mIoU (%) of segmentation on Cityscapes", _FL_CL, _fl_cl, ("cityscapes",),
                         {"ΔCL-FL": _delta}),
    "table6": PaperTable("Table 6: synthetic pre-training, FedAvg test accuracy (%) (C10, C100: α = 0.1; "
                         "Tiny: α = 0.3)", ("C10", "C100", "Tiny"), _dataset, tuple(DATASET_COLUMNS)),
    "table12": PaperTable("Table 12: synthetic pre-training with SimSiam and MoCo-V2, FedAvg test accuracy "
                          "(%)", ("C10", "C100", "Tiny"), _dataset, tuple(DATASET_COLUMNS)),
    "table7": PaperTable("Table 7: federated self-pre-training (SP), FedAvg test accuracy (%) (C10: α = 0.1, "
                         "Tiny: α = 0.3)", ("C10", "Tiny"), _dataset, ("cifar10", "tinyimagenet")),
    "sec4.5": PaperTable("§4.5: chest X-rays (α = 0.3, 10 clients), FedAvg test accuracy (%)", ("Federated",),
                         _fl_cl, ("imagefolder",)),
}


@dataclass(frozen=True)
class PaperNumber:
    value: float
    std: float | None
    cite: str


def paper_numbers(table: str, path: Path = PAPER_CSV) -> dict[tuple[str, str], PaperNumber]:
    """{(row, column): number} of one table, rows in the file's (the paper's) order."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["table"] == table]
    return {(r["row"], r["column"]): PaperNumber(float(r["value"]), float(r["std"]) if r["std"] else None,
                                                 r["cite"]) for r in rows}


def row_map(pairs: Sequence[str]) -> dict[str, str]:
    """``--row LABEL=ROW`` flags on top of :data:`DEFAULT_ROWS`."""
    rows = dict(DEFAULT_ROWS)
    for pair in pairs:
        label, sep, row = pair.partition("=")
        if not sep or not label.strip() or not row.strip():
            raise AnalysisError(f"--row expects LABEL=ROW (an init label and the paper's row), got {pair!r}")
        rows[label.strip()] = row.strip()
    return rows


def departure_map(pairs: Sequence[str], key: str) -> dict[tuple[str, str], str]:
    """``--departure ROW/COLUMN=TEXT`` flags: what a cell's runs did otherwise than the paper's number
    (issue 41: a departure that can change a result is shown beside that number). ROW ``*``: every row."""
    table, out = TABLES[key], {}
    for pair in pairs:
        cell, sep, text = pair.partition("=")
        row, slash, column = cell.rpartition("/")
        if not sep or not slash or not row.strip() or not text.strip():
            raise AnalysisError(f"--departure expects ROW/COLUMN=TEXT (a cell of the paper's table and what "
                                f"its runs did otherwise), got {pair!r}")
        if column.strip() not in table.columns:
            raise AnalysisError(f"--departure {pair!r}: {key} has no column {column.strip()!r} (its columns: "
                                f"{', '.join(table.columns)})")
        out[row.strip(), column.strip()] = text.strip()
    return out


@dataclass
class PaperReport:
    key: str
    table: PaperTable
    rows: list[str]  # the paper's rows, then measured rows it lacks
    cells: dict[tuple[str, str], Cell]
    numbers: dict[tuple[str, str], PaperNumber]
    notes: list[str]
    departures: dict[tuple[str, str], str] = field(default_factory=dict)  # (row, column): what differs

    def value(self, row: str, column: str) -> float | None:
        """The measured value of a cell (a derived column's too), or None."""
        if column in self.table.derived:
            return self.table.derived[column]({c: self.cells[r, c] for r, c in self.cells if r == row})
        cell = self.cells.get((row, column))
        return cell.mean if cell else None


def build_paper(key: str, entries: Sequence[tuple], rows: dict[str, str],
                departures: Sequence[str] = ()) -> PaperReport:
    """The runs (config, final acc, name) as the cells of paper table ``key``; ``departures`` are
    ``ROW/COLUMN=TEXT`` flags, each marked on its cell beside the paper's number."""
    if key not in TABLES:
        raise AnalysisError(f"--paper {key}: choose from {', '.join(TABLES)}")
    differs = departure_map(departures, key)
    table, numbers = TABLES[key], paper_numbers(key)
    grouped: dict[tuple[str, str], list[Entry]] = {}
    for e in (Entry(*e) for e in entries):
        if e.config.dataset not in table.datasets:
            raise AnalysisError(f"{e.name}: a {e.config.dataset} run does not belong in {key} "
                                f"({', '.join(table.datasets)})")
        label = init_label(e.config.init)
        grouped.setdefault((rows.get(label, label), table.column_of(e.config)), []).append(e)
    paper_rows = list(dict.fromkeys(r for r, _ in numbers))
    extra = list(dict.fromkeys(r for r, _ in grouped if r not in paper_rows))
    cells = {k: Cell(v) for k, v in grouped.items()}
    notes = []
    for (row, column), cell in cells.items():
        ignored = CL_IGNORED if column == "Centralised" else IGNORED
        check_pooled(cell, ignored, f"--paper {key}: {row} / {column}")  # one setting a cell, never two
        notes += pool_notes(cell, f"{row} / {column}")
    if extra:
        notes.append(f"rows the paper does not have: {', '.join(extra)} (map an init label to a paper row "
                     f"with --row LABEL=ROW)")
    unknown = [f"{r}/{c}" for r, c in differs if r not in paper_rows + extra + ["*"]]
    if unknown:
        raise AnalysisError(f"--departure {', '.join(unknown)}: no such row in {key} (its rows: "
                            f"{', '.join(paper_rows + extra)})")
    marked: dict[tuple[str, str], list[str]] = {}
    for (row, column), text in differs.items():  # a row's own departure after the one of every row
        for r in (paper_rows + extra if row == "*" else [row]):
            marked.setdefault((r, column), []).append(text)
    differs = {cell: "; ".join(texts) for cell, texts in marked.items()}
    return PaperReport(key, table, paper_rows + extra, cells, numbers, notes, differs)


def _marks(report: PaperReport) -> dict[tuple[str, str], str]:
    """Each departing cell's mark (†1, †2, ... in table order)."""
    cells = [(r, c) for r in report.rows for c in report.table.columns if (r, c) in report.departures]
    return {cell: f"†{i}" for i, cell in enumerate(cells, 1)}


def _text(report: PaperReport, row: str, column: str, marks: dict[tuple[str, str], str]) -> str:
    cell = report.cells.get((row, column))
    value = report.value(row, column)
    measured = cell.text() if cell else (f"{value:.1f}" if value is not None else MISSING)
    number = report.numbers.get((row, column))
    if number is None:
        return measured
    paper = f"{number.value:.1f}" + (f" ± {number.std:.2f}" if number.std is not None else "")
    mark = marks.get((row, column), "")
    return f"{measured} · paper {paper}" + (f" {mark}" if mark else "")


def paper_markdown(report: PaperReport) -> str:
    """The table as markdown: each cell the measured value (mean ± std (n) over seeds) · the paper's."""
    columns, marks = report.table.columns, _marks(report)
    lines = [f"# {report.table.title}", "",
             "Each cell: measured (mean ± sample std over seeds, n runs) · the paper's number "
             "(analysis/paper_numbers.csv). – : not measured.", "",
             f"| init | {' | '.join(columns)} |", "|---|" + "---:|" * len(columns)]
    for row in report.rows:
        lines.append(f"| {row} | {' | '.join(_text(report, row, c, marks) for c in columns)} |")
    lines += [""] + [f"Note: {n}." for n in report.notes]
    lines += [f"{marks[cell]} {cell[0]} / {cell[1]}: this cell departs from the paper's: "
              f"{report.departures[cell].rstrip('.')}." for cell in marks]
    return "\n".join(lines).rstrip() + "\n"


def _cell_json(report: PaperReport, row: str, column: str) -> dict:
    cell, number = report.cells.get((row, column)), report.numbers.get((row, column))
    return {"measured": report.value(row, column), "runs": cell.record() if cell else None,
            "paper": vars(number) if number else None, "departure": report.departures.get((row, column))}


def paper_json(report: PaperReport) -> dict:
    return {"paper_table": report.key, "title": report.table.title, "columns": list(report.table.columns),
            "notes": report.notes, "rows": [
                {"row": row, "cells": {c: _cell_json(report, row, c) for c in report.table.columns}}
                for row in report.rows]}
