"""Tests marked ``gpu`` skip themselves where CUDA is absent, so ``pytest -m gpu`` on a CPU machine (e.g.
``bench/gpu.sh --dry-run``) reports them skipped instead of failing on ``device="cuda"``."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
