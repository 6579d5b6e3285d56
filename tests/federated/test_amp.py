"""`federate --amp`: bf16 autocast of local training and evaluation, checked with CPU autocast."""

import json

import pytest
import torch
from torch import nn

from federated.cli import main
from federated.rounds import precision
from federated.setup import Setup

TINY = ["--width", "0.25", "--clients", "3", "--rounds", "1", "--local-epochs", "1", "--device", "cpu",
        "--quiet", "--alpha", "1.0", "--batch-size", "32"]


def _round(tmp_path, name: str, *extra: str) -> dict:
    assert main(["--out", str(tmp_path / name), *TINY, *extra]) == 0
    return json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[0])


@pytest.mark.parametrize("algo", ["fedavg", "scaffold"])
def test_amp_round_is_finite_and_close_to_float32_but_not_equal(tmp_path, algo):
    fp32 = _round(tmp_path, "fp32", "--algo", algo)
    amp = _round(tmp_path, "amp", "--algo", algo, "--amp")
    for key in ("train_loss", "test_loss", "test_acc", "local_acc"):
        assert torch.isfinite(torch.tensor(amp[key])), key
    assert amp["train_loss"] != fp32["train_loss"]  # bf16 convolutions round differently
    assert amp["train_loss"] == pytest.approx(fp32["train_loss"], rel=0.05)
    assert amp["test_acc"] == pytest.approx(fp32["test_acc"], abs=0.1)
    saved = json.loads((tmp_path / "amp" / "config.json").read_text())["config"]["federate"]
    assert saved["amp"] is True


def _setup(model, x, amp):
    return Setup(type("Data", (), {"train_x": x})(), [], None, model, None, "", amp)


def test_precision_puts_convolutions_in_bf16_only_with_amp():
    conv, x = nn.Conv2d(3, 4, 3), torch.randn(2, 3, 8, 8)
    for amp, dtype in ((True, torch.bfloat16), (False, torch.float32)):
        with precision(_setup(conv, x, amp)):
            assert conv(x).dtype == dtype


def test_precision_sees_every_optimiser_step():
    """One context spans a whole local training, so autocast must not serve cached bf16 weights of step 1
    to the later steps (with the cache on, the second output equals the first and training stalls)."""
    linear, x = nn.Linear(4, 4), torch.randn(2, 4)
    optimizer = torch.optim.SGD(linear.parameters(), lr=1.0)
    with precision(_setup(linear, x, True)):
        first = linear(x)
        first.sum().backward()
        optimizer.step()
        assert not torch.equal(linear(x), first)
