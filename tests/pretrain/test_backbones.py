"""The backbone registry (pretrain/backbones.py): every registered network and one timm model map images to
finite pooled features of the advertised width, have the published sizes, keep the key layouts that
torchvision and segmentation-models-pytorch weights need, and reject what they cannot take with one-line
errors."""

import math

import pytest
import segmentation_models_pytorch as smp
import timm
import torch
import torchvision
from segmentation_models_pytorch.encoders import encoders as smp_encoders
from torch import nn

from pretrain.backbones import (
    BACKBONES,
    BackboneError,
    arch_names,
    backbone_spec,
    check_backbone,
    create_backbone,
)
from pretrain.backbones.cifar_resnet import CifarResNet, ShortcutA

# MobileNetV3's pooled output (1024) is wider than its num_features (288): feature_dim must follow the output
TIMM_ARCH = "timm:mobilenetv3_small_050"
ARCHS = [*BACKBONES, TIMM_ARCH]

# Parameters without classifier, in millions: He et al. 2016 Table 6 (CIFAR ResNets, counted with their
# 650-parameter classifier), torchvision's ResNet18 (11.69M with its 0.51M fc), MobileNetV2 features
# (Sandler et al. 2018: 3.4M with the 1.28M classifier).
PARAMS_M = {
    "resnet20": (0.26, 0.28),
    "resnet32": (0.45, 0.47),
    "resnet44": (0.65, 0.67),
    "resnet56": (0.84, 0.86),
    "resnet18": (11.1, 11.3),
    "mobilenet_v2": (2.1, 2.3),
}


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _natural_size(arch: str) -> int:
    """32 px for the CIFAR ResNets (the paper's size); 64 px keeps the others fast on CPU."""
    return 32 if arch in BACKBONES and BACKBONES[arch].has_width else 64


@pytest.mark.parametrize("arch", ARCHS)
def test_forward_gives_finite_pooled_features(arch):
    torch.manual_seed(0)
    size = _natural_size(arch)
    check_backbone(arch, 1.0, size)
    model = create_backbone(arch)
    assert isinstance(model.feature_dim, int)
    out = model(torch.randn(2, 3, size, size))
    assert out.shape == (2, model.feature_dim)
    assert torch.isfinite(out).all()
    assert out.std() > 0  # not a constant: the features depend on the input


@pytest.mark.parametrize("arch", list(BACKBONES))
def test_parameter_counts_match_the_published_sizes(arch):
    lo, hi = PARAMS_M[arch]
    assert lo * 1e6 <= _params(create_backbone(arch)) <= hi * 1e6


def test_every_registered_backbone_has_an_expected_size():
    assert set(PARAMS_M) == set(BACKBONES)


def test_width_multiplies_channels_and_squares_parameters():
    base, wide, thin = (create_backbone("resnet20", w) for w in (1.0, 2.0, 0.5))
    assert (base.feature_dim, wide.feature_dim, thin.feature_dim) == (64, 128, 32)
    assert 3.8 < _params(wide) / _params(base) < 4.2
    assert wide(torch.randn(2, 3, 32, 32)).shape == (2, 128)


@pytest.mark.parametrize("size", [8, 9, 31, 33])
def test_cifar_resnet_takes_any_side_from_8(size):
    check_backbone("resnet20", 1.0, size)
    assert create_backbone("resnet20")(torch.randn(2, 3, size, size)).shape == (2, 64)


def test_option_a_shortcut_subsamples_and_zero_pads():
    model = CifarResNet(20)
    shortcut = model.layer2[0].shortcut
    assert isinstance(shortcut, ShortcutA)
    assert not list(shortcut.parameters())
    x = torch.randn(2, 16, 8, 8)
    out = shortcut(x)
    assert out.shape == (2, 32, 4, 4)
    assert torch.equal(out[:, :16], x[:, :, ::2, ::2])
    assert torch.count_nonzero(out[:, 16:]) == 0
    # option A everywhere: no 1x1 projection convolution anywhere in the network
    assert all(m.kernel_size == (3, 3) for m in model.modules() if isinstance(m, nn.Conv2d))


@pytest.mark.parametrize(("stage", "channels", "stride"), [("layer1", 16, 1), ("layer2", 16, 2)])
def test_blocks_add_the_shortcut(stage, channels, stride):
    block = getattr(CifarResNet(20), stage)[0]
    nn.init.zeros_(block.bn2.weight)  # residual branch is zero: the block reduces to relu(shortcut(x))
    x = torch.randn(2, channels, 8, 8)
    expected = x[:, :, ::stride, ::stride].relu()
    out = block(x)
    assert torch.equal(out[:, :channels], expected)
    assert torch.count_nonzero(out[:, channels:]) == 0


