"""Shared command-line plumbing of the fpsfl console scripts (fractals, pretrain, federate, analyze, fpsfl).

Bad input is one line on stderr and exit code 2, never a traceback; Ctrl-C is exit code 130. Flags of typed
settings are generated from their dataclass fields (:func:`add_settings`, :mod:`fpsfl.base.settings`), so a
default, its unit and its help are written once.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .files import probe_write, temp_path
from .settings import choices_of, fits, flag_of, flat_fields, flat_types, in_interval, scalar


class UsageError(Exception):
    """Bad input: reported as one line with exit code 2."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (argparse would print the usage block too)."""

    def error(self, message: str) -> None:
        raise UsageError(f"{message} (see {self.prog} --help)")


def positive(name: str, value: float) -> None:
    if value <= 0:
        raise UsageError(f"{name} must be positive, got {value}")


def writable_file(path: Path, flag: str = "--out") -> None:
    """Fail now, not after an hour of work, if the file ``path`` cannot be written (its folder is made)."""
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a directory; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = temp_path(path)  # named as atomic_write's, so a kill here leaves what is cleaned up
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"cannot write {flag} {path}: {exc.strerror or exc}") from None


def writable_dir(path: Path, flag: str = "--out") -> Path:
    """Make the folder ``path`` and check that files can be written in it; returns it."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe_write(path)
    except OSError as exc:
        raise UsageError(f"cannot write in {flag} {path}: {exc.strerror or exc}") from None
    return path


def number(kind: type = int, within: str | None = None) -> Callable[[str], Any]:
    """An argparse type for the plain (non-settings) flags: ``kind`` (int or float) within the interval
    ``within`` (:func:`fpsfl.base.settings.in_interval`'s syntax; NaN never lies in one), within int64 or
    float32 (:func:`fpsfl.base.settings.fits`). A bad value is argparse's one-line error, before any work
    starts."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got "
                                             f"{text!r}") from None
        if not fits(value):
            raise argparse.ArgumentTypeError(f"too large for int64 or float32, got {text}")
        if within is not None and not in_interval(value, within):
            raise argparse.ArgumentTypeError(f"must lie in {within}, got {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


INT, COUNT, SEED = number(int), number(int, "[1, inf)"), number(int, "[0, inf)")  # argparse types


def nonempty(kind: type = Path) -> Callable[[str], Any]:
    """An argparse type for text and path flags: an empty value is an error (as a path it would silently
    mean the current folder)."""
    def parse(text: str) -> Any:
        if not text.strip():
            raise argparse.ArgumentTypeError("expected a value, got an empty string")
        return kind(text)
    parse.__name__ = kind.__name__
    return parse


TEXT = nonempty(str)


def parse_settings(pairs: list[str]) -> dict[str, str]:
    """``--set KEY=VALUE`` arguments as a dict (values stay strings; the config types them)."""
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set expects KEY=VALUE, got {pair!r}")
        settings[key.strip()] = value.strip()
    return settings


def run_main(prog: str, parser: argparse.ArgumentParser, argv: list[str] | None,
             user_errors: tuple[type[BaseException], ...],
             run_errors: tuple[type[BaseException], ...] = ()) -> int:
    """Parse ``argv`` and call ``args.run(args)``. Errors of the ``user_errors`` types (bad input) become one
    line and exit code 2; ``run_errors`` (a run that cannot go on, e.g. a diverged loss) one line and 1."""
    try:
        args = parser.parse_args(argv)
        args.run(args)
    except (UsageError, *user_errors) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except run_errors as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # the run's files stay consistent (atomic writes; a run without a first state leaves none)
        print(f"{prog}: error: no space left on the device writing {exc.filename or 'a file'}; free some "
              f"space, then run the same command again (with --resume if its run saved a first epoch or "
              f"round)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    return 0


def _help(f: dataclasses.Field) -> str:
    return _help_text(f).replace("%", "%%")  # argparse %-formats help strings


def _help_text(f: dataclasses.Field) -> str:
    meta = f.metadata
    text = meta["help"]() if callable(meta["help"]) else meta["help"]
    if meta.get("default_text"):
        return f"{text} (default: {meta['default_text']})"
    default = f.default if f.default is not dataclasses.MISSING else None
    if isinstance(default, bool) or default is None or default == ():
        return text
    if isinstance(default, tuple):
        default = ",".join(map(str, default))
    return f"{text} (default: {default})"


def add_settings(parser: Any, cls: type, *, groups: dict[str, Any] | None = None,
                 only: tuple[str, ...] | None = None, skip: tuple[str, ...] = ()) -> None:
    """One flag per command-line field of the dataclass ``cls`` (see :func:`fpsfl.base.settings.setting`).

    Flags default to ``argparse.SUPPRESS``: an absent flag leaves its field to the dataclass default, so no
    default is written twice. A bool field defaulting to False is a switch; one defaulting to True is a
    negative switch (its flag, e.g. ``--quiet``, stores False). ``groups`` maps a field's group to the
    argparse group its flag goes in.
    """
    kinds = flat_types(cls)
    for f in flat_fields(cls):
        meta = f.metadata
        if not meta.get("cli") or f.name in skip or (only is not None and f.name not in only):
            continue
        target = (groups or {}).get(meta.get("group"), parser)
        kwargs: dict[str, Any] = {"dest": f.name, "help": _help(f), "default": argparse.SUPPRESS}
        base = scalar(kinds[f.name])
        if base is bool and meta.get("parse") is None:
            kwargs["action"] = "store_false" if f.default is True else "store_true"
        else:
            kind = meta.get("parse") or base
            kwargs["type"] = nonempty(kind) if kind in (str, Path) else kind
            if meta.get("metavar"):
                kwargs["metavar"] = meta["metavar"]
            choices = choices_of(f)
            if choices is not None and meta.get("parse") is None:
                kwargs["choices"] = choices
            if meta.get("const") is not None:  # the bare flag means ``const``
                kwargs.update(nargs="?", const=meta["const"])
        target.add_argument(flag_of(f), **kwargs)


def add_set_flag(parser: Any, help: str) -> None:
    """``--set KEY=VALUE`` (repeatable): overrides of a plugin's settings, typed later by
    :func:`fpsfl.base.settings.override`."""
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=help)


def settings_from(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The values of ``cls``'s fields that were given on the command line (see :func:`add_settings`)."""
    return {f.name: getattr(args, f.name) for f in flat_fields(cls)
            if f.metadata.get("cli") and hasattr(args, f.name)}


def comma_list(kind: type) -> Any:
    """An argparse type for comma-separated values, e.g. ``--save-local-models 10,50``."""
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(t.strip()) for t in text.split(",") if t.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__} values, got "
                                             f"{text!r}") from None
    parse.__name__ = f"list of {kind.__name__}"
    return parse

