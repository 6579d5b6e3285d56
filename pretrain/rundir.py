"""A run directory: ``config.json``, ``metrics.jsonl`` and the ``--resume`` state (``state.pt``).

Shared by ``pretrain`` and ``federate``. ``config.json`` holds the fully resolved config plus how and where
the run was made (code version, torch, options); ``metrics.jsonl`` has one JSON line per finished epoch or
round; ``state.pt`` is the training state that ``--resume`` needs. Every file is loadable without running
code (JSON, or ``torch.load(weights_only=True)``), and every write is atomic.
"""

from __future__ import annotations

import json
import platform
import subprocess
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import torch

from .checkpoint import atomic_save, plain

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

    def ensure_new(self) -> None:
        """Refuse a directory that already holds a run, so that nothing is overwritten."""
        if self.state_path.exists() or self.metrics_path.exists():
            raise RunDirError(f"{self.path} already holds a run; pass --resume to continue it, or choose "
                              f"another --out / --run-dir")

    def create(self, config: dict, opts: Any) -> int:
        """Start a new run here; refuses a directory that already holds one. Returns the first epoch (0)."""
        self.ensure_new()
        self.path.mkdir(parents=True, exist_ok=True)
        options = asdict(opts) if is_dataclass(opts) else dict(opts)
        record = {"config": plain(config), "run": plain({k: str(v) for k, v in options.items()}),
                  "code_version": code_version(), "torch": torch.__version__,
                  "python": platform.python_version(), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        self._write_text(self.config_path, json.dumps(record, indent=2) + "\n")
        return 0

    def load_state(self, config: dict, compare: tuple[str, ...]) -> dict:
        """The saved training state, after checking that ``config[k]`` matches the saved one for ``compare``.

        Metrics lines of epochs/rounds after the state (a crash between the two writes) are dropped.
        """
        if not self.state_path.is_file():
            raise RunDirError(f"--resume: no training state at {self.state_path} (nothing to resume)")
        saved = json.loads(self.config_path.read_text())["config"]
        differs = sorted(k for k in compare if saved.get(k) != plain(config[k]))
        if differs:
            raise RunDirError(f"--resume: the {' and '.join(differs)} config differs from the one in "
                              f"{self.config_path}; resume with the same settings or start a new run")
        state = torch.load(self.state_path, map_location="cpu", weights_only=True)
        self._truncate_metrics(int(state["done"]))
        return state

    def save_state(self, state: dict) -> None:
        """Save the training state; ``state["done"]`` counts the finished epochs or rounds."""
        atomic_save(state, self.state_path)

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

    def _truncate_metrics(self, done: int) -> None:
        rows = [r for r in self.metrics() if r.get("epoch", r.get("round", 0)) <= done]
        self._write_text(self.metrics_path, "".join(json.dumps(r) + "\n" for r in rows))

    @staticmethod
    def _write_text(path: Path, text: str) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
