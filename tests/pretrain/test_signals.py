"""Signals that a backbone moved (pretrain.signals), the fair probe (BatchNorm re-estimated) and the
verdict line (issue 38)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from pretrain.backbones import create_backbone
from pretrain.probe import ProbeData, embed, probe, reestimate_bn
from pretrain.signals import (
    MOVED_COS,
    centred_rank,
    checkpoint_drift,
    deepest_cos,
    flat,
    stage_of,
    unflat,
    verdict,
    weight_drift,
)


def _state(seed: int = 0) -> dict:
    torch.manual_seed(seed)
    return create_backbone("resnet20", 0.25).state_dict()


def test_stage_of_groups_top_level_modules_and_numbered_containers():
    assert stage_of("conv1.weight") == "conv1"
    assert stage_of("layer3.2.conv2.weight") == "layer3"
    assert stage_of("stages.2.blocks.0.conv.weight") == "stages.2"
    assert stage_of("features.5.conv.0.0.weight") == "features.5"


def test_cosine_to_init_is_one_for_a_rescale_and_falls_with_a_new_direction():
    init = _state(0)
    shrunk = {k: 0.6 * v if v.is_floating_point() else v for k, v in init.items()}
    drift = weight_drift(init, shrunk)
    assert list(drift) == ["conv1", "layer1", "layer2", "layer3"]
    assert all(v["cos"] == pytest.approx(1.0, abs=1e-9) for v in drift.values())
    assert all(v["norm"] == pytest.approx(0.6, rel=1e-6) for v in drift.values())
    assert verdict(drift) is not None and "layer3" in verdict(drift)
    # another random init is nearly orthogonal: cosine ~0, and the verdict is silent
    other = weight_drift(init, _state(1))
    assert abs(deepest_cos(other)) < 0.05 and verdict(other) is None
    # half the way to an independent direction: cos = 1 / sqrt(2) for equal norms
    mixed = {k: (v + _state(1)[k]) if v.is_floating_point() else v for k, v in init.items()}
    assert deepest_cos(weight_drift(init, mixed)) == pytest.approx(1 / math.sqrt(2), abs=0.02)
    assert unflat(flat(drift)) == drift


def test_verdict_threshold_is_on_the_deepest_stage():
    drift = {"conv1": {"cos": 0.5, "norm": 1.0}, "layer3": {"cos": MOVED_COS + 0.001, "norm": 0.9}}
    assert verdict(drift) is not None
    drift["layer3"]["cos"] = MOVED_COS - 0.001
    assert verdict(drift) is None


def test_centred_rank_ignores_a_shared_offset():
    gen = torch.Generator().manual_seed(0)
    same = torch.randn(1, 16, generator=gen).expand(64, 16) + 1e-9 * torch.randn(64, 16, generator=gen)
    assert centred_rank(same + 100) == pytest.approx(centred_rank(same), rel=1e-3)
    spread = torch.randn(256, 16, generator=gen)
    assert centred_rank(spread + 100) > 12  # a large mean does not hide 16 spread dimensions
    assert centred_rank(torch.randn(256, 1, generator=gen) @ torch.randn(1, 16, generator=gen)) < 1.01


def _data(n: int = 96) -> ProbeData:
    gen = torch.Generator().manual_seed(0)
    y = torch.arange(n) % 3
    x = (torch.rand(n, 16, 16, 3, generator=gen) * 60 + 60 * y[:, None, None, None]).to(torch.uint8)
    return ProbeData(x[: n // 2], y[: n // 2], x[n // 2:], y[n // 2:], 3)


def _with_bn_stats(backbone: nn.Module, seed: int) -> nn.Module:
    """``backbone`` whose only change is its BatchNorm running statistics (as fractal pre-training leaves
    them on a backbone that did not move)."""
    gen = torch.Generator().manual_seed(seed)
    for m in backbone.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=gen))
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) * 5 + 0.1)
    return backbone


def test_fair_probe_gives_a_backbone_with_only_new_bn_statistics_nothing_over_random_init():
    data = _data()
    torch.manual_seed(3)
    random = create_backbone("resnet20", 0.25)
    stats_only = _with_bn_stats(create_backbone("resnet20", 0.25), 7)
    stats_only.load_state_dict({**random.state_dict(), **{k: v for k, v in stats_only.state_dict().items()
                                                         if "running" in k}})
    # eval mode tells them apart (the statistics change the features) ...
    assert not torch.allclose(embed(random, data.test_x, 16), embed(stats_only, data.test_x, 16), atol=1e-3)
    # ... the fair probe does not: the same features, the same accuracies
    fair_r, fair_s = reestimate_bn(random, data.train_x, 16), reestimate_bn(stats_only, data.train_x, 16)
    assert torch.allclose(embed(fair_r, data.test_x, 16), embed(fair_s, data.test_x, 16), atol=1e-5)
    assert probe(random, data, 16) == probe(stats_only, data, 16)
    # the backbone itself is untouched by the probe
    assert torch.equal(stats_only.layer1[0].bn1.running_var, _with_bn_stats(create_backbone("resnet20", 0.25),
                                                                          7).layer1[0].bn1.running_var)


def test_folds_score_every_image_once_each_fold_stratified_and_the_same_folds_every_time():
    data = replace(_data(96), folds=4)
    splits = data.splits()
    tests = torch.cat([s.test_x.reshape(len(s.test_x), -1) for s in splits])
    pooled = torch.cat([data.train_x, data.test_x]).reshape(96, -1)
    # every pooled image is a test image of exactly one fold (compared as rows, sorted)
    assert data.n_scored == 96 and len(tests) == 96
    assert torch.equal(torch.unique(tests, dim=0), torch.unique(pooled, dim=0))
    for s in splits:  # 32 images a class split over 4 folds: 8 of each class in each test fold
        assert torch.bincount(s.test_y, minlength=3).tolist() == [8, 8, 8] and len(s.train_y) == 72
    assert all(torch.equal(a.test_y, b.test_y) and torch.equal(a.test_x, b.test_x)
               for a, b in zip(splits, data.splits(), strict=True))
    assert replace(data, folds=0).splits() == [replace(data, folds=0)] and _data().n_scored == 48
    for bad in (1, 33):  # at least 2 folds, at most the smallest class's 32 images
        with pytest.raises(ValueError, match="folds must be"):
            replace(data, folds=bad).splits()


def test_folded_probe_pools_each_fold_probed_fairly():
    data = replace(_data(96), folds=3)
    torch.manual_seed(3)
    random = create_backbone("resnet20", 0.25)
    stats_only = _with_bn_stats(create_backbone("resnet20", 0.25), 7)
    stats_only.load_state_dict({**random.state_dict(), **{k: v for k, v in stats_only.state_dict().items()
                                                         if "running" in k}})
    # the pooled accuracy is the share of all 96 images right: each fold's accuracy weighted by its size
    by_fold = [probe(random, s, 16) for s in data.splits()]
    pooled = probe(random, data, 16)
    for key in ("knn_acc", "linear_acc"):
        assert pooled[key] == pytest.approx(sum(a[key] * len(s.test_y) for a, s in zip(by_fold, data.splits(),
                                                                                      strict=True)) / 96)
    assert pooled != probe(random, replace(data, folds=0), 16)  # not the test split's figure
    # BatchNorm re-estimated on each fold's training images: new statistics alone still gain nothing
    assert probe(stats_only, data, 16) == pooled


def test_reestimated_statistics_are_the_data_statistics():
    data = _data()
    torch.manual_seed(0)
    model = reestimate_bn(create_backbone("resnet20", 0.25), data.train_x, 16)
    from fpsfl.base.images import eval_batch

    x = eval_batch(data.train_x, 16)
    with torch.no_grad():
        out = model.conv1(x)
    assert torch.allclose(model.bn1.running_mean, out.mean((0, 2, 3)), atol=1e-4)


def test_pretrain_logs_drift_writes_it_into_the_checkpoint_and_warns_when_it_did_not_move(tmp_path, capsys):
    from pretrain.cli import main as pretrain

    out = tmp_path / "p.ckpt"
    # a learning rate this small cannot move the backbone in one step: the verdict must say so
    assert pretrain(["fps", "--width", "0.25", "--size", "16", "--epochs", "1", "--pairs-per-epoch", "32",
                     "--batch-size", "16", "--device", "cpu", "--lr", "1e-6", "--out", str(out)]) == 0
    err = capsys.readouterr()
    assert "not pre-trained in any useful sense" in err.out + err.err
    row = json.loads((tmp_path / "p.run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["cos_init/layer3"] > 0.999 and "norm_ratio/conv1" in row
    ckpt = torch.load(out, weights_only=True)
    assert ckpt["signals"]["drift"]["layer3"]["cos"] == pytest.approx(row["cos_init/layer3"])
    # a checkpoint without recorded signals gets them recomputed from its seed: the same numbers
    del ckpt["signals"]
    assert checkpoint_drift(ckpt)["layer3"]["cos"] == pytest.approx(row["cos_init/layer3"], abs=1e-9)
