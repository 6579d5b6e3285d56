"""torchvision's ResNet18 (He et al., CVPR 2016), the 224 px backbone of Chen et al., ICLR 2023, §4.2."""

from __future__ import annotations

from torch import nn

from . import register_backbone


@register_backbone("resnet18", min_size=32, description="torchvision ResNet18 without fc, 11.2M params "
                                                        "(He et al. 2016)")
def resnet18(width: float) -> nn.Module:
    """torchvision's ResNet18 with ``fc`` an identity: its keys are torchvision's minus ``fc.*``, so
    torchvision ImageNet weights load with strict=False and only the fc keys unexpected."""
    import torchvision  # here, not at import: ~0.4 s that naming the registry should not cost

    model = torchvision.models.resnet18(weights=None)
    model.fc = nn.Identity()
    model.feature_dim = model.inplanes  # 512: channels of layer4, pooled by the model's avgpool
    return model
