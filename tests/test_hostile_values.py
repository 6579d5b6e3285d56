"""Issue 31: every flag of every command against hostile values, generated from the parsers.

For each flag (and positional argument) of fractals, pretrain, federate, federate export-partitions, analyze
and fpsfl, the values its type allows a user to type badly: NaN, +-inf, negative, zero, a huge integer,
empty; for text flags (paths among them) also an existing file, an existing folder, an unwritable path and
a missing one. Each case must end with exit code 2 and one line on stderr without a traceback, or be
accepted. A refused case changes neither the existing file nor the existing folder's files it was given;
an accepted one may write the file (it was asked to) but never changes the folder's files.

Up to where each command starts its work (a sentinel replaces the work function: training, the round loop,
rendering, probing), the default suite checks a seeded sample of each command's cases and a slow test the
whole table. Another slow test runs every case the table accepts for real on a tiny base command (one epoch
or round), which must exit 0, or 1 or 2 with one line, within its time limit. Each prints its table and
counts.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import random
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

HUGE = "1" + "0" * 30  # beyond int64 and float32
UNWRITABLE = "/proc/fpsfl-hostile/x"
INT_VALUES = ("nan", "inf", "-inf", "-1", "0", HUGE, "")
FLOAT_VALUES = ("nan", "inf", "-inf", "-1", "0", "1e308", "")
CHOICE_VALUES = ("", "bogus")
PATHS = ("", "FILE", "DIR", UNWRITABLE, "MISSING/x")  # FILE, DIR and MISSING are made per case
CASE_SECONDS = 120  # the slow table: a case that runs longer hangs
SAMPLE = 6  # cases a command in the default suite's sample
SEED = os.environ.get("FPSFL_HOSTILE_SEED", "0")


class Accepted(BaseException):
    """Raised by the sentinel that replaces a command's work: the input got through validation."""


class CaseTimeout(BaseException):
    pass


@dataclass(frozen=True)
class Command:
    name: str  # as typed: "pretrain fps"
    sub: tuple[str, ...]  # the subcommand words
    base: Callable[[Path, dict], list[str]]  # a valid tiny invocation's arguments after ``sub``, in a folder
    cuts: tuple[tuple[str, str], ...]  # (module, attribute): the work the fast table replaces
    runs: bool = True  # the slow table runs its accepted cases (not the demo: minutes each)


def _parser_of(command: Command) -> argparse.ArgumentParser:
    from analysis.cli import build_parser as analyze
    from federated.cli import build_export_parser
    from federated.cli import build_parser as federate
    from fpsfl.demo.cli import build_parser as fpsfl
    from fractals.cli import build_parser as fractals
    from pretrain.cli import build_parser as pretrain

    if command.name == "federate export-partitions":
        return build_export_parser()
    parser = {"fractals": fractals, "pretrain": pretrain, "federate": federate, "analyze": analyze,
              "fpsfl": fpsfl}[command.name.split()[0]]()
    for word in command.sub:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


def _kind(action: argparse.Action) -> str:
    """int, float, choice, switch or text: what hostile values the flag gets."""
    if action.nargs == 0:
        return "switch"
    if action.choices is not None:
        return "choice"
    if action.type in (int, float):
        return action.type.__name__
    if action.type is not None:
        for sample, kind in (("7", "int"), ("0.5", "float")):
            try:
                value = action.type(sample)
            except (ValueError, TypeError, argparse.ArgumentTypeError):
                continue
            element = value[0] if isinstance(value, tuple) and value else value
            if isinstance(element, int) and not isinstance(element, bool) and kind == "int":
                return "int"
            if isinstance(element, float) and kind == "float":
                return "float"
    return "text"


VALUES = {"int": INT_VALUES, "float": FLOAT_VALUES, "choice": CHOICE_VALUES, "switch": (None,), "text": PATHS}
SKIP = {"-h", "--help"}


BASE = ("", None)  # the base invocation itself: it must get through, or the cases would test nothing


def cases(command: Command) -> list[tuple[str, str | None]]:
    """(flag or positional name, value) of every hostile case of ``command``, after :data:`BASE`."""
    out = [BASE]
    for action in _parser_of(command)._actions:
        if isinstance(action, argparse._SubParsersAction) or set(action.option_strings) & SKIP:
            continue
        name = action.option_strings[-1] if action.option_strings else f"<{action.dest}>"
        out += [(name, value) for value in VALUES[_kind(action)]]
    return out


