"""Shared command-line plumbing of the fpsfl console scripts (fractals, pretrain, federate, analyze).

Bad input is one line on stderr and exit code 2, never a traceback; Ctrl-C is exit code 130.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


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
        probe = path.with_name(f".{path.name}.probe{os.getpid()}")
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
        probe = path / f".probe{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"cannot write in {flag} {path}: {exc.strerror or exc}") from None
    return path


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
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    return 0


