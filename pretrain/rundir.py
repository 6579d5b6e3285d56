"""The run directory of a pre-training run: ``config.json``, ``metrics.jsonl`` and ``state.pt``.

``config.json`` holds the fully resolved config plus how and where the run was made (code version, torch,
device); ``metrics.jsonl`` has one JSON line per finished epoch; ``state.pt`` is the training state that
``--resume`` needs. Every file is loadable without running code (JSON, or ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import json
import platform
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

import torch

from .checkpoint import atomic_save, plain
from .config import RunOptions
from .methods import Method

STATE = "state.pt"


class RunDirError(ValueError):
    """A run directory that cannot be used as asked; the message is one line."""


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


class RunDir:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.config_path, self.metrics_path = self.path / "config.json", self.path / "metrics.jsonl"
        self.state_path = self.path / STATE

    def create(self, config: dict, opts: RunOptions) -> int:
        """Start a new run here; refuses a directory that already holds one. Returns the first epoch (0)."""
        if self.state_path.exists() or self.metrics_path.exists():
            raise RunDirError(f"{self.path} already holds a run; pass --resume to continue it, or choose "
                              f"another --out / --run-dir")
        self.path.mkdir(parents=True, exist_ok=True)
        record = {"config": plain(config), "run": plain({k: str(v) for k, v in asdict(opts).items()}),
                  "code_version": code_version(), "torch": torch.__version__,
                  "python": platform.python_version(), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        self._write_text(self.config_path, json.dumps(record, indent=2) + "\n")
        return 0

    def resume(self, config: dict, method: Method, optimizer: torch.optim.Optimizer) -> int:
        """Load ``state.pt`` into the method and optimiser; returns the first epoch still to run."""
        if not self.state_path.is_file():
            raise RunDirError(f"--resume: no training state at {self.state_path} (nothing to resume)")
        saved = json.loads(self.config_path.read_text())["config"]
        differs = sorted(k for k in ("pretrain", "method") if saved.get(k) != plain(config[k]))
        if differs:
            raise RunDirError(f"--resume: the {' and '.join(differs)} config differs from the one in "
                              f"{self.config_path}; resume with the same settings or start a new run")
        state = torch.load(self.state_path, map_location="cpu", weights_only=True)
        method.load_state_dict(state["model"])
        method.load_extra_state(state["extra"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        self._truncate_metrics(state["epoch"])
        return int(state["epoch"])

    def save_state(self, epochs_done: int, method: Method, optimizer: torch.optim.Optimizer) -> None:
        atomic_save({"epoch": epochs_done, "model": method.state_dict(), "extra": method.extra_state(),
                     "optimizer": optimizer.state_dict(), "rng": torch.get_rng_state()}, self.state_path)

    def append_metrics(self, record: dict) -> None:
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def metrics(self) -> list[dict]:
        if not self.metrics_path.exists():
            return []
        return [json.loads(line) for line in self.metrics_path.read_text().splitlines() if line.strip()]

    def last_metrics(self) -> dict:
        rows = self.metrics()
        return rows[-1] if rows else {}

    def _truncate_metrics(self, epochs_done: int) -> None:
        """Drop lines of epochs after the saved state (a crash between the two writes)."""
        rows = [r for r in self.metrics() if r["epoch"] <= epochs_done]
        self._write_text(self.metrics_path, "".join(json.dumps(r) + "\n" for r in rows))

    @staticmethod
    def _write_text(path: Path, text: str) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