# ---- the commands and their tiny base invocations ---------------------------------------------------------
PRE = ["--arch", "resnet20", "--width", "0.25", "--size", "16", "--epochs", "1", "--batch-size", "4",
       "--device", "cpu", "--quiet"]
FED = ["--width", "0.25", "--clients", "2", "--rounds", "1", "--local-epochs", "1", "--batch-size", "64",
       "--device", "cpu", "--quiet", "--no-eval-local"]


def _pre(extra: list[str]) -> Callable[[Path, dict], list[str]]:
    return lambda d, fx: [*PRE, *[fx.get(a, a) for a in extra], "--out", str(d / "o.ckpt")]


COMMANDS = [
    Command("fractals bank", ("bank",), lambda d, fx: ["--n", "4", "--out", str(d / "b.npz")], ()),
    Command("fractals preview", ("preview",),
            lambda d, fx: ["--n", "2", "--size", "16", "--out", str(d / "p.png")], ()),
    Command("fractals stats", ("stats",), lambda d, fx: ["--pairs", "2", "--size", "16"], ()),
    Command("fractals bench", ("bench",), lambda d, fx: ["--pairs", "4", "--size", "16"],
            (("fractals.cli", "measure"),)),
    Command("pretrain fps", ("fps",), _pre(["--pairs-per-epoch", "8"]), (("pretrain.cli", "train"),)),
    Command("pretrain fractal-simsiam", ("fractal-simsiam",), _pre(["--pairs-per-epoch", "8"]),
            (("pretrain.cli", "train"),)),
    Command("pretrain multilabel", ("multilabel",), _pre(["--pairs-per-epoch", "8", "--classes", "4"]),
            (("pretrain.cli", "train"),)),
    Command("pretrain images", ("images",), _pre(["--root", "IMAGES"]), (("pretrain.cli", "train"),)),
    Command("pretrain supervised", ("supervised",), _pre(["--root", "IMAGES"]),
            (("pretrain.cli", "train"),)),
    Command("federate", (), lambda d, fx: [*FED, "--out", str(d / "r")],
            (("federated.runner", "run"), ("federated.flower", "run"))),
    Command("federate export-partitions", (),
            lambda d, fx: ["--clients", "2", "--quiet", "--out", str(d / "shards")],
            (("federated.cli", "export_shards"),)),
    Command("analyze dynamics", ("dynamics",), lambda d, fx: [fx["RUN"], "--out", str(d / "a")], ()),
    Command("analyze convex", ("convex",), lambda d, fx: [fx["RUN"], "--out", str(d / "a")], ()),
    Command("analyze variance", ("variance",), lambda d, fx: [fx["RUN"], "--out", str(d / "a")], ()),
    Command("analyze report", ("report",), lambda d, fx: [fx["RUN"], "--out", str(d / "a")], ()),
    Command("analyze landscape", ("landscape",),
            lambda d, fx: [fx["RUN"], fx["RUN2"], fx["RUN3"], "--grid", "2", "--eval-samples", "16",
                           "--device", "cpu", "--out", str(d / "a")], (("analysis.landscape", "rebuild"),)),
    Command("analyze probe", ("probe",), lambda d, fx: [fx["CKPT"], "--device", "cpu", "--out",
                                                              str(d / "a")], (("analysis.probe", "probe"),)),
    Command("analyze budget", ("budget",), lambda d, fx: [fx["CKPT"], "--device", "cpu", "--out",
                                                                str(d / "a")],
            (("analysis.budget", "budget_points"),)),
    Command("fpsfl demo", ("demo",), lambda d, fx: ["--budget", "smoke", "--device", "cpu", "--out",
                                                          str(d / "demo")],
            (("fpsfl.demo.cli", "run_steps"),), runs=False),
]


