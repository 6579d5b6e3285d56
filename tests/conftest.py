"""Tests marked ``gpu`` skip themselves where CUDA is absent, so ``pytest -m gpu`` on a CPU machine (e.g.
``bench/gpu.sh --dry-run``) reports them skipped instead of failing on ``device="cuda"``; and fixtures
shared across folders."""

import os

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def skip_md5(monkeypatch):
    """torchvision checks CIFAR files' md5 sums; files written in the format only need to exist."""
    import torchvision.datasets.cifar as cifar

    monkeypatch.setattr(cifar, "check_integrity", lambda fpath, md5=None: os.path.isfile(fpath))
