"""What made each step of a demo folder (issue 42): ``OUT/demo.json`` records, for every step the demo
started there, the command's arguments and the sha256 of its ``--init`` file at the start. A step counts
as done only when its record equals what this invocation would run, so a folder of one budget's runs is
never reported under another budget's title, and a changed init file is never taken for the old one.

A folder whose finished steps have no record (made before the ledger, or by hand) is refused too: nothing
vouches for the settings behind them.
"""

from __future__ import annotations

import json
from pathlib import Path

from analysis.runs import AnalysisError
from federated.initialisation import init_sha256
from fpsfl.base.files import atomic_write

LEDGER = "demo.json"
EXECUTION = ("--device",)  # flags that choose where a step runs, not what it computes: not compared


def init_of(argv: list[str]) -> str | None:
    """The ``--init`` value of a federate step's arguments, or None."""
    return argv[argv.index("--init") + 1] if "--init" in argv else None


def record(argv: list[str]) -> dict:
    """A step's record: its arguments without the execution flags, and the digest of its --init file."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in EXECUTION:
            skip = True
        else:
            kept.append(arg)
    init = init_of(argv)
    return {"argv": kept, "init_sha256": init_sha256(init) if init is not None else None}


class Ledger:
    """``OUT/demo.json``: the records of the steps started in OUT, written before each step starts."""

    def __init__(self, out: Path, budget: str):
        self.path, self.budget = out / LEDGER, budget
        self.steps: dict[str, dict] = {}
        self.recorded_budget: str | None = None
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text())
                self.steps, self.recorded_budget = dict(data["steps"]), data.get("budget")
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise AnalysisError(f"{self.path}: unreadable ({e}); it records what made the runs in "
                                    f"{out}: choose another --out") from None

    def check(self, name: str, argv: list[str], finished: bool, run: Path) -> None:
        """Refuse (one line) a step whose recorded settings or init differ from this invocation's, and a
        finished step nothing records."""
        mine, theirs = record(argv), self.steps.get(name)
        where = f"--out {self.path.parent}"
        if theirs is None:
            if finished:
                raise AnalysisError(f"{where}: step '{name}' finished in {run} but {LEDGER} does not record "
                                    f"its settings; choose another --out")
            return
        if theirs.get("argv") != mine["argv"]:
            budget = f" (the {self.recorded_budget} budget's)" if self.recorded_budget != self.budget else ""
            raise AnalysisError(f"{where}: step '{name}' was run there with other settings{budget}; choose "
                                f"another --out, or remove {run} to run it again")
        if finished and theirs.get("init_sha256") != mine["init_sha256"]:
            raise AnalysisError(f"{where}: step '{name}' was trained from another --init file than "
                                f"{init_of(argv)} is now; remove {run} to run it again")

    def start(self, name: str, argv: list[str]) -> None:
        """Record a step just before it starts (its init file is final by then)."""
        self.steps[name] = record(argv)
        body = {"budget": self.budget, "steps": self.steps}
        atomic_write(self.path, lambda tmp: tmp.write_text(json.dumps(body, indent=1) + "\n"))
