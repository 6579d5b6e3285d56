"""Shared by the tests of bench/'s diagnostic scripts: each is loaded as a script beside its siblings."""

import importlib.util
import sys
from pathlib import Path

from pretrain.probe import ProbeData, digits

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


def digits_subset(folds: int = 0):
    """300 training and 100 test images of sklearn's digits at 16 px, the bench diagnostics' probe set,
    split as ``folds`` says (0: that split)."""
    train_x, train_y, test_x, test_y = digits(16)
    return ProbeData(train_x[:300], train_y[:300], test_x[:100], test_y[:100], n_classes=10, folds=folds)
