"""Federated / Centralised / ΔCL-FL tables like Tables 2-5 of Chen et al., ICLR 2023 (§4.2-4.4).

The metric is the final round's ``test_acc`` in percent (mIoU for segmentation runs, §4.5). Runs are grouped
by setting (dataset, architecture, partition, clients, participation, local epochs, rounds, algorithm) and
init; runs that differ only in their seed are pooled as "mean ± std (n=K)" with the sample std (ddof 1).
Runs of one init made from other inputs (another --init file, sha256 and all, another lr, algorithm setting
or any recorded setting but the seed and where files lie) are never pooled: each set is its own row,
labelled by the inputs that tell the rows apart, e.g. "fps (init sha256 3f2a9c1e0b7d)" or "random (lr 0.01)".
A centralised run (``--centralized``) is the CL column of every federated row that matches it in all but
algorithm and participation. ΔCL-FL is CL − FL of the means. Missing cells are "–".
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from federated.partitions import headline
from fpsfl.base.cli import TEXT
from fpsfl.base.files import atomic_write

from . import paper
from .cells import (
    CL_IGNORED,
    IGNORED,
    MISSING,
    UNRECORDED,
    Cell,
    Entry,
    differing,
    init_label,
    input_text,
    inputs_of,
    pool_notes,
)
from .output import FORCE_HELP, OUT_HELP, output_dir, write_json
from .runs import AnalysisError, Run, load_runs, resume_command


@dataclass
class Row:
    init: str
    label: str
    federated: Cell | None
    centralised: Cell | None
    inputs: dict[str, Any] = field(default_factory=dict)  # what tells it from the other rows of its init

    @property
    def delta(self) -> float | None:
        """ΔCL-FL = CL − FL of the means (percent points)."""
        if self.federated is None or self.centralised is None:
            return None
        return self.centralised.mean - self.federated.mean


@dataclass
class Table:
    setting: dict[str, Any]  # algo and participation are None for centralised runs without a federated match
    rows: list[Row]
    notes: list[str]


def setting_of(cfg: Any, centralised: bool = False) -> tuple[tuple[str, Any], ...]:
    """The setting a run belongs to, as (name, value) pairs; a centralised run has no algo/participation."""
    param = headline(cfg.partition)  # the setting that tells splits apart (only alpha in the paper)
    pairs = [("dataset", cfg.dataset), ("arch", cfg.arch), ("width", cfg.width), ("partition", cfg.partition)]
    pairs += [(param, getattr(cfg, param))] if param else []
    pairs += [("clients", cfg.clients), ("participation", None if centralised else cfg.participation),
              ("local_epochs", cfg.local_epochs), ("rounds", cfg.rounds),
              ("algo", None if centralised else cfg.algo)]
    return tuple(pairs)


def _cl_key(setting: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    return tuple((k, None if k in ("algo", "participation") else v) for k, v in setting)


def _init_order(inits: Iterable[str]) -> list[str]:
    """random, then imagenet, then the checkpoints in order of appearance (the paper's row order)."""
    seen, first = list(dict.fromkeys(inits)), ("random", "imagenet")
    return [i for i in first if i in seen] + [i for i in seen if i not in first]


def _groups(entries: list[Entry], ignored: frozenset[str]) -> list[tuple[dict, list[Entry]]]:
    """The entries as groups of equal inputs (:func:`inputs_of`), in order of first appearance."""
    groups: dict[str, tuple[dict, list[Entry]]] = {}
    for e in entries:
        inputs = inputs_of(e, ignored)
        groups.setdefault(repr(sorted(inputs.items())), (inputs, []))[1].append(e)
    return list(groups.values())


def _cl_view(inputs: dict[str, Any]) -> dict[str, Any]:
    """A federated row's inputs as a centralised run records them (no federation, no algorithm)."""
    return {k: v for k, v in inputs.items() if k.split(".")[0] not in CL_IGNORED}


def _init_rows(init: str, fl: list[Entry], cl: list[Entry]) -> list[tuple[dict, list | None, list | None]]:
    """(inputs, federated entries, centralised entries) of each row of one init: a row per set of federated
    inputs, with the centralised runs that match them; centralised runs that match none, their own rows."""
    cl_groups = _groups(cl, CL_IGNORED)
    rows, used = [], set()
    for inputs, entries in _groups(fl, IGNORED):
        match = next((j for j, (c, _) in enumerate(cl_groups) if c == _cl_view(inputs)), None)
        rows.append((inputs, entries, cl_groups[match][1] if match is not None else None))
        used.add(match)
    rows += [(inputs, None, entries) for j, (inputs, entries) in enumerate(cl_groups) if j not in used]
    return rows


def _labelled(base: str, parts: list[tuple[dict, list | None, list | None]]) -> list[tuple]:
    """(the inputs that tell it apart, label, federated entries, centralised entries) of each row of one
    init: the base label, with the inputs whose values differ among its rows when it has several; if those
    leave two labels alike, with the inputs some rows do not record too ("lr unrecorded")."""
    inputs = [i for i, _, _ in parts]
    for absent in (False, True):
        apart = differing(inputs, absent) if len(parts) > 1 else []
        told = [{k: i.get(k, UNRECORDED) for k in apart if k in i or absent} for i in inputs]
        labels = [f"{base} ({', '.join(input_text(k, v) for k, v in t.items())})" if t else base
                  for t in told]
        if len(set(labels)) == len(labels):
            break
    return [({k: None if v is UNRECORDED else v for k, v in t.items()}, label, fl, cl)
            for t, label, (_, fl, cl) in zip(told, labels, parts, strict=True)]


def build_tables(entries: Sequence[tuple]) -> list[Table]:
    """One table per setting (order of first appearance), rows = inits, from (config, final acc[, name[,
    recorded inputs]]); runs of one init made from other inputs are separate rows."""
    entries = [Entry(*e) for e in entries]
    fl: dict[tuple, dict[str, list[Entry]]] = {}
    cl: dict[tuple, dict[str, list[Entry]]] = {}
    for e in entries:
        groups = cl if e.config.centralized else fl
        cells = groups.setdefault(setting_of(e.config, e.config.centralized), {})
        cells.setdefault(e.config.init, []).append(e)
    settings = list(fl) + [k for k in cl if all(_cl_key(s) != k for s in fl)]  # unmatched CL: own table
    labels = {i: init_label(i) for i in {e.config.init for e in entries}}
    clashes = {v for v in labels.values() if list(labels.values()).count(v) > 1}
    tables = []
    for setting in settings:
        fl_cells, cl_cells = fl.get(setting, {}), cl.get(_cl_key(setting), {})
        rows, notes = [], []
        for init in _init_order([*fl_cells, *cl_cells]):
            base = init if labels[init] in clashes else labels[init]
            parts = _init_rows(init, fl_cells.get(init, []), cl_cells.get(init, []))
            for told, label, fl_entries, cl_entries in _labelled(base, parts):
                row = Row(init, label, Cell(fl_entries) if fl_entries else None,
                          Cell(cl_entries) if cl_entries else None, told)
                if row.federated:
                    notes += pool_notes(row.federated, f"{label} / Federated")
                if row.centralised:
                    notes += pool_notes(row.centralised, f"{label} / Centralised")
                rows.append(row)
        tables.append(Table(dict(setting), rows, notes))
    return tables


def heading(setting: dict[str, Any]) -> str:
    """A setting in one line, e.g. ``cifar10 · resnet20 ×1 · dirichlet alpha=0.3 · 10 clients · ...``."""
    param = headline(setting["partition"])
    partition = f"{setting['partition']} {param}={setting[param]:g}" if param else setting["partition"]
    parts = [setting["dataset"], f"{setting['arch']} ×{setting['width']:g}", partition,
             f"{setting['clients']} clients"]
    if setting["participation"] is not None:
        parts.append(f"participation {setting['participation']:g}")
    parts += [f"{setting['local_epochs']} local epochs", f"{setting['rounds']} rounds",
              setting["algo"] if setting["algo"] is not None else "centralised only"]
    return " · ".join(str(p) for p in parts)


def to_markdown(tables: Sequence[Table], title: bool = True, level: int = 2) -> str:
    """The tables as markdown; ``title`` adds the document title and legend, ``level`` is the depth of
    each setting's heading (the demo embeds the tables one level deeper in its own report)."""
    lines = ["# Federated vs centralised: final test accuracy (%; mIoU for segmentation)", "",
             "Mean ± sample std over seeds (n runs) where several seeds are given; ΔCL-FL = Centralised − "
             "Federated, of the means.", ""] if title else []
    for table in tables:
        algo = table.setting["algo"]
        lines += [f"{'#' * level} {heading(table.setting)}", "",
                  f"| init | Federated{f' ({algo})' if algo else ''} | Centralised | ΔCL-FL |",
                  "|---|---:|---:|---:|"]
        for row in table.rows:
            cells = [c.text() if c else MISSING for c in (row.federated, row.centralised)]
            delta = MISSING if row.delta is None else f"{row.delta:.1f}"
            lines.append(f"| {row.label} | {cells[0]} | {cells[1]} | {delta} |")
        lines += [""] + [f"Note: {n}." for n in table.notes] + ([""] if table.notes else [])
    return "\n".join(lines).rstrip() + "\n"


def to_json(tables: Sequence[Table]) -> dict:
    return {"metric": "final-round test_acc x 100 (mIoU for segmentation)", "tables": [
        {"heading": heading(t.setting), "setting": t.setting, "notes": t.notes, "rows": [
            {"init": r.init, "label": r.label, "inputs": r.inputs, "delta_cl_fl": r.delta,
             "federated": r.federated.record() if r.federated else None,
             "centralised": r.centralised.record() if r.centralised else None} for r in t.rows]}
        for t in tables]}


def final_entry(run: Run) -> Entry:
    """The run's config, its final round's test_acc and its recorded inputs; unfinished runs are refused."""
    rows = run.rows_with("test_acc")
    if not rows or rows[-1]["round"] < run.config.rounds:
        done = rows[-1]["round"] if rows else 0
        raise AnalysisError(f"{run.path}: {done} of {run.config.rounds} rounds done; finish it with "
                            f"{resume_command(run.path)}, or leave it out of the report")
    recorded = {k: run.record[k] for k in ("init_sha256", "algo") if k in run.record}
    return Entry(run.config, float(rows[-1]["test_acc"]), run.name, recorded)


def run_report(args: argparse.Namespace) -> None:
    if (args.departure or args.row) and not args.paper:
        raise AnalysisError("--row and --departure mark the paper's table: give --paper TABLE too")
    runs = load_runs(args.runs)
    out = output_dir(args.out, runs, writes=("report.md", "report.json"), force=args.force)
    entries = [final_entry(r) for r in runs]
    if args.paper:
        report = paper.build_paper(args.paper, entries, paper.row_map(args.row), args.departure)
        markdown, record = paper.paper_markdown(report), paper.paper_json(report)
    else:
        tables = build_tables(entries)
        markdown, record = to_markdown(tables), to_json(tables)
    atomic_write(out / "report.md", lambda tmp: tmp.write_text(markdown))
    write_json(out / "report.json", record)
    print(markdown, end="")
    print(f"report: {out / 'report.md'}, {out / 'report.json'}", file=sys.stderr)


def register(sub) -> None:
    p = sub.add_parser("report", help="Federated / Centralised / ΔCL-FL tables (Tables 2-5)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="federate run directories, federated and centralised (--centralized)")
    p.add_argument("--paper", default=None, metavar="TABLE",
                   help="lay the runs out as one of the paper's tables, the paper's number beside each cell: "
                        "table2 | table3 | table4 | table5 | table6 | table12 | table7 | sec4.5 "
                        "(analysis/paper.py says which runs feed which column)")
    p.add_argument("--row", action="append", default=[], metavar="LABEL=ROW",
                   help="with --paper: the paper's row of an init label (random, imagenet, places365 or a "
                        "checkpoint's file stem), e.g. --row fps-resnet20=FPS (repeatable; random, imagenet "
                        "and places365 map to Random, ImageNet and Places365 by default)")
    p.add_argument("--departure", action="append", default=[], metavar="ROW/COLUMN=TEXT",
                   help="with --paper: mark a cell whose runs differ from the paper's setting in a way that "
                        "can change the result, e.g. --departure 'FPS/C10=SimSiam; the paper's 79.9 is "
                        "MoCo-V2' (repeatable; ROW * marks the column's every row; the mark and TEXT are "
                        "printed beside the paper's number)")
    p.add_argument("--out", type=TEXT, default=None, help=OUT_HELP)
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.set_defaults(run=run_report)
