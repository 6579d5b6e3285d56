"""The layering's purpose, checked in fresh interpreters: federate and analyze start (``--help``) without
loading numba or lightly, and each console script answers --help."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
from {module} import main
try:
    main(["--help"])
except SystemExit:
    pass
print("LOADED", " ".join(m for m in ("numba", "lightly") if m in sys.modules))
"""


def _loaded(module: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(module=module)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("LOADED"))
    return line.split()[1:]


@pytest.mark.parametrize("module", ["federated.cli", "analysis.cli"])
def test_help_loads_neither_numba_nor_lightly(module):
    assert _loaded(module) == []


def test_the_probe_can_see_a_heavy_import():
    """pretrain needs both (the renderer and the SSL losses): the probe must report them there."""
    assert set(_loaded("pretrain.cli")) == {"numba", "lightly"}
