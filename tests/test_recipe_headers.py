"""A recipe's header states the paper's setting in prose; this checks the prose against the commands the
recipe really runs (issue 41), so the two cannot drift apart again.

Each recipe runs at SCALE=paper with ``federate``, ``pretrain`` and ``analyze`` replaced by stand-ins on PATH
that only record their arguments. Every plain ``federate`` call is parsed by federate's own parser into the
FederateConfig it would train with (dataset presets resolved), each ``federate self-pretrain`` call into its
SelfPretrainConfig. Then every value the header's paper-setting sentences name ("100 rounds x 5 local epochs",
"SGD lr 0.01", "Dir(0.3)", "batch 32", ...) must be one that some call of the recipe runs with: a header that
says lr 0.01 over a recipe passing 0.1 fails, and so does one whose recipe never runs the stated value.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from federated.cli import build_parser, config_from
from federated.datasets import DATASETS
from federated.partitions import PARTITIONS
from federated.selfsup.cli import build_parser as self_pretrain_parser
from federated.selfsup.cli import configs_from

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
START = re.compile(r"(?:paper's|default)(?: federated)? setting")
# a sentence naming one of these starts another part of the header: pre-training, departures, data, cost
ENDS = ("FPS:", "SP:", "Every pre-training", "Departures", "Declared", "GPU time", "Data:", "EXTRA=",
        "Each method's own", "ImageNet:", "Real:", "The \"without SP\"")
NUMBER = r"(\d+(?:\.\d+)?(?:e-?\d+)?)"
ARCHS = {"MobileNet-V2": "mobilenet_v2"}


def _arch(name: str) -> str:
    return ARCHS.get(name, name.lower())


def _alpha(cfg) -> float | None:
    return cfg.partition_args["alpha"] if cfg.partition == "dirichlet" else None


def _clients(cfg):
    """The run's client count; ... where the data's own client ids decide it (Cityscapes' cities, GEO's
    regions), which the commands do not state."""
    return ... if PARTITIONS[cfg.partition].by_id else cfg.clients


def _size(cfg) -> int:
    return cfg.input_size or DATASETS[cfg.dataset].input_size


# (what, pattern in the header's setting sentences, the value a FederateConfig runs, header text -> value)
FEDERATED = [
    ("rounds", rf"{NUMBER} rounds x \d+ local epochs", lambda c: c.rounds, int),
    ("local epochs", rf"\d+ rounds x {NUMBER} local epochs", lambda c: c.local_epochs, int),
    ("optimizer", r"\b(SGD|Adam) lr", lambda c: c.resolved_optimizer().lower(), str.lower),
    ("lr", rf"(?:SGD|Adam) lr {NUMBER}", lambda c: c.resolved_lr(), float),
    ("momentum", rf"momentum {NUMBER}", lambda c: c.momentum, float),
    ("weight decay", rf"weight decay {NUMBER}", lambda c: c.weight_decay, float),
    ("batch", rf"batch {NUMBER}", lambda c: c.resolved_batch(), int),
    ("lr decay", rf"lr x{NUMBER} every \d+ rounds", lambda c: c.lr_decay, float),
    ("lr decay every", rf"lr x[\d.]+ every {NUMBER} rounds", lambda c: c.lr_decay_every, int),
    ("clients", rf"\b{NUMBER} clients\b(?! and \d+%)", _clients, int),
    ("participation %", rf"{NUMBER}% (?:client )?participation", lambda c: c.participation * 100, float),
    ("participation %", rf"{NUMBER}% clients per round", lambda c: c.participation * 100, float),
    ("alpha", rf"Dir\({NUMBER}\)", _alpha, float),
    ("alpha", rf"α = {NUMBER}", _alpha, float),
    ("arch", r"\b(ResNet\d+|MobileNet-V2)\b", lambda c: c.arch, _arch),
    ("input px", rf"\bat {NUMBER} px", _size, int),
    ("input px", rf"\bon {NUMBER} x \d+ images", _size, int),
    ("held out %", rf"{NUMBER}% of the training set held out", lambda c: c.val_fraction * 100, float),
]
# the same for the self-pre-training sentence ("SP: ...") against federate self-pretrain's config
SELF_PRETRAINING = [
    ("SP rounds", rf"\b{NUMBER} rounds\b", lambda c: c.rounds, int),
    ("SP local epochs", rf"{NUMBER} local epochs a round", lambda c: c.local_epochs, int),
    ("SP lr", rf"\blr {NUMBER}", lambda c: c.lr, float),
    ("SP batch", rf"batch {NUMBER}", lambda c: c.batch_size, int),
]

# the FPS pre-training sentence ("FPS: ... 100 epochs x 1M pairs, batch 256") against `pretrain fps` calls


def _pairs(text: str) -> int:
    return int(float(text[:-1]) * {"K": 1_000, "M": 1_000_000}[text[-1]]) if text[-1] in "KM" else int(text)


def _flag(name: str, default: str | None = None):
    return lambda argv: int(argv[len(argv) - 1 - argv[::-1].index(name) + 1]) if name in argv else default


PRETRAINING = [
    ("FPS epochs", r"(\d+) epochs x [\d.]+[KM]? pairs", _flag("--epochs"), int),
    ("FPS pairs an epoch", r"\d+ epochs x ([\d.]+[KM]?) pairs", _flag("--pairs-per-epoch"), _pairs),
    ("FPS batch", rf"pairs, batch {NUMBER}", _flag("--batch-size"), int),
]


def header(path: Path) -> str:
    """The recipe's leading comment as one line of prose."""
    lines = []
    for line in path.read_text().splitlines()[1:]:
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def part(text: str, start: re.Pattern | str) -> str:
    """The header from ``start`` to the next sentence that starts another part ('' without ``start``)."""
    found = re.search(start, text) if isinstance(start, re.Pattern) else None
    at = found.start() if found else text.find(start) if isinstance(start, str) else -1
    if at < 0:
        return ""
    ends = [i for i in (text.find(e, at + 1) for e in ENDS) if i > at]
    return text[at:min(ends, default=len(text))]


