"""bench/feature_colour.py (issue 38's colour diagnostic): its targets and its read-out can fail."""

import math

import pytest
import torch

from tests.analysis.bench_scripts import bench_script


@pytest.fixture(scope="module")
def colour():
    return bench_script("feature_colour")


def _flat(rgb, n=1, side=4):
    return torch.tensor(rgb, dtype=torch.uint8).expand(n, side, side, 3).clone()


@pytest.mark.parametrize("rgb, chroma, hue", [
    ((255, 0, 0), 1.0, 0.0), ((0, 255, 0), 1.0, 120.0), ((0, 0, 255), 1.0, -120.0),
    ((255, 255, 0), 1.0, 60.0), ((128, 128, 128), 0.0, None)])
def test_targets_are_hsv_chroma_and_hue(colour, rgb, chroma, hue):
    t = colour.colour_targets(_flat(rgb))[0]
    assert t[0].item() == pytest.approx(chroma, abs=1e-6)
    assert t[3].item() == pytest.approx(sum(rgb) / 3 / 255, abs=1e-6)
    if hue is None:  # grey: no chroma, so no hue to weigh
        assert t[1].item() == t[2].item() == 0.0
    else:
        assert math.degrees(math.atan2(t[2].item(), t[1].item())) == pytest.approx(hue, abs=1e-3)


def test_ridge_reads_out_a_linear_target_and_not_noise(colour):
    g = torch.Generator().manual_seed(0)
    f = torch.randn(600, 16, generator=g)
    target = (f @ torch.randn(16, 1, generator=g)) + 3.0
    noise = torch.randn(600, 1, generator=g)
    guess = colour.ridge_predict(f[:400], torch.cat([target, noise], 1)[:400], f[400:], penalty=1e-3)

    def r2(t, p):
        return 1 - ((t - p) ** 2).sum() / ((t - t.mean()) ** 2).sum()

    assert r2(target[400:, 0], guess[:, 0]) > 0.999
    assert r2(noise[400:, 0], guess[:, 1]) < 0.1
