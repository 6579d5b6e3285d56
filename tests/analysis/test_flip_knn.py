"""bench/flip_knn.py (issue 38's flip diagnostic): its kNN is the fair probe's, a backbone made
flip-blind reads 1 and loses nothing to symmetrising, and a random init lies in between."""

import pytest
import torch
from torch import nn

from pretrain.backbones import create_backbone
from pretrain.probe import probe
from tests.analysis.bench_scripts import bench_script


@pytest.fixture(scope="module")
def flips():
    return bench_script("flip_knn")


class FlipBlind(nn.Module):
    """f(x) + f(x mirrored): exactly the same features for an image and its mirror image."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x) + self.inner(x.flip(-1))


def test_knn_is_the_fair_probes(flips, small_digits):
    torch.manual_seed(0)
    backbone = create_backbone("resnet20", width=0.5)
    out = flips.knn_flip(backbone, small_digits, 16)
    assert out["knn"] == round(100 * probe(backbone, small_digits, 16, linear=False)["knn_acc"], 2)
    assert 0 < out["flip_inv"] < 0.9  # a random init neither ignores the flip nor sees only it
    assert out["cos_other"] < out["cos_flip"] < 1


def test_a_flip_blind_backbone_reads_one(flips, small_digits):
    torch.manual_seed(0)
    out = flips.knn_flip(FlipBlind(create_backbone("resnet20", width=0.5)), small_digits, 16)
    assert out["flip_inv"] == pytest.approx(1, abs=1e-4)
    assert out["knn"] == out["knn_sym"]  # symmetrising a symmetric feature changes nothing


def test_invariance_measures_against_other_images(flips):
    rows = torch.randn(64, 8)
    assert flips.flip_invariance(rows, rows)[0] == pytest.approx(1)
    same, other = flips.flip_invariance(rows, torch.randn(64, 8))
    assert abs(same) < 0.3 and abs(other) < 0.3
