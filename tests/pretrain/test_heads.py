"""The pre-training heads have the official FPS code's shapes (andytu28/FPS_Pre-training: main_simsiam.py,
simsiam/builder.py, main_moco.py, moco/builder.py), and the ImageNet heads stay available."""

import pytest
from torch import nn

from pretrain.backbones import create_backbone
from pretrain.methods import METHODS
from pretrain.recipe import PretrainConfig
from pretrain.train import build_method


def _layers(module: nn.Module) -> list[tuple]:
    """(kind, in, out, bias / affine) of every Linear and BatchNorm1d, in order."""
    out = []
    for m in module.modules():
        if isinstance(m, nn.Linear):
            out.append(("linear", m.in_features, m.out_features, m.bias is not None))
        elif isinstance(m, nn.BatchNorm1d):
            out.append(("bn", m.num_features, m.num_features, m.affine))
    return out


def _simsiam(f, d, p, h=None):
    h = h or f
    projector = [("linear", f, h, False), ("bn", h, h, True), ("linear", h, h, False), ("bn", h, h, True),
                 ("linear", h, d, False), ("bn", d, d, False)]
    predictor = [("linear", d, p, False), ("bn", p, p, True), ("linear", p, d, True)]
    return projector, predictor


# (arch, size, heads) -> expected (projector, predictor) for SimSiam, head for MoCo-v2
CASES = [
    ("resnet20", 32, "official", _simsiam(64, 512, 128),
     [("linear", 64, 64, True), ("linear", 64, 128, True)]),
    ("resnet18", 224, "official", _simsiam(512, 2048, 512),
     [("linear", 512, 512, True), ("linear", 512, 128, True)]),
    ("resnet20", 32, "imagenet", _simsiam(64, 2048, 512, h=2048),
     [("linear", 64, 2048, True), ("linear", 2048, 128, True)]),
]


@pytest.mark.parametrize("arch,size,heads,simsiam,moco", CASES)
def test_heads_have_the_official_shapes(arch, size, heads, simsiam, moco):
    cfg = PretrainConfig(arch=arch, size=size, method="simsiam", method_args={"heads": heads})
    method = build_method(cfg, None, "cpu")
    assert (_layers(method.projector), _layers(method.predictor)) == simsiam
    cfg = PretrainConfig(arch=arch, size=size, method="mocov2",
                         method_args={"heads": heads, "bank_size": 8})
    method = build_method(cfg, None, "cpu")
    assert _layers(method.head) == moco
    assert _layers(method.key_head) == moco


def test_explicit_sizes_win_over_the_recipe():
    cfg = PretrainConfig(method_args={"proj_dim": 32, "pred_dim": 8, "hidden_dim": 16})
    method = build_method(cfg, None, "cpu")
    assert [layer[2] for layer in _layers(method.projector)] == [16, 16, 16, 16, 32, 32]
    assert method.cfg.pred_dim == 8


def test_every_method_resolves_its_config_before_building():
    backbone = create_backbone("resnet20", width=0.25)
    for name in METHODS:
        cfg = METHODS[name].Config().resolve(backbone.feature_dim, 32)
        assert all(v is not None for v in vars(cfg).values()), name


def _head_params(heads: str) -> tuple[int, int]:
    method = build_method(PretrainConfig(method_args={"heads": heads}), None, "cpu")
    n = sum(p.numel() for m in (method.projector, method.predictor) for p in m.parameters())
    return n, sum(p.numel() for p in method.backbone.parameters())


def test_official_heads_are_smaller_than_the_backbone():
    # ResNet20: 0.27M backbone parameters; official heads 0.17M, ImageNet heads 10.6M (the figure)
    official, backbone = _head_params("official")
    imagenet, _ = _head_params("imagenet")
    assert official < backbone < imagenet / 30
