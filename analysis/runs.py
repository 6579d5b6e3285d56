"""Reading federated run directories: the only input of every analysis (Chen et al., ICLR 2023, §6).

A run directory (written by ``federate``) holds ``config.json``, ``metrics.jsonl``, ``final.pt`` and,
when asked for, ``local/round_NNNN/client_MMM.pt``. Everything that cannot be used gets an
:class:`AnalysisError` whose one-line message says what to re-run.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from federated.experiment import FederateConfig
from federated.setup import Setup, setup
from fpsfl.base.checkpoint import load_weights_only
from fpsfl.base.device import resolve_device
from fpsfl.base.rundir import missing_steps, read_jsonl, step_ranges


class AnalysisError(ValueError):
    """Input an analysis cannot use; the message is one line and says what to re-run."""


@dataclass
class Run:
    path: Path
    name: str  # the directory name, used as the label in figures and tables
    config: FederateConfig
    metrics: list[dict]

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
                                f"federate --resume --out {self.path}")
        final = load_weights_only(path, "final model (final.pt)", AnalysisError)
        if not isinstance(final, dict) or not isinstance(final.get("model"), dict):
            raise AnalysisError(f"{path} is not a valid final model (final.pt): it has no 'model' entry")
        return _state_dict(final["model"], path)


def _state_dict(obj, path: Path) -> dict:
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise AnalysisError(f"{path} does not hold a state dict of tensors")
    return obj


def load_run(path: str | Path) -> Run:
    path = Path(path)
    config_path, metrics_path = path / "config.json", path / "metrics.jsonl"
    if not config_path.is_file() or not metrics_path.is_file():
        raise AnalysisError(f"{path} is not a federate run directory (no config.json / metrics.jsonl); "
                            f"make one with federate --out {path}")
    try:
        record = json.loads(config_path.read_text())["config"]
        config = FederateConfig.from_dict(record["federate"])
    except (KeyError, TypeError, ValueError) as exc:
        raise AnalysisError(f"{config_path}: unreadable ({exc}); re-run federate into a new "
                            f"directory") from None
    metrics, _ = read_jsonl(metrics_path, AnalysisError)  # a torn last line (a crashed run) is left out
    if not metrics:
        raise AnalysisError(f"{path}: no finished round in metrics.jsonl; run or resume it first")
    missing = missing_steps(metrics, _rounds_done(path, metrics))
    if missing:  # a finished run whose last line was torn, or a line lost: never read as a shorter run
        raise AnalysisError(f"{metrics_path} has no line for round(s) {step_ranges(missing)} of a run that "
                            f"finished them; their metrics are lost: re-run federate into a new directory")
    return Run(path, path.name, config, metrics)


def _rounds_done(path: Path, metrics: list[dict]) -> int:
    """The rounds the run finished: those of the config final.pt was written with (only once its last round
    was), else the last round logged."""
    final = path / "final.pt"
    if final.is_file():
        record = load_weights_only(final, "final model (final.pt)", AnalysisError)
        try:
            return int(record["config"]["federate"]["rounds"])
        except (KeyError, TypeError, ValueError):
            raise AnalysisError(f"{final} has no federate config; re-run federate") from None
    return max(int(r["round"]) for r in metrics)


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
