"""The layering's purpose, checked in fresh interpreters: federate and analyze start (``--help``) without
loading numba or lightly, and each console script answers --help."""

from __future__ import annotations

import os
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


@pytest.mark.parametrize("package", ["fractals", "pretrain", "federated", "analysis", "fpsfl.demo"])
def test_the_openmp_wait_is_set_before_torch_loads(package):
    """Importing any package sets GOMP_SPINCOUNT (without loading torch), unless the user chose a policy."""
    code = (f"import os, sys; import {package}; "
            "print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                         check=True).stdout.split()
    assert out == ["1000", "False"]
    mine = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          check=True, env={**env, "OMP_WAIT_POLICY": "ACTIVE"}).stdout.split()
    assert mine == ["None", "False"]
