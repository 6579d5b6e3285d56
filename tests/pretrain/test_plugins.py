"""A new pre-training method and a new backbone are one file each (issue 39): defined here and nowhere else,
they train through ``pretrain`` end to end; which sources take the method follows from the labels it reads,
with no list of methods to edit."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fpsfl.base.checkpoint import load_checkpoint
from fpsfl.base.settings import setting
from pretrain.backbones import BACKBONES, register_backbone
from pretrain.cli import main as pretrain
from pretrain.methods import METHODS, Method, MethodConfig
from pretrain.sources import SOURCES


# ---- the toy method: the two views' l2-normalised embeddings pulled together (collapses, but trains)
@dataclass(frozen=True)
class AlignConfig(MethodConfig):
    lr: float = setting(0.05, "per 256 samples", within="(0, inf)")


class Align(Method):
    name = "align"
    Config = AlignConfig

    def forward(self, views: Tensor, labels: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        z = F.normalize(self.backbone(views.flatten(0, 1)).float(), dim=1).unflatten(0, views.shape[:2])
        loss = 2 - 2 * (z[0] * z[1]).sum(1).mean()
        return loss, {"z_std": z.std(1).mean().detach()}


# ---- the toy backbone: one conv and a global pool
def tiny(width: float) -> nn.Module:
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                        nn.Flatten())
    net.feature_dim = 8
    return net


@pytest.fixture
def plugins():
    METHODS.register(Align)
    register_backbone("tinynet", min_size=8, description="one conv (test plugin)")(tiny)
    yield
    METHODS.unregister("align")
    BACKBONES.unregister("tinynet")


def test_a_new_method_fits_the_sources_whose_labels_it_reads(plugins):
    takes = {name for name, spec in SOURCES.items() if "align" in spec.methods}
    assert takes == {"fps", "fractal-single", "images"}  # the label-free sources, none of the labelled ones
    assert SOURCES["fps"].methods[0] == "simsiam"  # the default stays first


def test_a_toy_method_and_backbone_train_through_pretrain(tmp_path, plugins, capsys):
    out = tmp_path / "toy.ckpt"
    code = pretrain(["fps", "--method", "align", "--arch", "tinynet", "--size", "16", "--epochs", "1",
                     "--batch-size", "8", "--pairs-per-epoch", "16", "--device", "cpu", "--workers", "0",
                     "--quiet", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    ckpt = load_checkpoint(out)
    assert (ckpt["method"], ckpt["arch"]) == ("align", "tinynet")
    assert torch.isfinite(torch.stack([v.float().sum() for v in ckpt["backbone"].values()])).all()


def test_an_unknown_method_for_a_source_is_one_line(plugins, capsys):
    assert pretrain(["supervised", "--method", "align", "--root", "x"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'align'" in err and len(err.strip().splitlines()) == 1