def stated(text: str, checks: list) -> list[tuple[str, object, object]]:
    """(what, value, getter) for every value the prose states."""
    return [(what, convert(m.group(1)), get) for what, pattern, get, convert in checks
            for m in re.finditer(pattern, text)]


def recipes_with_a_setting() -> list[str]:
    return sorted(p.name for p in RECIPES.glob("*.sh") if START.search(header(p)) and p.name != "common.sh")


def run_with_stand_ins(name: str, tmp: Path) -> list[list[str]]:
    """The argument lists of every federate / pretrain / analyze call the recipe makes at SCALE=paper."""
    bin_dir, log = tmp / "bin", tmp / "calls.jsonl"
    bin_dir.mkdir()
    for command in ("federate", "pretrain", "analyze"):
        stand_in = bin_dir / command
        record = "json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]])"
        stand_in.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                            f"with open({str(log)!r}, 'a') as f:\n    f.write({record} + '\\n')\n")
        stand_in.chmod(0o755)
    env = {**os.environ, "SCALE": "paper", "OUT": str(tmp / "runs"), "DATA": str(tmp / "data"), "SEEDS": "0",
           "DEVICE": "cpu", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]])}
    done = subprocess.run(["bash", str(RECIPES / name)], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp)
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_the_check_covers_the_papers_tables_and_figures():
    names = recipes_with_a_setting()
    for recipe in ("table2_cifar10.sh", "table3_tinyimagenet.sh", "table4_inat_geo.sh",
                   "table5_cityscapes.sh", "table6_synthetic.sh", "table7_self_pretraining.sh",
                   "fig3_settings.sh", "fig4_algorithms.sh"):
        assert recipe in names
    text = header(RECIPES / "table2_cifar10.sh")
    found = {what: value for what, value, _ in stated(part(text, START), FEDERATED)}
    assert found == {"rounds": 100, "local epochs": 5, "optimizer": "sgd", "lr": 0.01, "momentum": 0.9,
                     "weight decay": 1e-4, "batch": 32, "lr decay": 0.1, "lr decay every": 30, "clients": 10,
                     "participation %": 100.0, "alpha": 0.3, "arch": "resnet20", "input px": 32,
                     "held out %": 2.0}


def test_a_drifted_header_is_caught():
    """The check can fail: a header that says lr 0.1 over Table 2's commands (lr 0.01) is reported."""
    text = part(header(RECIPES / "table2_cifar10.sh"), START).replace("SGD lr 0.01", "SGD lr 0.1")
    cfg = config_from(build_parser().parse_args(["--dataset", "cifar10", "--alpha", "0.3"]))
    assert [what for what, value, get in stated(text, FEDERATED) if get(cfg) != value] == ["lr"]


@pytest.mark.parametrize("name", recipes_with_a_setting())
def test_every_value_a_header_states_is_one_its_commands_run(tmp_path, name):
    calls = run_with_stand_ins(name, tmp_path)
    plain = [c[1:] for c in calls if c[0] == "federate" and c[1:2] not in (["self-pretrain"],
                                                                        ["export-partitions"])]
    federated = [config_from(build_parser().parse_args(argv)) for argv in plain]
    self_pretraining = [configs_from(self_pretrain_parser().parse_args(c[2:]))[1] for c in calls
                        if c[:2] == ["federate", "self-pretrain"]]
    text = header(RECIPES / name)
    assert federated, f"{name} runs no federate command"
    wrong = [f"{what} {value} (the commands run {sorted({str(get(c)) for c in federated})})"
             for what, value, get in stated(part(text, START), FEDERATED)
             if value not in {get(c) for c in federated} and {get(c) for c in federated} != {...}]
    sp = part(text, "SP:")
    if sp:
        assert self_pretraining, f"{name}: the header states a self-pre-training its commands do not run"
        wrong += [f"{what} {value} (the commands run {sorted({str(get(c)) for c in self_pretraining})})"
                  for what, value, get in stated(sp, SELF_PRETRAINING)
                  if value not in {get(c) for c in self_pretraining}]
    fps = part(text, "FPS:")
    pretrainings = [c[2:] for c in calls if c[:2] == ["pretrain", "fps"]]
    for what, value, get in stated(fps, PRETRAINING):
        if value not in {get(argv) for argv in pretrainings}:
            wrong.append(f"{what} {value} (the commands run {sorted({str(get(a)) for a in pretrainings})})")
    assert not wrong, f"{name}: the header states what no command runs: {'; '.join(wrong)}"
