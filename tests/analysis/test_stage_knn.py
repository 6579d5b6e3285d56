"""bench/stage_knn.py (issue 38's per-stage diagnostic): its last stage is the fair probe's kNN, its
earlier stages are not, and a wrong label shows in its confusions."""


import pytest
import torch

from pretrain.backbones import create_backbone
from pretrain.probe import ProbeData, probe
from tests.analysis.bench_scripts import bench_script, digits_subset


@pytest.fixture(scope="module")
def stages():
    return bench_script("stage_knn")


@pytest.fixture(scope="module")
def small_digits():
    return digits_subset()


@pytest.mark.parametrize("folds", [0, 3])
def test_the_last_stage_is_the_fair_probes_knn(stages, small_digits, folds):
    torch.manual_seed(0)
    backbone = create_backbone("resnet20", width=0.5)
    data = ProbeData(*(getattr(small_digits, f) for f in ("train_x", "train_y", "test_x", "test_y")),
                     n_classes=10, folds=folds)
    out = stages.knn_by_stage(backbone, data, 16)
    assert out["layer3"] == round(100 * probe(backbone, data, 16, linear=False)["knn_acc"], 2)
    assert out["layer1"] != out["layer3"]  # the hooks read other stages, not the output thrice
    assert sum(out["confusions"].values()) <= data.n_scored - out["layer3"] * data.n_scored / 100 + 1e-6


def test_confusions_name_the_mixed_pairs(stages, small_digits):
    """Every test label moved one class on (y -> y + 1 mod 10): the kNN still calls most images by what
    they show, so the most mixed pairs are neighbours (k, k + 1), and the shifted labels' score is what the
    true labels' errors leave."""
    torch.manual_seed(0)
    d = small_digits
    backbone = create_backbone("resnet20", width=0.5)
    shifted = stages.knn_by_stage(backbone, ProbeData(d.train_x, d.train_y, d.test_x, (d.test_y + 1) % 10,
                                                      n_classes=10), 16)
    true = stages.knn_by_stage(backbone, d, 16)
    assert true["layer3"] > 3 * shifted["layer3"]
    for pair in shifted["confusions"]:
        i, j = map(int, pair.split("/"))
        assert j - i in (1, 9), shifted["confusions"]
