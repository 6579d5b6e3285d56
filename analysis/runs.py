"""Reading federated run directories: the only input of every analysis (Chen et al., ICLR 2023, §6).

A run directory (written by ``federate``) holds ``config.json``, ``metrics.jsonl``, ``final.pt`` and,
when asked for, ``local/round_NNNN/client_MMM.pt``. Everything that cannot be used gets an
:class:`AnalysisError` whose one-line message says what to re-run.

Every analysis reads ``metrics.jsonl`` through :func:`read_metrics` (pretrain's and self-pre-training's run
directories too): only the lines ``state.pt`` vouches for (their sha256, which the run recorded as it wrote
them), each value a finite number. A file edited since, or a NaN or infinite value, is refused in one line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from federated.experiment import FederateConfig
from federated.setup import Setup, setup
from fpsfl.base.checkpoint import load_weights_only
from fpsfl.base.device import resolve_device
from fpsfl.base.migrate import FormatError, read
from fpsfl.base.rundir import STATE, digest_matches, jsonl_lines, missing_steps, recorded_digest, step_ranges


class AnalysisError(ValueError):
    """Input an analysis cannot use; the message is one line and says what to re-run."""


@dataclass
class Run:
    path: Path
    name: str  # the directory name, used as the label in figures and tables
    config: FederateConfig
    metrics: list[dict]
    record: dict[str, Any] = field(default_factory=dict)  # config.json's config: init_sha256, algo, ...

    def rows_with(self, key: str) -> list[dict]:
        return [r for r in self.metrics if key in r]

    def local_rounds(self) -> list[int]:
        """Rounds whose client models were saved (``--save-local-models``)."""
        folder = self.path / "local"
        return sorted(int(p.name.split("_")[1]) for p in folder.glob("round_*")) if folder.is_dir() else []

    def local_states(self, rnd: int) -> tuple[list[dict], list[int]]:
        """The saved client models of round ``rnd`` and their data sizes (from the metrics line)."""
        files = sorted((self.path / "local" / f"round_{rnd:04d}").glob("client_*.pt"))
        row = next((r for r in self.metrics if r["round"] == rnd), None)
        if not files or row is None:
            raise AnalysisError(f"{self.path}: no client models of round {rnd}; re-run federate with "
                                f"--save-local-models {rnd}")
        clients = [int(f.stem.split("_")[1]) for f in files]
        sizes = dict(zip(row["clients"], row["client_sizes"], strict=True))
        states = [_state_dict(load_weights_only(f, "client model", AnalysisError), f) for f in files]
        return states, [sizes[c] for c in clients]

    def final_state(self) -> dict:
        path = self.path / "final.pt"
        if not path.is_file():
            raise AnalysisError(f"{self.path}: no final.pt (the run did not finish); finish it with "
                                f"{resume_command(self.path)}")
        final = load_weights_only(path, "final model (final.pt)", AnalysisError)
        if not isinstance(final, dict) or not isinstance(final.get("model"), dict):
            raise AnalysisError(f"{path} is not a valid final model (final.pt): it has no 'model' entry")
        return _state_dict(final["model"], path)


def _state_dict(obj, path: Path) -> dict:
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise AnalysisError(f"{path} does not hold a state dict of tensors")
    return obj


def resume_command(path: Path) -> str:
    """The command that finishes a federate run: its settings come from its config.json (a bare
    ``federate --resume`` would compare the defaults with them and refuse)."""
    return f"federate --config {path / 'config.json'} --resume --out {path}"


def load_run(path: str | Path) -> Run:
    path = Path(path)
    config_path, metrics_path = path / "config.json", path / "metrics.jsonl"
    if not config_path.is_file() or not metrics_path.is_file():
        raise AnalysisError(f"{path} is not a federate run directory (no config.json / metrics.jsonl); "
                            f"make one with federate --out {path}")
    try:  # config.json is read (and migrated) once
        saved = read(config_path)
    except FormatError as exc:
        raise AnalysisError(str(exc)) from None
    except (TypeError, ValueError) as exc:  # not JSON, or not a JSON object
        raise _unreadable(config_path, exc) from None
    record = saved.get("config")
    if isinstance(record, dict):
        _not_federate(path, record, saved.get("run"))
    try:
        config = FederateConfig.from_dict(record["federate"])
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise _unreadable(config_path, exc) from None
    rounds = _final_rounds(path)  # final.pt first: a broken one is named before the state that vouches
    metrics = read_metrics(path, "federate", "round")  # a torn last line (a crashed run) is left out
    if not metrics:
        raise AnalysisError(f"{path}: no finished round in metrics.jsonl; run or resume it first")
    missing = missing_steps(metrics, rounds if rounds is not None else max(int(r["round"]) for r in metrics))
    if missing:  # a finished run whose last line was torn, or a line lost: never read as a shorter run
        raise AnalysisError(f"{metrics_path} has no line for round(s) {step_ranges(missing)} of a run that "
                            f"finished them; their metrics are lost: re-run federate into a new directory")
    return Run(path, path.name, config, metrics, record)


def _saved(path: Path) -> tuple[dict, dict] | None:
    """(the ``config`` record, the ``run`` options) of a run directory's config.json; None when unreadable
    (left to the caller to report)."""
    try:
        saved = read(path / "config.json")
        record, run = saved["config"], saved.get("run")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not isinstance(record, dict):
        return None
    return record, run if isinstance(run, dict) else {}


def _unreadable(config_path: Path, exc: Exception) -> AnalysisError:
    return AnalysisError(f"{config_path}: unreadable ({exc}); re-run federate into a new directory")


def _not_federate(path: Path, record: dict, run: Any) -> None:
    """Refuse, saying what it is, a run directory of another command: federated self-pre-training (which
    ``FederateConfig.from_dict`` would read as a federate run of the default 100 rounds, none done) or
    pretrain. ``record``, ``run``: its config.json's ``config`` and ``run``."""
    command = _kind(record)[0]
    if command == "federate":
        return
    run = run if isinstance(run, dict) else {}
    ckpt = str(run.get("out", "its --out"))
    there = Path(ckpt).is_file()
    probe = f" (analyze probe {ckpt} probes the checkpoint itself)" if there else ""
    if command == "federate self-pretrain":
        made = (f"it wrote the backbone checkpoint {ckpt} for federate --init" if there else
                f"it has not yet written its backbone checkpoint {ckpt} for federate --init (its rounds are "
                f"not done: continue it with the flags it started with and --resume)")
        raise AnalysisError(f"{path} is a federated self-pre-training run (federate self-pretrain), not a "
                            f"federate run: it trains no classifier and has no test accuracy to analyse; "
                            f"{made}; analyse the federate runs started from it{probe}")
    raise AnalysisError(f"{path} is a pretrain run directory, not a federate run: its output is the "
                        f"checkpoint {ckpt} for federate --init: analyse the federate runs started from "
                        f"it{probe}")


