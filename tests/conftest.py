"""Tests marked ``gpu`` skip themselves where CUDA is absent, so ``pytest -m gpu`` on a CPU machine (e.g.
``bench/gpu.sh --dry-run``) reports them skipped instead of failing on ``device="cuda"``; and fixtures
shared across folders."""

import os

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `pytest -n 2` (the README's command): two test processes on two cores, one torch thread each, as
    # two PyTorch processes of two threads each slow each other several-fold (2-core VM, 2026-11-28: the
    # suite 17-18 min this way, 31 min in one process of two threads)
    torch.set_num_threads(1)


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


@pytest.fixture
def one_thread():
    """One intra-op torch thread for the test, the count restored after. Two computations that must agree
    bit for bit (or within a tight tolerance) but sum in another order round alike only at equal thread
    counts: Ray gives each one-CPU ClientApp actor one thread, the vectorised and the sequential round sum
    differently, and at two threads on a 2-core AMD EPYC (2026-11-27) Orchestra's engine and its reference
    drifted 4.8e-3 apart in round 1's conv1."""
    torch.set_num_threads(1)  # restored after the test by _threads_restored


@pytest.fixture(autouse=True)
def _threads_restored():
    """Whatever a test does to torch's intra-op thread count, the next test starts with the suite's: a test
    that set one thread and left it made every later test of the run use one core of two."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
