"""A run directory: ``config.json``, ``metrics.jsonl`` and the ``--resume`` state (``state.pt``).

Shared by ``pretrain`` and ``federate``. ``config.json`` holds the fully resolved config plus how and where
the run was made (code version, torch, options); ``metrics.jsonl`` has one JSON line per finished epoch or
round; ``state.pt`` is the training state that ``--resume`` needs. Every file is loadable without running
code (JSON, or ``torch.load(weights_only=True)``).

Nothing is lost or corrupted on a crash: a run holds an exclusive lock on its directory for its whole life
(``flock``, which the kernel releases when the process dies, so a stale lock never blocks a resume); the
state is replaced atomically; a metrics line is appended and synced before the state that counts it is
saved, so a crash between the two leaves a line that ``--resume`` drops, and a crash inside the append a
torn last line, also dropped (with a one-line notice). A run that fails before its first epoch or round
leaves nothing behind; one killed then (SIGKILL, power loss) leaves its config.json, and ``--resume`` starts
it again. Temporary files of writers killed before their rename are removed when the lock is taken. The
crash-point sweep (``tests/test_crash_points.py``) kills a run at each of its writes and checks all this.

Each state also records a digest of the metrics lines it counts (``metrics_sha256``, the sha256 of the first
``metrics_lines`` lines of ``metrics.jsonl`` as written, kept running as lines are appended), so that an edit
of the file is found: ``--resume`` and ``analyze`` refuse a file whose lines no longer match it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

from .checkpoint import load_weights_only, plain
from .device import software_and_host
from .files import (
    CRASH_ENV,
    LockedError,
    append_line,
    atomic_save,
    atomic_write,
    clean_stale,
    lock_file,
    unlock_file,
)
from .migrate import FORMAT, FORMAT_KEY, read
from .settings import setting
from .tensorboard import ScalarWriter, check_log_dir, run_log_dir

STATE = "state.pt"
LOCK = ".lock"
FINAL = "final.pt"  # a finished federated run's model (federated.runner)
# state.pt's record of the metrics lines it counts: the sha256 of those lines as written, and their number
DIGEST, DIGEST_LINES = "metrics_sha256", "metrics_lines"
# the files a run writes (federate's partition report and --save-local-models too, and the writable-folder
# probe): only their temporary files are removed, so a run directory made in a user's folder touches nothing
# else of it
RUN_FILES = re.compile(r"config\.json|metrics\.jsonl|state\.pt|final\.pt|partition\.(json|png)|probe")
LOCAL_FILES = re.compile(r"global\.pt|client_\d+\.pt")  # RUN/local/round_NNNN/
__all__ = ["CRASH_ENV", "RunDir", "RunDirError", "RunFlags"]  # CRASH_ENV: the tests' hook (fpsfl.base.files)


class RunDirError(ValueError):
    """A run directory that cannot be used as asked; the message is one line."""


@dataclass(frozen=True)
class RunFlags:
    """How a run executes, shared by pretrain and federate: none of it changes the result on CPU."""

    device: str = setting("auto", "auto | cpu | cuda | cuda:N", group="run")
    resume: bool = setting(False, "continue the run in the run directory from its last finished epoch or "
                                  "round", group="run")
    progress: bool = setting(True, "no progress bar or per-epoch lines", flag="--quiet", group="run")
    # stop after this many epochs/rounds (--resume tests); internal: never read from a user's config file
    stop_after: int | None = setting(None, cli=False, internal=True)
    tensorboard: Path | None = setting(None, "also write every metrics line as TensorBoard scalars while the "
                                             "run goes, into DIR/<run directory's name>-<hash> (needs pip "
                                             "install 'fpsfl[tensorboard]'; metrics.jsonl stays the record)",
                                       parse=Path, metavar="DIR", group="run", default_text="none")


def code_version() -> str:
    """The git commit of the source tree (``+dirty`` when it has changes), or ``unknown``."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True,
                               timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha}+dirty" if dirty else sha


def read_jsonl(path: Path, error: type[ValueError] = RunDirError) -> tuple[list[dict], bool]:
    """(rows, whether a torn last line was dropped). A last line without its newline is what a crash
    during an append leaves; any other unreadable line is an ``error`` naming the file and line."""
    lines, torn = jsonl_lines(path, error)
    return [row for _, _, row in lines], torn


