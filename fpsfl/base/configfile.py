"""Config files: ``federate --config FILE`` and ``pretrain --config FILE`` (issue 34).

A file is TOML or JSON with one table per typed config, named as a run's ``config.json`` names them
(``[federate]`` and ``[algo]``; ``[pretrain]`` and ``[method]``; ``[run]`` for the run options). A run's own
``config.json`` is a file too: its ``config`` record is read and its ``run`` record (the old run's paths and
options) is not, so ``federate --config runs/x/config.json --out runs/y`` replays run x. Every key is typed
against the same dataclass fields as the flags (:mod:`fpsfl.base.settings`); an unknown key or a bad value
is one :class:`ConfigFileError` line. Flags given beside the file win: the commands merge the file's values
under the flags that were given (:func:`fpsfl.base.cli.settings_from`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .migrate import FormatError, migrate
from .settings import check_field, coerce, flat_fields, flat_types

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


class ConfigFileError(ValueError):
    """A config file that cannot be used; the message is one line (exit code 2)."""


def read_sections(path: Path, known: Iterable[str], recorded: Iterable[str] = ()) -> dict[str, dict]:
    """The tables of a TOML or JSON config file, or of a run's ``config.json`` (its ``config`` record).

    ``known``: the tables a file may hold; ``recorded``: keys a run's record holds for reading only (derived
    values such as the resolved algorithm config), skipped. Anything else is an error naming it.
    """
    data = run_record(path)
    if data is not None:  # a run directory's config.json (fpsfl.base.rundir)
        data = {k: v for k, v in data.items() if k not in set(recorded)}
    else:
        data = _load(path)
    known = tuple(known)
    tables = {}
    for key, value in data.items():
        if key not in known:
            raise ConfigFileError(f"--config {path}: unknown table {key!r}; a file holds "
                                  f"{', '.join(known)}")
        if not isinstance(value, dict):
            raise ConfigFileError(f"--config {path}: {key} must be a table of settings, got {value!r}")
        tables[key] = value
    return tables


def run_record(path: Path) -> dict | None:
    """The ``config`` record of a run directory's ``config.json`` (what the run was started with, and what it
    recorded beside, such as its --init file's sha256), or None for a plain settings file. A record of an
    older format is brought to this code's (:func:`fpsfl.base.migrate.migrate`): it replays as it ran."""
    data = _load(path)
    if not ("config" in data and "code_version" in data):
        return None
    if not isinstance(data["config"], dict):
        raise ConfigFileError(f"--config {path}: its config record must be a table of settings, got "
                              f"{data['config']!r}")
    try:
        return migrate(data, f"--config {path}")["config"]
    except FormatError as exc:
        raise ConfigFileError(str(exc)) from None


def typed(cls: type | Iterable[type], values: Mapping[str, Any], where: str,
          skip: Iterable[str] = ()) -> dict[str, Any]:
    """``values`` typed as the fields of ``cls`` (a dataclass, or several whose fields are pooled), as flags
    are: a string goes through the field's flag parser where it has one. Keys in ``skip`` are returned as
    they are (tables the caller types itself). Unknown keys and bad values are one line naming ``where``."""
    classes = [cls] if isinstance(cls, type) else list(cls)
    found = {f.name: (f, kinds[f.name]) for c in classes for kinds in (flat_types(c),)
             for f in flat_fields(c)}
    skip = set(skip)
    out = {}
    for key, value in values.items():
        if key in skip:  # a nested table: the caller types its keys, but a table it must be
            if not isinstance(value, dict):
                raise ConfigFileError(f"{where}: {key} must be a table of settings, got {value!r}")
            out[key] = value
            continue
        if key not in found:
            raise ConfigFileError(f"{where}: unknown key {key!r} (the keys are the flags' names with "
                                  f"underscores; see --help)")
        field, kind = found[key]
        if field.metadata.get("internal"):
            raise ConfigFileError(f"{where}: {key!r} is an internal test hook, not a setting")
        parse = field.metadata.get("parse")
        try:
            by_flag = parse is not None and isinstance(value, str)
            out[key] = parse(value) if by_flag else coerce(key, value, kind)
            check_field(field, out[key], f"setting {key!r}")  # the interval and choices its flag checks
        except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
            raise ConfigFileError(f"{where}: {exc}") from None
    return out


def _load(path: Path) -> dict:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigFileError(f"--config {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            raise ConfigFileError(f"--config {path}: give a .toml file or a run's config.json")
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigFileError(f"--config {path}: not valid {path.suffix[1:].upper()} ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"--config {path}: expected tables of settings, got {type(data).__name__}")
    return data