def _main(command: Command) -> Callable[[list[str]], int]:
    from analysis.cli import main as analyze
    from federated.cli import main as federate
    from fpsfl.demo.cli import main as fpsfl
    from fractals.cli import main as fractals
    from pretrain.cli import main as pretrain

    mains = {"fractals": fractals, "pretrain": pretrain, "federate": federate, "analyze": analyze,
             "fpsfl": fpsfl}
    main = mains[command.name.split()[0]]
    prefix = ["export-partitions"] if command.name == "federate export-partitions" else list(command.sub)
    return lambda argv: main([*prefix, *argv])


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> dict[str, str]:
    """What the base commands read: an image folder, three finished tracked runs, a checkpoint."""
    import numpy as np
    import torch
    from PIL import Image

    from federated.cli import main as federate
    from fpsfl.base.checkpoint import atomic_save, make_checkpoint, save_checkpoint
    from pretrain.backbones import create_backbone

    root = tmp_path_factory.mktemp("fixtures")
    for c in ("a", "b"):
        (root / "images" / c).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(np.full((20, 20, 3), 30 * i + 50 * (c == "b"), np.uint8)).save(
                root / "images" / c / f"{i}.png")
    base = [a for a in FED if a != "--no-eval-local"]  # dynamics reads the local accuracies
    assert federate(["--out", str(root / "run0"), *base, "--rounds", "2", "--track", "convex,variance",
                     "--track-every", "1", "--variance-samples", "2", "--convex-epochs", "1"]) == 0
    for seed in (1, 2):  # the landscape's other corners: the run with its final model moved at random
        shutil.copytree(root / "run0", root / f"run{seed}")
        final = torch.load(root / f"run{seed}" / "final.pt", weights_only=True)
        g = torch.Generator().manual_seed(seed)
        final["model"] = {k: v + 0.1 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
                          for k, v in final["model"].items()}
        atomic_save(final, root / f"run{seed}" / "final.pt")
    runs = [str(root / f"run{seed}") for seed in range(3)]
    ckpt = make_checkpoint(create_backbone("resnet20", 0.25), arch="resnet20", width=0.25, method="simsiam",
                           source="fps", epoch=1, config={"pretrain": {"size": 16, "pairs_per_epoch": 8}})
    save_checkpoint(ckpt, root / "c.ckpt")
    return {"IMAGES": str(root / "images"), "RUN": runs[0], "RUN2": runs[1], "RUN3": runs[2],
            "CKPT": str(root / "c.ckpt")}


def _argv(command: Command, case: tuple[str, str | None], folder: Path, fx: dict) -> list[str]:
    flag, value = case
    if value is not None:
        value = {"FILE": str(folder / "a-file"), "DIR": str(folder / "a-dir"),
                 "MISSING/x": str(folder / "missing" / "x")}.get(value, value)
    base = command.base(folder, fx)
    if case == BASE:
        return base
    if flag.startswith("<"):  # a positional: replaces the base's first
        positional = next(i for i, a in enumerate(base) if not a.startswith("-"))
        return [*base[:positional], value, *base[positional + 1:]]
    return [*base, flag] if value is None else [*base, flag, value]


def _precious(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "a-file").write_text("precious")
    (folder / "a-dir").mkdir()
    (folder / "a-dir" / "keep").write_text("kept")


def _intact(folder: Path, file: bool = True) -> bool:
    kept = folder / "a-dir" / "keep"
    return kept.is_file() and kept.read_text() == "kept" and (
        not file or (folder / "a-file").is_file() and (folder / "a-file").read_bytes() == b"precious")


def run_case(command: Command, case, folder: Path, fx: dict, capsys, cut: bool) -> tuple[str, str]:
    """(outcome, detail): "refused" (exit 2, one line), "accepted" (the sentinel, or exit 0 when run), "ran"
    (exit 1 with one line: a run that cannot go on); anything else is a finding and fails."""
    _precious(folder)
    argv = _argv(command, case, folder, fx)
    main = _main(command)
    patches = contextlib.ExitStack()
    with patches:
        if cut:
            mp = patches.enter_context(pytest.MonkeyPatch.context())
            for module, attr in command.cuts:
                mp.setattr(f"{module}.{attr}", _sentinel)
        else:
            patches.enter_context(_one_step())
        signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(CASE_SECONDS)
        try:
            code = main(argv)
        except Accepted:
            code = "accepted"
        except CaseTimeout:
            code = "timeout"
        except (Exception, SystemExit) as exc:  # a traceback: a finding
            code = f"raised {type(exc).__name__}: {' '.join(str(exc).split())[:150]}"
        finally:
            signal.alarm(0)
    captured = capsys.readouterr()
    err = captured.err.strip()
    lines = [line for line in err.splitlines() if "note:" not in line]
    if code == "accepted" or code == 0:  # asked to write an existing file, it may; the folder's files stay
        return ("accepted", "") if _intact(folder, file=False) else ("FINDING", "changed the folder's files")
    if not _intact(folder):
        return "FINDING", "refused, but changed the existing file or folder it was given"
    if code not in (1, 2) or "Traceback" in err or len(lines) != 1:
        last = err.strip().splitlines()[-1] if err.strip() else ""
        return "FINDING", f"{code}: {len(lines)} lines: {last[:200]}"
    return ("refused" if code == 2 else "stopped"), lines[0][:150]