def jsonl_lines(path: Path, error: type[ValueError] = RunDirError
                ) -> tuple[list[tuple[int, str, dict]], bool]:
    """(line number, text as written with its newline, row) of each complete line that is not blank, and
    whether a torn last line was dropped (:func:`read_jsonl`)."""
    text = path.read_bytes().decode("utf-8", "surrogateescape") if path.exists() else ""
    lines = text.split("\n")
    torn = bool(lines[-1])  # the text did not end with a newline: the last append did not finish
    rows = []
    for number, line in enumerate(lines[:-1], 1):
        if not line.strip():
            continue
        try:
            rows.append((number, line + "\n", json.loads(line)))
        except json.JSONDecodeError as exc:
            raise error(f"{path}, line {number}: not a JSON record ({exc.msg}); the file is "
                        f"corrupt") from None
    return rows, torn


def lines_digest(texts: list[str]):
    """The running sha256 of metrics lines (each with its newline), as :class:`RunDir` keeps it."""
    return hashlib.sha256("".join(texts).encode("utf-8", "surrogateescape"))


def recorded_digest(state: dict) -> tuple[str, int] | None:
    """(sha256, number of lines) of the metrics lines a state counts; None for a state written before the
    digest was recorded."""
    digest, count = state.get(DIGEST), state.get(DIGEST_LINES)
    if isinstance(digest, str) and isinstance(count, int) and not isinstance(count, bool):
        return digest, count
    return None


def digest_matches(texts: list[str], recorded: tuple[str, int]) -> bool:
    """Whether the first lines of ``texts`` are the ones a state recorded (their number and sha256)."""
    digest, count = recorded
    return len(texts) >= count and lines_digest(texts[:count]).hexdigest() == digest


