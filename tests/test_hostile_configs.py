"""Issue 42: the hostile-value table over config files, generated from the config dataclasses.

Every key a ``--config`` file may hold (the fields of federate's [federate] table with the partition
settings, its [run] table, [federate.tracking], and pretrain's [pretrain] and [run] tables) gets values of
every wrong JSON type: a list, a table, a string, a boolean, null, a huge number, NaN and a negative number.
Each case must end with exit code 2 and one line on stderr without a traceback, or be accepted up to where
the command starts its work (a sentinel replaces training). The default suite checks a seeded sample; the
slow test the whole table, and prints its counts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from collections import Counter
from pathlib import Path

import pytest

from tests.test_robustness import FED, PRE

WRONG = {"list": [1], "table": {"a": 1}, "string": "x", "bool": True, "null": None, "huge": 1e30,
         "nan": "nan", "negative": -1}
SAMPLE = 40  # cases in the default suite


class Accepted(BaseException):
    """Raised by the sentinel that replaces a command's work."""


def _tables() -> list[tuple[str, str, str]]:
    """(command, table path, key) for every key a config file may set."""
    from federated.experiment import FederateConfig, RunOptions
    from federated.flags import plugin_settings_classes
    from federated.oracle.tracking import TrackConfig
    from pretrain.recipe import PretrainConfig
    from pretrain.recipe import RunOptions as PretrainRunOptions

    def keys(*classes):
        return sorted({f.name for c in classes for f in dataclasses.fields(c)
                       if not f.metadata.get("internal")})
    return ([("federate", "federate", k) for k in keys(FederateConfig, *plugin_settings_classes())
             if k != "tracking"]
            + [("federate", "federate.tracking", k) for k in keys(TrackConfig)]
            + [("federate", "run", k) for k in keys(RunOptions)]
            + [("pretrain", "pretrain", k) for k in keys(PretrainConfig)]
            + [("pretrain", "run", k) for k in keys(PretrainRunOptions)])


CASES = [(cmd, table, key, kind) for cmd, table, key in _tables() for kind in WRONG]


def _body(table: str, key: str, value) -> dict:
    body: dict = {}
    node = body
    for part in table.split("."):
        node = node.setdefault(part, {})
    node[key] = value
    return body


def _run(tmp_path: Path, capsys, monkeypatch, case) -> str:
    """'refused' or 'accepted'; fails the test on a traceback, a multi-line error or another exit code."""
    from federated import runner
    from federated.cli import main as federate
    from pretrain import cli as pretrain_cli

    def sentinel(*args, **kwargs):
        raise Accepted
    monkeypatch.setattr(runner, "run", sentinel)
    monkeypatch.setattr(pretrain_cli, "train", sentinel)
    command, table, key, kind = case
    path = tmp_path / "c.json"
    path.write_text(json.dumps(_body(table, key, WRONG[kind])))
    argv = (["fps", "--config", str(path), *PRE, "--out", str(tmp_path / "p.ckpt")] if command == "pretrain"
            else ["--config", str(path), *FED, "--out", str(tmp_path / "r")])
    try:
        code = (pretrain_cli.main if command == "pretrain" else federate)(argv)
    except Accepted:
        return "accepted"
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (case, code, err)
    return "refused"


@pytest.mark.parametrize("case", random.Random(os.environ.get("FPSFL_HOSTILE_SEED", "0")).sample(
    CASES, SAMPLE), ids=lambda c: "-".join(c))
def test_a_sample_of_hostile_config_values(tmp_path, capsys, monkeypatch, case):
    _run(tmp_path, capsys, monkeypatch, case)


@pytest.mark.slow
def test_every_hostile_config_value(tmp_path, capsys, monkeypatch):
    counts = Counter()
    for i, case in enumerate(CASES):
        folder = tmp_path / str(i)
        folder.mkdir()
        counts[_run(folder, capsys, monkeypatch, case)] += 1
    print(f"\nhostile config values: {len(CASES)} cases, {counts['refused']} refused in one line, "
          f"{counts['accepted']} accepted")
    assert sum(counts.values()) == len(CASES)
