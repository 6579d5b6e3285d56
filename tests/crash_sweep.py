"""The crash-point sweep (issue 31): run a command once, logging every file operation it makes through the
I/O helpers of :mod:`fpsfl.base.files`; then, for each operation, run it again killed (SIGKILL) at that
operation and ``--resume`` it. The resumed run must end with the uninterrupted run's artifacts bit for bit
(metrics without their timings; the run state without the digest of its metrics lines, which differs with the
timings and must match the run's own lines), claim what its files hold, and leave no temporary file behind.

Runs are forks of one clean server process (multiprocessing's forkserver, the commands imported once), each
with its own output files; the kill is the hook ``FPSFL_TEST_CRASH=any:N`` (the process kills itself at its
N-th file event). Not forks of the test process: one that compiled and back-propagated a model
(``torch.compile``, in any earlier test of the process) leaves autograd unusable in its forks ("Unable to
handle autograd's threading in combination with fork-based multiprocessing"), which ``pytest -n 2`` hit.
"""

from __future__ import annotations

import functools
import io
import json
import multiprocessing
import os
import re
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fpsfl.base.files import CRASH_ENV, LOG_ENV
from fpsfl.base.rundir import DIGEST, STATE, digest_matches, jsonl_lines, recorded_digest

TIMINGS = {"seconds", "pairs_per_s", "data_wait", "augment_frac", "compute_frac"}  # differ run to run
LOCKS = re.compile(r"^(\.lock|\..+\.lock)$")
TEMPORARY = re.compile(r"^\..+\.tmp\d+$")


@dataclass
class Result:
    code: int  # exit code; -9 when killed
    out: str
    err: str


@functools.cache
def _server():
    """The forkserver context, made on first use."""
    context = multiprocessing.get_context("forkserver")
    # what the three commands import, so that each fork starts warm (measured: sys.modules after a run)
    context.set_forkserver_preload(["torch", "torch._dynamo", "numba", "scipy", "sklearn.datasets",
                                    "matplotlib", "federated.cli", "federated.runner",
                                    "federated.selfsup.runner", "pretrain.cli", "pretrain.train"])
    return context


def _child(main: Callable[[list[str]], int], argv: list[str], environ: dict[str, str], cwd: str, out: str,
           err: str) -> None:
    """The forked run: the test process's environment and folder, output to files; never returns."""
    code = 99
    try:
        # one thread runs every op inline: the reference, killed and resumed runs sum alike
        torch.set_num_threads(1)
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        for fd, path in ((1, out), (2, err)):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (closed by _exit)
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        code = main([str(a) for a in argv])
    except BaseException:  # a traceback is a finding: printed and exit 99
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def forked(main: Callable[[list[str]], int], argv: list[str], env: dict[str, str], logs: Path) -> Result:
    """``main(argv)`` (a module-level function: it is pickled) in a forked child with ``env`` added; its
    stdout and stderr go to files in ``logs``."""
    logs.mkdir(parents=True, exist_ok=True)
    out, err = logs / "stdout", logs / "stderr"
    child = _server().Process(target=_child, args=(main, [str(a) for a in argv], {**os.environ, **env},
                                                   os.getcwd(), str(out), str(err)))
    child.start()
    child.join()
    return Result(child.exitcode, out.read_text(), err.read_text())  # exitcode: -9 when killed


def _state(path: Path) -> bytes:
    """A run state's bytes without the digest of its metrics lines (asserted to match them first): that
    digest covers the lines' timings, which differ run to run."""
    state = torch.load(path, weights_only=True)
    lines = [text for _, text, _ in jsonl_lines(path.with_name("metrics.jsonl"))[0]]
    assert digest_matches(lines, recorded_digest(state)), f"{path}: its digest does not match metrics.jsonl"
    buffer = io.BytesIO()
    torch.save({k: v for k, v in state.items() if k != DIGEST}, buffer)
    return buffer.getvalue()