def _sentinel(*args, **kwargs):
    raise Accepted


def _alarm(signum, frame):
    raise CaseTimeout


@contextlib.contextmanager
def _one_step():
    """The slow table's runs stop after one epoch or round (RunFlags.stop_after)."""
    import federated.runner as runner
    import pretrain.cli as pcli

    train, run = pcli.train, runner.run
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pcli, "train", lambda cfg, opts: train(cfg, dataclasses.replace(opts, stop_after=1)))
        mp.setattr(runner, "run", lambda cfg, opts, *a, **k: run(cfg, dataclasses.replace(opts, stop_after=1),
                                                                 *a, **k))
        yield


def _table(commands: list[Command], tmp_path: Path, fx: dict, capsys, cut: bool,
           sample: int | None = None) -> Counter:
    counts: Counter = Counter()
    lines, seconds = [], {}
    for command in commands:
        t0 = time.perf_counter()
        every = list(enumerate(cases(command)))
        if sample is not None:
            every = every[:1] + sorted(random.Random(f"{SEED}:{command.name}").sample(every[1:], sample))
        for i, case in every:
            if not cut and not command.runs:
                continue
            if not cut and _fast_outcome(command, case) != "accepted":
                continue  # refused at validation: nothing to run
            outcome, detail = run_case(command, case, tmp_path / f"{command.name.replace(' ', '-')}-{i}",
                                       fx, capsys, cut)
            if case == BASE and outcome != "accepted":
                outcome, detail = "FINDING", f"the base invocation does not get through: {detail}"
            counts[outcome] += 1
            lines.append(f"{command.name:28s} {case[0]:22s} {case[1]!s:12.12s} {outcome:8s} {detail}")
        seconds[command.name] = time.perf_counter() - t0
    with capsys.disabled():
        print("\n" + "\n".join(lines))
        kind = "validation" if cut else "runs"
        print(f"hostile-value table ({kind}{f', {sample} a command, seed {SEED}' if sample else ''}): "
              f"{sum(counts.values())} cases, "
              + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
        print("seconds per command: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()))
    findings = [line for line in lines if " FINDING " in line]
    assert not findings, "\n".join(findings)
    return counts


_FAST: dict = {}


def _fast_outcome(command: Command, case) -> str:
    return _FAST.get((command.name, case), "accepted")


def test_a_sample_of_hostile_values_up_to_the_work(tmp_path, fixtures, capsys):
    """SAMPLE cases of each command, seeded (FPSFL_HOSTILE_SEED, printed): the default suite's part."""
    counts = _table(COMMANDS, tmp_path, fixtures, capsys, cut=True, sample=SAMPLE)
    assert counts["refused"] > 0 and sum(counts.values()) == (SAMPLE + 1) * len(COMMANDS)


@pytest.mark.slow
def test_every_flag_against_hostile_values_up_to_the_work(tmp_path, fixtures, capsys):
    counts = _table(COMMANDS, tmp_path, fixtures, capsys, cut=True)
    assert counts["refused"] > 0 and sum(counts.values()) == sum(len(cases(c)) for c in COMMANDS)


@pytest.mark.slow
def test_every_accepted_hostile_value_runs_sanely(tmp_path, fixtures, capsys):
    for command in COMMANDS:  # the fast table first: what it refuses needs no run
        for i, case in enumerate(cases(command)):
            outcome, _ = run_case(command, case, tmp_path / "fast" / f"{command.name.replace(' ', '-')}-{i}",
                                  fixtures, capsys, cut=True)
            _FAST[(command.name, case)] = outcome
    _table(COMMANDS, tmp_path / "runs", fixtures, capsys, cut=False)
