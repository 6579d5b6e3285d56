"""The format of a run's ``config.json``, and the one function that brings an older record to it (issue 39).

Every run directory's ``config.json`` carries ``config_format``; a file without it is format 1 (every run
before issue 39). Readers of a record (``--config`` replay, ``--resume``'s comparison, ``analyze``) take it
through :func:`migrate`, so that a setting added or re-defaulted after a run was written replays as that run
had it, not as today's default says. Each step is plain data about the record: which settings a format did
not record, and the value every run of that format used.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

FORMAT = 13  # the config.json format this code writes
FORMAT_KEY = "config_format"  # the field of config.json that names its format

# Settings that format 1 records may lack (they came later), with the value the runs without them had: the
# partitions' balance (issue 41), deal and noise_scale (issue 30) were added with the behaviour of the code
# before them as their default, and every federate table records them (self-pre-training's too);
# pretrain's init_scale (issue 38) came after every run had trained from the He init unscaled.
_ADDED_BY_TABLE = {
    "federate": {"balance": "niid-bench", "deal": "balanced", "noise_scale": "std"},
    "pretrain": {"init_scale": 1.0},
}
# federate's own runs (not self-pre-training, whose federate table holds only the data, partition and model
# settings): amp (bf16 autocast) came with issue 26, before it every run was float32.
_ADDED_TO_FEDERATE_RUNS = {"amp": False}
# Algorithm settings whose default changed (issue 30: FedAvgM's Nesterov form, FedVC's draw once a round),
# with the behaviour before. A format-1 replay rebuilt them from today's defaults (only --set was replayed),
# so the value the run used (its resolved ``algo`` table's, else the old behaviour) is pinned into its --set.
_ALGO_BEFORE = {"fedavgm": {"nesterov": False}, "fedvc": {"draw": "epoch"}}
# Format N -> N + 1 (N >= 2): method settings added after runs of the method were written, by pre-training
# method, with the behaviour of those runs: MoCo-v2's head_bn (issue 38, format 3) came after every MoCo-v2
# head was BatchNorm-free, and its keep (format 4) after every MoCo-v2 checkpoint held the query encoder;
# the views' augmentation settings of both self-supervised methods (format 5) after every run had trained on
# MoCo-v2's views (pretrain.methods.base.ViewsConfig's defaults); every method's lr_schedule and warmup_epochs
# (format 6) after every run had trained under the cosine, unwarmed (pretrain.methods.base.MethodConfig's);
# MoCo-v2's bank_start (format 7) after every MoCo-v2 bank had started with random keys; its
# feature_uniformity (format 8) after every MoCo-v2 run had trained on InfoNCE alone; its symmetric (format 9)
# after every MoCo-v2 loss had been one-directional; the views' background_p of both self-supervised methods
# (format 10) after every view had been drawn on a black canvas; MoCo-v2's head_layers (format 12) after
# every MoCo-v2 head had been MoCo-v2's two layers; every method's last_stage_lr (format 13) after every
# backbone had trained at one rate throughout.
_VIEWS = {"crop_min": 0.2, "jitter": 1.0, "jitter_p": 0.8, "grayscale_p": 0.2, "blur_p": 0.5, "flip_p": 0.5}
_SCHEDULE = {"lr_schedule": "cosine", "warmup_epochs": 0.0}
# Format 9 -> 10 also gave the pretrain table colours (issue 38), after every FPS view had drawn its own
# colours; format 10 -> 11 its flips, after every FPS view had drawn its own flip of each fractal.
_PRETRAIN_ADDED = {9: {"colours": "own"}, 10: {"flips": "own"}}
_METHOD_ADDED = {2: {"mocov2": {"head_bn": False}}, 3: {"mocov2": {"keep": "query"}},
                 4: {"simsiam": _VIEWS, "mocov2": _VIEWS},
                 5: {m: _SCHEDULE for m in ("simsiam", "mocov2", "multilabel", "supervised")},
                 6: {"mocov2": {"bank_start": "random"}}, 7: {"mocov2": {"feature_uniformity": 0.0}},
                 8: {"mocov2": {"symmetric": False}},
                 9: {"simsiam": {"background_p": 0.0}, "mocov2": {"background_p": 0.0}}, 10: {},
                 11: {"mocov2": {"head_layers": 2}},
                 12: {m: {"last_stage_lr": 1.0} for m in ("simsiam", "mocov2", "multilabel", "supervised")}}


class FormatError(ValueError):
    """A record this code cannot read; the message is one line (exit code 2)."""


def migrate(data: dict[str, Any], where: object) -> dict[str, Any]:
    """``data`` (a whole ``config.json``: its ``config`` record and run options) brought to :data:`FORMAT`;
    a copy, the input is not changed. ``where`` names the file in errors. Data that is not a JSON object is a
    TypeError, which every reader words as an unreadable file."""
    if not isinstance(data, dict):
        raise TypeError(f"expected a JSON object, got {type(data).__name__}")
    version = data.get(FORMAT_KEY, 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise FormatError(f"{where}: {FORMAT_KEY} must be a whole number >= 1, got {version!r}")
    if version > FORMAT:
        raise FormatError(f"{where} was written by a newer fpsfl (config format {version}; this one reads "
                          f"up to {FORMAT}): upgrade fpsfl to use it")
    data = copy.deepcopy(data)
    if isinstance(data.get("config"), dict):
        for step in range(version, FORMAT):  # format N -> N + 1, in turn
            STEPS[step](data["config"])
    data[FORMAT_KEY] = FORMAT
    return data


def read(path: Path) -> dict[str, Any]:
    """The run directory's ``config.json`` at ``path``, read and brought to :data:`FORMAT`. Errors reach the
    caller, which words them: OSError (reading), ValueError (not JSON; FormatError), TypeError (not an
    object)."""
    return migrate(json.loads(Path(path).read_text()), path)


def _from_1(record: dict[str, Any]) -> None:
    """Format 1 -> 2, in place: the settings format 1 did not record get the values its runs used."""
    for table, added in _ADDED_BY_TABLE.items():
        values = record.get(table)
        if isinstance(values, dict):
            for key, value in added.items():
                values.setdefault(key, value)
    federate = record.get("federate")
    if not isinstance(federate, dict) or "self_pretrain" in record:
        return
    for key, value in _ADDED_TO_FEDERATE_RUNS.items():
        federate.setdefault(key, value)
    resolved = record.get("algo") if isinstance(record.get("algo"), dict) else {}
    args = federate.setdefault("algo_args", {})
    if not isinstance(args, dict):  # left for the reader to refuse, naming the key
        return
    for key, before in _ALGO_BEFORE.get(federate.get("algo"), {}).items():
        args.setdefault(key, resolved.get(key, before))
        if resolved:
            resolved[key] = args[key]


def _method_step(version: int):
    """Format ``version`` -> ``version + 1``, in place: a pre-training run's resolved ``method`` table gets
    the method settings that format added, as its run had them (``--resume`` compares that table whole), and
    its ``pretrain`` table the pre-training settings that format added."""
    def step(record: dict[str, Any]) -> None:
        pretrain, method = record.get("pretrain"), record.get("method")
        if isinstance(pretrain, dict):
            for key, value in _PRETRAIN_ADDED.get(version, {}).items():
                pretrain.setdefault(key, value)
        if isinstance(pretrain, dict) and isinstance(method, dict):
            for key, value in _METHOD_ADDED[version].get(pretrain.get("method"), {}).items():
                method.setdefault(key, value)
    return step


# format N -> N + 1: raising FORMAT means adding its step here
STEPS = {1: _from_1, **{version: _method_step(version) for version in _METHOD_ADDED}}
