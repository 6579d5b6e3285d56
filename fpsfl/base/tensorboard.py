"""TensorBoard scalars of a run's metrics lines (issue 34): `--tensorboard DIR` on pretrain and federate.

``metrics.jsonl`` stays the source of truth; this is a live view of it. :class:`fpsfl.base.rundir.RunDir`
hands every line it appends to a :class:`ScalarWriter`, so both commands (and the Flower engine, which
writes through the same round loop) are covered in one place, and ``analyze tensorboard`` writes the same
events from a finished run's lines. A line's numbers become scalars at its step (the epoch or round); nested
tables (the tracked convex and variance analyses) are named ``table/key``; lists (per-client values) are left
out. Events go to ``DIR/<run directory's name>/``, so ``tensorboard --logdir DIR`` shows every run beside the
others. torch's ``SummaryWriter`` needs the ``tensorboard`` package (``pip install 'fpsfl[tensorboard]'``);
without it, asking for events is one line.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .files import probe_write

MISSING = ("--tensorboard needs the tensorboard package, which is not installed: "
           "pip install 'fpsfl[tensorboard]' (or pip install tensorboard)")


class TensorBoardMissing(ValueError):
    """The tensorboard package is not installed; the message is one line."""


def check_log_dir(log_dir: Path, flag: str = "--tensorboard") -> None:
    """Refuse now, in one line, a ``log_dir`` that SummaryWriter could not make or write (a file in its
    path, an unwritable root), rather than a traceback at the first metrics line. It tries what the writer
    will do (make the first missing folder, or write a file in an existing one) and undoes it: the folder
    appears with the first event, so a run refused later leaves nothing here."""
    path, missing = Path(log_dir).absolute(), None
    while not path.exists():
        path, missing = path.parent, path
    if not path.is_dir():
        raise ValueError(f"{flag}: {path} is a file, not a folder")
    try:
        if missing is not None:
            missing.mkdir()
            missing.rmdir()
        else:
            probe_write(path)
    except OSError as exc:
        what = f"make {missing}" if missing is not None else f"write in {path}"
        raise ValueError(f"{flag}: cannot {what}: {exc.strerror or exc}") from None


def scalars(record: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """(tag, value) of every number in a metrics line, nested tables as ``table/key``; booleans, strings
    and lists are left out. The step keys themselves (``epoch``, ``round``) are the x axis, not a scalar."""
    for key, value in record.items():
        if not prefix and key in ("epoch", "round"):
            continue
        tag = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from scalars(value, f"{tag}/")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            yield tag, float(value)


def step_of(record: Mapping[str, Any]) -> int:
    """The epoch (pretrain) or round (federate) a metrics line records, 1-based."""
    return int(record.get("epoch", record.get("round", 0)))


def summary_writer_class() -> type:
    """torch's SummaryWriter, or :class:`TensorBoardMissing` (one line) without the tensorboard package."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise TensorBoardMissing(MISSING) from None
    return SummaryWriter


class ScalarWriter:
    """Writes metrics lines as scalars into ``log_dir`` (created on the first line).

    The first line written opens the event file with ``purge_step`` at its step, so a resumed run's events
    of the steps it does again (after a crash) replace the earlier ones in TensorBoard's view.
    """

    def __init__(self, log_dir: Path):
        self.log_dir = Path(log_dir)
        self._cls = summary_writer_class()  # fail at the start of a run, not after its first epoch
        self._writer = None

    def write(self, record: Mapping[str, Any]) -> None:
        step = step_of(record)
        if self._writer is None:
            self._writer = self._cls(log_dir=str(self.log_dir), purge_step=step)
        for tag, value in scalars(record):
            self._writer.add_scalar(tag, value, step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def run_log_dir(root: Path, run_dir: Path) -> Path:
    """Where a run's events go under ``--tensorboard ROOT``: ``ROOT/<run directory's name>-<8 hex digits>``,
    the digits from the run directory's absolute path. Two runs whose folders share a name (``e1/x``,
    ``e2/x``) get folders of their own, so one's purge of resumed steps never deletes the other's curve
    (issue 42), and a resumed run writes into its own folder again."""
    path = Path(run_dir).resolve()
    return Path(root) / f"{path.name}-{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"


def write_rows(rows: list[Mapping[str, Any]], log_dir: Path) -> int:
    """Write finished metrics lines as events (``analyze tensorboard``); returns the number of scalars."""
    writer = ScalarWriter(log_dir)
    try:
        for row in rows:
            writer.write(row)
    finally:
        writer.close()
    return sum(1 for row in rows for _ in scalars(row))
