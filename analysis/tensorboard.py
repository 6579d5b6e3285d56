"""analyze tensorboard: a finished (or running) run's metrics lines as TensorBoard events, after the fact.

The same scalars ``--tensorboard DIR`` writes while a run goes (:mod:`fpsfl.base.tensorboard`), from the
run's ``metrics.jsonl`` (pretrain or federate), into ``OUT/<run directory's name>-<hash>/``
(:func:`fpsfl.base.tensorboard.run_log_dir`); for a federated run that tested its local models, also the
local and global gains of Eq. 3 (Chen et al., ICLR 2023, §6.1) as
``analysis/d_local`` and ``analysis/d_global``. ``tensorboard --logdir OUT`` shows the runs side by side.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fpsfl.base.cli import writable_dir
from fpsfl.base.tensorboard import run_log_dir, summary_writer_class, write_rows

from .dynamics import gains
from .runs import AnalysisError, read_metrics, run_kind


def run_rows(path: Path) -> list[dict]:
    """The metrics lines of a run directory, with the §6.1 gains added to a federated run's rounds."""
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise AnalysisError(f"{path}: no metrics.jsonl (not a pretrain or federate run directory)")
    command, unit = run_kind(path)
    rows = read_metrics(path, command, unit)
    federated = command == "federate" and (path / "config.json").is_file()
    if federated and rows and all("local_acc" in r for r in rows):
        by_round = {g["round"]: g for g in gains(rows)}
        rows = [{**r, "analysis": {k: by_round[r["round"]][k] for k in ("d_local", "d_global")}}
                if r["round"] in by_round else r for r in rows]
    return rows


def cmd_tensorboard(args: argparse.Namespace) -> None:
    if not args.runs:
        raise AnalysisError("no run directories given; pass one or more pretrain or federate run directories")
    paths = [Path(p) for p in args.runs]
    summary_writer_class()  # the package first: without it, nothing of the runs needs reading
    out = Path(args.out)
    for path in paths:  # each run's folder is its own (run_log_dir); one written before is not overwritten
        if run_log_dir(out, path).exists():
            raise AnalysisError(f"--out {out}: {run_log_dir(out, path)} already holds {path}'s events; "
                                f"choose another --out or remove that folder")
    rows = {p: run_rows(p) for p in dict.fromkeys(paths)}  # every input checked before anything is written
    out = writable_dir(out)
    for path, lines in rows.items():
        count = write_rows(lines, run_log_dir(out, path))
        print(f"{path}: {len(lines)} metrics lines, {count} scalars -> {run_log_dir(out, path)}")
    print(f"tensorboard --logdir {out}")


def register(sub) -> None:
    p = sub.add_parser("tensorboard", help="runs' metrics lines as TensorBoard events (needs the tensorboard "
                                           "package)", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", metavar="RUN", help="pretrain or federate run directories")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the events, one subfolder per run")
    p.set_defaults(run=cmd_tensorboard)