def test_cifar_resnet_convolutions_are_kaiming_normal():
    conv = CifarResNet(56).layer3[1].conv1  # 64 -> 64 channels, 36,864 weights
    assert conv.weight.std().item() == pytest.approx(math.sqrt(2 / (64 * 9)), rel=0.03)


def test_resnet18_keys_are_torchvision_minus_fc():
    reference = torchvision.models.resnet18(weights=None).state_dict()
    model = create_backbone("resnet18")
    assert list(model.state_dict()) == [k for k in reference if not k.startswith("fc.")]
    result = model.load_state_dict(reference, strict=False)
    assert result.missing_keys == []
    assert sorted(result.unexpected_keys) == ["fc.bias", "fc.weight"]


def test_mobilenet_v2_loads_strictly_into_deeplabv3plus():
    encoder = smp.DeepLabV3Plus(encoder_name="mobilenet_v2", encoder_weights=None).encoder
    state = create_backbone("mobilenet_v2").state_dict()
    assert list(state) == list(encoder.state_dict())
    encoder.load_state_dict(state, strict=True)  # smp's override returns None; strict raises on a mismatch
    assert all(torch.equal(v, state[k]) for k, v in encoder.state_dict().items())


def test_mobilenet_v2_pools_the_smp_encoders_last_feature_map():
    entry = smp_encoders["mobilenet_v2"]
    encoder = entry["encoder"](**entry["params"]).eval()
    model = create_backbone("mobilenet_v2").eval()
    result = model.load_state_dict(encoder.state_dict())
    assert (result.missing_keys, result.unexpected_keys) == ([], [])
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(model(x), encoder(x)[-1].mean(dim=(2, 3)), atol=1e-6)


def test_arch_names_and_descriptions():
    assert arch_names() == [*BACKBONES, "timm:<name>"]
    assert all(spec.description and "\n" not in spec.description for spec in BACKBONES.values())
    assert backbone_spec(TIMM_ARCH).has_width is False


@pytest.mark.parametrize(
    ("arch", "width", "size"),
    [("resnet20", 2.0, 32), ("resnet56", 0.25, 8), ("resnet18", 1.0, 32), ("mobilenet_v2", 1.0, 224),
     ("timm:vit_tiny_patch16_224", 1.0, 224)],
)
def test_check_accepts_valid_inputs(arch, width, size):
    check_backbone(arch, width, size)


@pytest.mark.parametrize(
    ("arch", "width", "size", "needle"),
    [
        ("not_a_backbone", 1.0, 32, "resnet20, resnet32"),  # lists the known names
        ("resnet20", 0.0, 32, "width"),
        ("resnet20", -1.0, 32, "width"),
        ("resnet20", math.nan, 32, "width"),
        ("resnet18", 2.0, 32, "resnet18 has no width"),
        ("mobilenet_v2", 0.5, 64, "mobilenet_v2 has no width"),
        (TIMM_ARCH, 2.0, 64, "has no width"),
        ("resnet20", 1.0, 7, "resnet20 cannot take 7 px"),
        ("resnet18", 1.0, 16, "at least 32 px"),
        ("mobilenet_v2", 1.0, 48, "multiples of 32 px"),
        ("mobilenet_v2", 1.0, 16, "mobilenet_v2 cannot take 16 px"),
        ("timm:not_a_model_xyz", 1.0, 32, "'not_a_model_xyz'"),
        ("timm:", 1.0, 32, "timm.list_models"),
        ("timm:vit_tiny_patch16_224", 1.0, 32, "vit_tiny_patch16_224 cannot take 32 px"),
    ],
)
def test_check_rejects_with_one_line(arch, width, size, needle):
    with pytest.raises(BackboneError) as info:
        check_backbone(arch, width, size)
    message = str(info.value)
    assert needle in message
    assert "\n" not in message
    assert isinstance(info.value, ValueError)  # the CLI catches it as a user error


@pytest.mark.parametrize(("arch", "width"), [("not_a_backbone", 1.0), ("resnet18", 2.0), ("resnet20", 0.0),
                                             ("timm:not_a_model_xyz", 1.0)])
def test_create_rejects_what_check_rejects(arch, width):
    with pytest.raises(BackboneError):
        create_backbone(arch, width)


class _Failing(nn.Module):
    num_features = 8

    def forward(self, x):
        raise RuntimeError("first line\n  second line")


def test_dry_run_failures_become_one_line(monkeypatch):
    monkeypatch.setattr(timm, "create_model", lambda *args, **kwargs: _Failing())
    with pytest.raises(BackboneError) as info:
        check_backbone("timm:resnet10t", 1.0, 32)
    assert str(info.value) == "timm:resnet10t cannot take 32 px inputs: RuntimeError: first line second line"