def run_kind(path: Path) -> tuple[str, str]:
    """(the command that wrote a run directory, its unit): federate / federate self-pretrain (rounds) or
    pretrain (epochs); federate for an unreadable config.json."""
    saved = _saved(path)
    return _kind(saved[0] if saved is not None else {})


def _kind(record: dict) -> tuple[str, str]:
    """:func:`run_kind` of a config.json's ``config`` record."""
    if "self_pretrain" in record:
        return "federate self-pretrain", "round"
    pretrain = "pretrain" in record and "federate" not in record
    return ("pretrain", "epoch") if pretrain else ("federate", "round")


def read_metrics(path: Path, command: str, unit: str) -> list[dict]:
    """The metrics lines of run directory ``path`` that its ``state.pt`` vouches for (``command`` and
    ``unit``: what wrote it, for the messages). Refused in one line: a line of a round (epoch) the state
    counts that is lost or torn; lines that no longer match the digest the state recorded of them; a value
    that is not a finite number. A torn last line of an unfinished round is left out, and so are lines after
    those the state counts (a run killed before it saved their state), with a warning. Runs from before the
    digest was recorded are read unverified, with a warning."""
    metrics_path = path / "metrics.jsonl"
    lines, torn = jsonl_lines(metrics_path, AnalysisError)
    state_path = path / STATE
    if state_path.is_file():
        state = _state(state_path)
        missing = missing_steps([row for _, _, row in lines], int(state.get("done", 0)))
        if missing:
            how = "its last line is torn" if torn else "a line was lost"
            raise AnalysisError(f"{metrics_path} has no line for {unit}(s) {step_ranges(missing)} of a run "
                                f"that finished them ({how}); their metrics are lost: re-run {command} into "
                                f"a new directory")
        recorded = recorded_digest(state)
        if recorded is None:
            _warn(f"{path}: its {STATE} records no digest of metrics.jsonl (a run from before digests were "
                  f"recorded), so an edit of its lines cannot be detected")
        elif not digest_matches([text for _, text, _ in lines], recorded):
            raise AnalysisError(f"{metrics_path} is not what the run wrote: its lines do not match the "
                                f"digest {STATE} recorded of them (edited since?); restore the file as the "
                                f"run wrote it, or re-run {command} into a new directory")
        elif len(lines) > recorded[1]:
            left = lines[recorded[1]:]
            _warn(f"{metrics_path}: line(s) {', '.join(str(n) for n, _, _ in left)} come after the "
                  f"{recorded[1]} that {STATE} counts (written by a run killed before it saved their state, "
                  f"or added since): left out, as --resume drops them")
            lines = lines[:recorded[1]]
    elif lines:
        _warn(f"{path}: no {STATE}, so nothing vouches for metrics.jsonl (a run killed before it saved its "
              f"first state, or a folder no run wrote): its lines are read unverified")
    for number, _, row in lines:
        bad = _not_finite(row)
        if bad is not None:
            key, value = bad
            where = f" ({unit} {row[unit]})" if unit in row else ""
            raise AnalysisError(f"{metrics_path}, line {number}{where}: {key} is {json.dumps(value)}, not a "
                                f"finite number; the run has no such result to report: leave it out, or "
                                f"re-run {command} into a new directory")
    return [row for _, _, row in lines]


