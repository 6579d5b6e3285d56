"""segmentation-models-pytorch's MobileNetV2 encoder (Sandler et al. 2018), the DeepLabV3+ encoder of Chen
et al., ICLR 2023, Table 5 (Cityscapes)."""

from __future__ import annotations

from functools import cache

from torch import Tensor, nn

from . import register_backbone


@cache
def _backbone_class() -> type[nn.Module]:
    """The class, built on first use: smp (and the timm it imports) load only when it is needed."""
    from segmentation_models_pytorch.encoders import encoders as smp_encoders

    smp_mobilenet = smp_encoders["mobilenet_v2"]

    class MobileNetV2Backbone(smp_mobilenet["encoder"]):
        """smp's MobileNetV2 encoder returning pooled last-stage features.

        Its modules are the encoder's, so ``state_dict()`` has exactly the keys of
        ``smp.DeepLabV3Plus(encoder_name="mobilenet_v2").encoder`` and loads there with strict=True.
        """

        def __init__(self):
            super().__init__(**smp_mobilenet["params"])
            self.feature_dim: int = self._out_channels[-1]  # 1280: the final 1x1 convolution of MobileNetV2

        def forward(self, x: Tensor) -> Tensor:  # (B, 3, S, S) -> (B, 1280)
            return self.features(x).mean(dim=(2, 3))  # features: (B, 1280, S/32, S/32)

        def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
            """As the smp encoder (ImageNet classifier keys are dropped), but returning torch's missing and
            unexpected keys, which smp's override discards."""
            state_dict = {k: v for k, v in state_dict.items() if not k.startswith("classifier.")}
            return nn.Module.load_state_dict(self, state_dict, strict=strict, assign=assign)

    return MobileNetV2Backbone


# size_multiple 32 keeps the features aligned with the DeepLabV3+ decoder that reuses this encoder
@register_backbone("mobilenet_v2", min_size=32, size_multiple=32,
                   description="smp MobileNetV2 encoder of DeepLabV3+, 2.2M params (Sandler et al. 2018)")
def mobilenet_v2(width: float) -> nn.Module:
    return _backbone_class()()