def artifacts(root: Path) -> dict[str, object]:
    """{relative path: comparable content} of every file under ``root`` but locks: bytes, except
    metrics.jsonl (rows without their timings), config.json (its config, not when and how it ran) and a run
    state (without the digest of its metrics lines, :func:`_state`)."""
    found = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or LOCKS.match(path.name):
            continue
        name = str(path.relative_to(root))
        if path.name.endswith(".jsonl"):
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            found[name] = [{k: v for k, v in r.items() if k not in TIMINGS} for r in rows]
        elif path.name == "config.json":
            found[name] = json.loads(path.read_text())["config"]
        elif path.name == STATE:
            found[name] = _state(path)
        else:
            found[name] = path.read_bytes()
    return found


def temporaries(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*") if TEMPORARY.match(p.name))


def claim(text: str, root: Path) -> str:
    """The last line a run printed, with its folder and its durations masked: what it claims it made."""
    last = (text.strip().splitlines() or [""])[-1]
    return re.sub(r"\d+ s of training", "N s of training", last.replace(str(root), "ROOT"))


@dataclass
class Sweep:
    """One command under the sweep: ``argv(root)`` makes its outputs under ``root``; ``done(root)`` is the
    "finished" marker a caller (the demo) trusts, checked at every crash point."""

    name: str
    main: Callable[[list[str]], int]
    argv: Callable[[Path], list]
    done: Callable[[Path], bool]
    events: list[tuple[str, str]] = field(default_factory=list)
    reference: dict = field(default_factory=dict)
    claimed: str = ""

    def record(self, tmp: Path) -> None:
        """The uninterrupted run: its events, artifacts and claim. Every file it made must have come
        through the I/O helpers (else the sweep would miss that write)."""
        root, log = tmp / "reference", tmp / "reference.log"
        ran = forked(self.main, self.argv(root), {LOG_ENV: str(log)}, tmp / "logs-reference")
        assert ran.code == 0, ran.err
        self.events = [tuple(json.loads(line)) for line in log.read_text().splitlines()]
        self.reference, self.claimed = artifacts(root), claim(ran.out, root)
        written = {str(Path(path).relative_to(root)) for _, path in self.events}
        assert set(self.reference) <= written, f"files written outside the I/O helpers: " \
                                               f"{sorted(set(self.reference) - written)}"
        assert self.done(root)

    def crash_at(self, tmp: Path, n: int) -> str:
        """Kill a run at event ``n`` (1-based), check the marker, resume it, compare. Returns what the
        resume did ("resumed" or "restarted": --resume found nothing and the command ran anew)."""
        kind, path = self.events[n - 1]
        root, logs = tmp / f"crash-{n:03d}", tmp / f"logs-{n:03d}"
        where = f"{self.name}: killed at event {n}/{len(self.events)} ({kind} {path})"
        killed = forked(self.main, self.argv(root), {CRASH_ENV: f"any:{n}"}, logs / "killed")
        assert killed.code == -9, f"{where}: the run was not killed ({killed.code}): {killed.err}"
        if self.done(root):  # the marker may only say finished when everything is there
            assert artifacts(root) == self.reference, f"{where}: marked done but not finished"
        resumed = forked(self.main, [*self.argv(root), "--resume"], {}, logs / "resumed")
        how = "resumed"
        if resumed.code == 2 and "nothing to resume" in resumed.err:  # true only if nothing was saved
            assert not list(root.rglob("config.json")), f"{where}: {resumed.err}"
            resumed, how = forked(self.main, self.argv(root), {}, logs / "again"), "restarted"
        assert resumed.code == 0 and "Traceback" not in resumed.err, f"{where}: {resumed.err}"
        assert claim(resumed.out, root) == self.claimed, f"{where}: claims {claim(resumed.out, root)!r}"
        assert not temporaries(root), f"{where}: left {temporaries(root)}"
        got = artifacts(root)
        assert got.keys() == self.reference.keys(), f"{where}: files {sorted(got)} != " \
                                                    f"{sorted(self.reference)}"
        for name, content in self.reference.items():
            assert got[name] == content, f"{where}: {name} differs from the uninterrupted run's"
        assert self.done(root)
        return how