def _state(path: Path) -> dict:
    """state.pt, its tensors mapped rather than read (only the digest and the count are wanted)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # an old-format, truncated or foreign file: load_weights_only's one line, or the state
        state = load_weights_only(path, "run state (state.pt)", AnalysisError)
    if not isinstance(state, dict) or "done" not in state:
        raise AnalysisError(f"{path} is not a valid run state (state.pt): it has no 'done' entry")
    return state


def _not_finite(value: Any, key: str = "") -> tuple[str, float] | None:
    """(the dotted key, the value) of the first NaN or infinite number in a metrics line, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return key, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        bad = _not_finite(v, f"{key}.{k}" if key else str(k))
        if bad is not None:
            return bad
    return None


def _warn(message: str) -> None:
    print(f"analyze: warning: {message}", file=sys.stderr)


def _final_rounds(path: Path) -> int | None:
    """The rounds a finished run did: those of the config final.pt was written with (only once its last
    round was); None without final.pt (then the run did the rounds it logged)."""
    final = path / "final.pt"
    if not final.is_file():
        return None
    record = load_weights_only(final, "final model (final.pt)", AnalysisError)
    try:
        return int(record["config"]["federate"]["rounds"])
    except (KeyError, TypeError, ValueError):
        raise AnalysisError(f"{final} has no federate config; re-run federate") from None


def load_runs(paths: list[str]) -> list[Run]:
    if not paths:
        raise AnalysisError("no run directories given; pass one or more federate --out directories")
    return [load_run(p) for p in paths]


def rebuild(run: Run, device: str = "auto") -> Setup:
    """The run's data, partition, task and an (untrained) model of its architecture, on ``device``.

    The init is not reloaded: analyses load the states they study into the model.
    """
    cfg = dataclasses.replace(run.config, init="random")
    return setup(cfg, resolve_device(device))
