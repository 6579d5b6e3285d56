"""The one round loop of every federated run: supervised ``federate`` (FedAvg-family and the centralised
baseline, :mod:`federated.runner`) and federated self-pre-training (:mod:`federated.selfsup.runner`), on
the in-process engine and on Flower (whose ServerApp calls the same loop with its own dispatcher).

What a round does is the caller's :class:`RoundWork`: train the round's clients (McMahan et al. 2017,
Algorithm 1) or the pooled data, aggregate, evaluate, and return the round's metrics line. The loop owns
what every run must do alike, in this order, so that a crash at any point leaves a run that ``--resume``
finishes: time the round, append its line to ``metrics.jsonl``, then save the state that the line
describes (:class:`fpsfl.base.rundir.RunDir` ties the two), and write the run's final artifact once the
last round is on disk.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from tqdm import tqdm

from fpsfl.base.checkpoint import differences, plain
from fpsfl.base.rundir import RunDir, RunDirError

from .local import DivergenceError


class RoundWork(Protocol):
    """One kind of round. ``desc`` names the progress bar; ``rounds`` are the values of ``rnd`` of a whole
    run, and ``last_round`` the ``round`` of its last metrics line (after which :meth:`finish` writes the
    final artifact)."""

    desc: str
    rounds: range
    last_round: int

    def round(self, rnd: int, bar: tqdm) -> dict:
        """Round ``rnd``'s work; returns its metrics line (with its ``round``). May raise DivergenceError."""

    def state(self, rnd: int) -> dict:
        """What ``state.pt`` holds once round ``rnd`` is done (a --resume continues from it)."""

    def diverged(self, rnd: int, exc: DivergenceError) -> str:
        """The one-line message for round ``rnd`` diverging: what is kept and what to try."""

    def line(self, record: dict) -> str:
        """The round as one log line (a run without a progress bar, e.g. under ``flwr run``)."""

    def postfix(self, record: dict) -> dict[str, str]:
        """What the progress bar shows after the round (may be empty)."""

    def finish(self) -> None:
        """Write the run's final artifact (the last round is on disk)."""


def run_rounds(work: RoundWork, start: int, rundir: RunDir, *, progress: bool, log_rounds: bool,
               stop_after: int | None) -> list[dict]:
    """Run the rounds of ``work`` from ``rnd`` = ``start`` (a fresh run's first, or where a resumed run
    stopped), at most ``stop_after`` of them; returns every metrics row of the run so far."""
    todo = range(start, work.rounds.stop)
    done = start - work.rounds.start  # the rounds a resumed run has behind it
    bar = tqdm(total=done + len(todo), initial=done, desc=work.desc, unit="round", disable=not progress,
               dynamic_ncols=True)
    for rnd in todo:
        if stop_after is not None and rnd - todo.start >= stop_after:
            break
        t0 = time.perf_counter()
        try:
            record = work.round(rnd, bar)
        except DivergenceError as exc:
            bar.close()
            raise DivergenceError(work.diverged(rnd, exc)) from None
        record["seconds"] = time.perf_counter() - t0
        rundir.append_metrics(record)
        if log_rounds:
            tqdm.write(work.line(record), file=sys.stderr)
        rundir.save_state(work.state(rnd))
        postfix = work.postfix(record)
        if postfix:
            bar.set_postfix(postfix)
        bar.update(1)
    bar.close()
    rows = rundir.metrics()
    if rows and rows[-1]["round"] == work.last_round:
        work.finish()
    return rows


def check_resume(rundir: RunDir, config: dict, parts: tuple[str, ...], init: str,
                 typed: Mapping[str, Callable[[Any], Any]] | None = None) -> None:
    """Refuse (one line) a --resume whose settings differ from the saved run's in any of the config's
    ``parts`` (an older run's record brought to today's format first, :mod:`fpsfl.base.migrate`; ``typed``:
    a function per part that types what an older run recorded as text). The --init path is not compared
    (the state holds the model) but its sha256 is: a moved init file resumes, another of that name does
    not."""
    saved, mine, typed = rundir.saved_config(), plain(config), typed or {}
    for part in parts:
        a, b = saved.get(part), mine[part]
        if part in typed:
            a = plain(typed[part](a))
        if isinstance(b, dict) and (a is None or isinstance(a, dict)):
            a = {k: v for k, v in (a or {}).items() if k != "init"}
            b = {k: v for k, v in b.items() if k != "init"}
        if a != b:
            changed = ([k for k, _, _ in differences(a, b)] if isinstance(a, dict) and isinstance(b, dict)
                       else [part])
            raise RunDirError(f"--resume: {', '.join(changed)} differ(s) from the run in "
                              f"{rundir.config_path}; resume with the same settings or start a new run")
    recorded, now = saved.get("init_sha256"), mine["init_sha256"]
    if recorded and now and recorded != now:
        raise RunDirError(f"--resume: --init {init} is not the file this run started from (its sha256 "
                          f"differs from the one in {rundir.config_path})")
