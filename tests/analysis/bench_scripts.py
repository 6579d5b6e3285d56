"""Shared by the tests of bench/'s diagnostic scripts: each is loaded as a script beside its siblings."""

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def bench_script(name: str):
    """bench/NAME.py as a module, bench/ on the import path first (the diagnostics import
    bench/knn_transforms.py as a script beside them would)."""
    if str(REPO / "bench") not in sys.path:
        sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