class RunDir:
    def __init__(self, path: Path, tensorboard: Path | None = None):
        """``tensorboard``: a folder that also receives every metrics line as TensorBoard scalars
        (:mod:`fpsfl.base.tensorboard`; a missing package is one line now, before the run starts)."""
        self.path = Path(path)
        self.config_path, self.metrics_path = self.path / "config.json", self.path / "metrics.jsonl"
        self.state_path = self.path / STATE
        self._lock_fd: int | None = None
        self._scalars = None
        self._digest, self._lines = None, 0  # the running sha256 of the metrics lines (:meth:`_hasher`)
        if tensorboard is not None:  # the flag checked once, before the run (analyze checks its own --out)
            log_dir = run_log_dir(tensorboard, self.path)
            check_log_dir(log_dir)
            self._scalars = ScalarWriter(log_dir)

    # ---- the whole life of a run ---------------------------------------------------------------------
    @contextmanager
    def session(self, resume: bool) -> Iterator[RunDir]:
        """Hold the directory's lock while the run lives. A new run refuses a directory that holds one,
        and removes what it created if it fails before saving its first state."""
        if resume and not (self.has_state() or self.config_path.is_file()):
            raise RunDirError(f"--resume: no training state at {self.state_path} (nothing to resume)")
        existed = set(os.listdir(self.path)) if self.path.is_dir() else None
        self.acquire()
        try:
            if not resume:
                self.ensure_new()
            yield self
        except BaseException:
            if not resume and not self.state_path.exists():
                self._remove_new_files(existed)
            raise
        finally:
            self.release()
            if self._scalars is not None:
                self._scalars.close()

    def acquire(self) -> None:
        """Take the exclusive lock (creating the directory); refuses one held by a live process. Then no
        writer of this run can be alive, so the temporary files of killed ones are removed."""
        try:
            if self.path.exists() and not self.path.is_dir():
                raise RunDirError(f"{self.path} is a file, not a run directory; choose another --out")
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock_fd = lock_file(self.path / LOCK, f"{self.path} is in use by process {{holder}} (a run "
                                                         f"is writing it); wait for it to finish or choose "
                                                         f"another --out")
        except LockedError as exc:
            raise RunDirError(str(exc)) from None
        except OSError as exc:
            raise RunDirError(f"cannot use {self.path} as a run directory: {exc.strerror or exc}") from None
        clean_stale(self.path, RUN_FILES, recursive=False)
        clean_stale(self.path / "local", LOCAL_FILES)
        self._digest = None  # read again from the file, which only a holder of the lock writes

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing drops the flock; the file stays (unlinking it would race)
            self._lock_fd = None

    def _remove_new_files(self, existed: set[str] | None) -> None:
        """Undo a run that never finished an epoch: the directory if it created it, else its new files."""
        self.release()
        if existed is None:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        for name in set(os.listdir(self.path)) - existed:
            target = self.path / name
            shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)

    # ---- files ---------------------------------------------------------------------------------------
    def has_state(self) -> bool:
        return self.state_path.is_file()

    def done(self) -> int:
        """The epochs or rounds the saved state counts as finished (0 without a readable state): the
        state is the last file a finished epoch or round writes, so its count is what is on disk."""
        try:
            state = load_weights_only(self.state_path, "run state (state.pt)", RunDirError)
        except RunDirError:
            return 0
        return int(state.get("done", 0)) if isinstance(state, dict) else 0

    def ensure_new(self) -> None:
        """Refuse a directory that already holds a run, so that nothing is overwritten: its state or metrics,
        a finished run's final model, or the config.json of a run killed before its first state."""
        if self.state_path.exists() or self.metrics_path.exists():
            raise RunDirError(f"{self.path} already holds a run; pass --resume to continue it, or choose "
                              f"another --out / --run-dir")
        if (self.path / FINAL).exists():
            raise RunDirError(f"{self.path} holds a finished run ({FINAL}); choose another --out")
        if self.config_path.exists():
            raise RunDirError(f"{self.path} holds the config.json of a run that saved no state (killed in "
                              f"its first epoch or round?); pass --resume to start that run again, or "
                              f"choose another --out / --run-dir")

    def create(self, config: dict, opts: Any) -> int:
        """Start a new run here; refuses a directory that already holds one. Returns the first epoch (0)."""
        self.ensure_new()
        self.path.mkdir(parents=True, exist_ok=True)
        options = asdict(opts) if is_dataclass(opts) else dict(opts)
        record = {FORMAT_KEY: FORMAT, "config": plain(config), "run": plain({k: str(v) for k, v in
                  options.items()}), "code_version": code_version(), **software_and_host(),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        self._write_text(self.config_path, json.dumps(record, indent=2) + "\n")
        self._digest = None
        return 0

    def saved_config(self) -> dict:
        try:
            return read(self.config_path)["config"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RunDirError(f"--resume: {self.config_path} is missing or unreadable ({exc}); "
                              f"start a new run") from None

    def check_config(self, config: dict, compare: tuple[str, ...]) -> dict:
        """The saved config, once ``config[k]`` matches it for each ``k`` of ``compare`` that it records (a
        key it lacks was added after the run started)."""
        saved = self.saved_config()
        differs = sorted(k for k in compare if k in saved and saved[k] != plain(config[k]))
        if differs:
            raise RunDirError(f"--resume: the {' and '.join(differs)} config differs from the one in "
                              f"{self.config_path}; resume with the same settings or start a new run")
        return saved

    def load_state(self, config: dict, compare: tuple[str, ...]) -> dict:
        """The saved training state, after checking that ``config[k]`` matches the saved one for ``compare``.

        Metrics lines of epochs/rounds after the state (a crash between the two writes) are dropped.
        """
        if not self.has_state():
            raise RunDirError(f"--resume: no training state at {self.state_path} (nothing to resume)")
        saved = self.check_config(config, compare)
        state = load_weights_only(self.state_path, "run state (state.pt)", RunDirError)
        if not isinstance(state, dict) or "done" not in state:
            raise RunDirError(f"{self.state_path} is not a valid run state (state.pt); start a new run")
        done = int(state["done"])
        lines, torn = jsonl_lines(self.metrics_path)
        missing = missing_steps([row for _, _, row in lines], done)
        if missing:  # a torn or lost line of a round the state counts: its metrics cannot be recovered
            unit = "round" if "federate" in saved else "epoch"
            raise RunDirError(f"--resume: {self.metrics_path} has no line for {unit}(s) "
                              f"{step_ranges(missing)}, which {self.state_path.name} counts as done ("
                              f"{'its last line is torn' if torn else 'a line was lost'}); their metrics "
                              f"are lost: start a new run")
        texts, recorded = [text for _, text, _ in lines], recorded_digest(state)
        if recorded is not None and not digest_matches(texts, recorded):
            raise RunDirError(f"--resume: {self.metrics_path} is not what the run wrote: its lines do not "
                              f"match the digest {self.state_path.name} recorded of them (edited since?); "
                              f"restore the file as the run wrote it, or start a new run")
        # the lines the state counts, as written; those after it (a crash before their state) are dropped
        kept = (texts[:recorded[1]] if recorded is not None
                else [text for _, text, row in lines if _step(row) <= done])  # a run from before the digest
        self._truncate_metrics(kept, torn)
        return state

    def start_again(self, config: dict, compare: tuple[str, ...]) -> None:
        """``--resume`` of a run killed before it saved a state: once ``compare`` matches, forget its
        config.json and metrics lines (none counted by a state), so that :meth:`create` starts it anew."""
        saved = self.check_config(config, compare)
        unit = "round" if "federate" in saved else "epoch"
        print(f"note: {self.path} holds no state (the run was stopped in its first {unit}): starting it "
              f"again from the beginning", file=sys.stderr)
        self.metrics_path.unlink(missing_ok=True)
        self.config_path.unlink(missing_ok=True)
        self._digest = None

    def save_state(self, state: dict) -> None:
        """Save the training state; ``state["done"]`` counts the finished epochs or rounds. The state also
        records the digest of the metrics lines written so far (``metrics_sha256``, ``metrics_lines``)."""
        digest = self._hasher()
        atomic_save({**state, DIGEST: digest.hexdigest(), DIGEST_LINES: self._lines}, self.state_path)

    def append_metrics(self, record: dict) -> None:
        """Append one line and sync it to disk before the state that counts it is saved; then, with
        ``tensorboard``, the same line as scalars (the one place both commands write metrics through)."""
        line, digest = json.dumps(record) + "\n", self._hasher()
        append_line(self.metrics_path, line)
        digest.update(line.encode("utf-8", "surrogateescape"))
        self._lines += 1
        if self._scalars is not None:
            self._scalars.write(record)

    def _hasher(self):
        """The running sha256 of the metrics lines; at a session's first use, that of the file's lines (none
        for a new run; those a resumed state counts, once :meth:`load_state` has cut the file to them)."""
        if self._digest is None:
            texts = [text for _, text, _ in jsonl_lines(self.metrics_path)[0]]
            self._digest, self._lines = lines_digest(texts), len(texts)
        return self._digest

    def metrics(self) -> list[dict]:
        return read_jsonl(self.metrics_path)[0]

    def last_metrics(self) -> dict:
        rows = self.metrics()
        return rows[-1] if rows else {}

    def _truncate_metrics(self, kept: list[str], torn: bool) -> None:
        """Rewrite metrics.jsonl as the lines ``kept`` (as written), and the running digest as theirs."""
        if torn:
            print(f"note: dropped the torn last line of {self.metrics_path} (a crash while it was written)",
                  file=sys.stderr)
        self._write_text(self.metrics_path, "".join(kept))
        self._digest, self._lines = lines_digest(kept), len(kept)

    @staticmethod
    def _write_text(path: Path, text: str) -> None:
        atomic_write(path, lambda tmp: tmp.write_text(text))


def _step(row: dict) -> int:
    """The epoch (pretrain) or round (federate) a metrics line records, 1-based."""
    return int(row.get("epoch", row.get("round", 0)))


def missing_steps(rows: list[dict], done: int) -> list[int]:
    """The epochs or rounds 1..``done`` that no metrics line records."""
    return sorted(set(range(1, done + 1)) - {_step(r) for r in rows})


def step_ranges(steps: list[int]) -> str:
    """[3] -> "3", [2, 3, 4, 7] -> "2-4, 7"."""
    parts, start = [], None
    for i, n in enumerate(steps):
        start = n if start is None else start
        if i + 1 == len(steps) or steps[i + 1] != n + 1:
            parts.append(str(n) if n == start else f"{start}-{n}")
            start = None
    return ", ".join(parts)



@contextmanager
def lock_out(out: Path, names: re.Pattern | None = None) -> Iterator[None]:
    """Hold ``.NAME.lock`` beside a run's output file ``out`` while the block runs (removed at its end): two
    runs with one --out and two run directories would otherwise both find it absent and overwrite each
    other's files. Then remove the temporary files killed writers of ``out`` (and of the files ``names``
    matches, e.g. pretrain's --keep-every copies) left."""
    lock = out.with_name(f".{out.name}.lock")
    try:
        fd = lock_file(lock, f"--out {out} is being written by process {{holder}}; wait for it to finish or "
                             f"choose another --out")
    except LockedError as exc:
        raise RunDirError(str(exc)) from None
    except OSError as exc:
        raise RunDirError(f"cannot write beside --out {out}: {exc.strerror or exc}") from None
    try:
        clean_stale(out.parent, names or re.compile(re.escape(out.name)), recursive=False)
        yield
    finally:
        unlock_file(lock, fd)
