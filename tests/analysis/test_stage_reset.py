"""bench/stage_reset.py (issue 38's diagnostic): alpha 0 is the run's init in the chosen stage alone, 1 the
file unchanged, and a stage that does not exist is refused."""

import pytest
import torch

from pretrain.backbones import create_backbone
from pretrain.signals import initial_state, scale_weights, stage_of, weight_drift
from tests.analysis.bench_scripts import bench_script


@pytest.fixture(scope="module")
def reset():
    return bench_script("stage_reset")


@pytest.fixture(scope="module")
def trained():
    """A checkpoint-shaped record of a backbone that is not its seed-3 init x0.1 (another draw)."""
    torch.manual_seed(11)
    model = create_backbone("resnet20", 0.25)
    scale_weights(model, 0.1)
    return {"arch": "resnet20", "width": 0.25, "signals": {"drift": {}},
            "config": {"pretrain": {"seed": 3, "init_scale": 0.1}}, "backbone": model.state_dict()}


def test_alpha_zero_is_the_init_in_that_stage_alone(reset, trained):
    init = initial_state("resnet20", 0.25, 3, 0.1)
    out = reset.reset_stage(trained, "layer3", 0.0)
    assert "signals" not in out and out["config"] == trained["config"]
    for k, v in out["backbone"].items():
        want = init[k] if stage_of(k) == "layer3" and v.is_floating_point() else trained["backbone"][k]
        assert torch.equal(v, want), k
    drift = weight_drift(init, out["backbone"])
    assert drift["layer3"]["cos"] == pytest.approx(1.0) and drift["layer2"]["cos"] < 0.5


def test_alpha_one_leaves_the_file_and_half_is_between(reset, trained):
    init = initial_state("resnet20", 0.25, 3, 0.1)
    same = reset.reset_stage(trained, "layer3", 1.0)["backbone"]
    assert all(torch.allclose(same[k], v) for k, v in trained["backbone"].items())
    half = reset.reset_stage(trained, "layer3", 0.5)["backbone"]
    cos = {a: weight_drift(init, b)["layer3"]["cos"] for a, b in (("half", half), ("one", same))}
    assert cos["one"] < cos["half"] < 1


def test_an_unknown_stage_is_refused(reset, trained):
    with pytest.raises(ValueError, match="no stage 'layer4'"):
        reset.reset_stage(trained, "layer4", 0.0)
