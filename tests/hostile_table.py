"""What the generated hostile-value tables share (issue 42): each format written valid once, and the table
run: every case's outcome ('refused' in one line, 'loaded' as the format promises, or a 'TRACEBACK ...'
line for any other exception), printed with its counts, failing on any traceback
(tests/test_hostile_loaders.py: the pickled formats; tests/test_hostile_formats.py: text and image ones)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest


def write_valid(factory: pytest.TempPathFactory, formats: Iterable[Any]) -> dict[str, Path]:
    """Each format (``.name``, ``.write(root)``) written once, valid, in its own folder; a case copies it
    and changes one entry."""
    roots = {}
    for fmt in formats:
        roots[fmt.name] = factory.mktemp(fmt.name)
        fmt.write(roots[fmt.name])
    return roots


def run_table(cases: list, label: Callable[[Any], str], outcome: Callable[[Any], str]) -> Counter:
    """Each case's ``outcome``, a row of the printed table beside its ``label``; the counts of 'refused',
    'loaded' and 'traceback'. Fails, listing them, when any case ended in a traceback."""
    counts: Counter = Counter()
    rows = []
    for case in cases:
        try:
            result = outcome(case)
        except Exception as exc:  # noqa: BLE001  a traceback for the user: listed, then failed below
            result = f"TRACEBACK {type(exc).__name__}: {exc}"[:200]
        counts["traceback" if result.startswith("TRACEBACK") else result] += 1
        rows.append(f"{label(case)} {result}")
    print("\n" + "\n".join(rows))
    print(f"{len(cases)} cases: {counts['refused']} refused in one line, {counts['loaded']} loaded as the "
          f"format promises, {counts['traceback']} tracebacks")
    assert counts["traceback"] == 0, "\n".join(r for r in rows if "TRACEBACK" in r)
    return counts
