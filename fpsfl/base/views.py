"""The two views' augmentation as settings (MoCo-v2 / SimSiam, Appendix A of Chen et al., ICLR 2023;
Chen et al. 2020, "Improved baselines", §3): what ``pretrain --set`` varies for experiments on harder or
easier views (issue 38) and what ``fractals preview --set`` shows. The defaults are the official FPS code's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .images import AugmentConfig
from .settings import check, setting

_AUGMENT = AugmentConfig()  # the official views: the defaults below are read from it, not restated
_JITTER = _AUGMENT.jitter  # MoCo-v2's colour jitter strengths, which ``jitter`` multiplies


@dataclass(frozen=True)
class ViewSettings:
    """Settings of the views' augmentation, each a ``--set`` key; :meth:`views` makes the augmentation."""

    crop_min: float = setting(_AUGMENT.crop_scale[0], "smallest random crop, as a fraction of the image's "
                              "area (MoCo-v2, SimSiam: 0.2; SimCLR: 0.08)", within="(0, 1]")
    jitter: float = setting(1.0, "colour jitter strength, a multiple of MoCo-v2's (brightness, contrast, "
                                 "saturation 0.4, hue 0.1)", within="[0, 2.5]")
    jitter_p: float = setting(_AUGMENT.jitter_p, "probability of colour jitter (MoCo-v2)", within="[0, 1]")
    grayscale_p: float = setting(_AUGMENT.grayscale_p, "probability of grayscale (MoCo-v2)", within="[0, 1]")
    blur_p: float = setting(_AUGMENT.blur_p, "probability of Gaussian blur (MoCo-v2)", within="[0, 1]")
    flip_p: float = setting(_AUGMENT.flip_p, "probability of a horizontal flip", within="[0, 1]")
    background_p: float = setting(_AUGMENT.background_p, "probability that a view's black canvas gets a "
                                  "random 1/f noise background of its own (fpsfl.base.backgrounds: an "
                                  "experiment of issue 38, docs/pretraining.md; 0: the official views)",
                                  within="[0, 1]")

    def __post_init__(self) -> None:
        check(self, style="key")

    def views(self, default: AugmentConfig = _AUGMENT) -> AugmentConfig:
        """``default`` (its normalisation, ratios and blur sizes kept) with these settings."""
        return dataclasses.replace(
            default, crop_scale=(self.crop_min, 1.0), jitter=tuple(self.jitter * s for s in _JITTER),
            jitter_p=self.jitter_p, grayscale_p=self.grayscale_p, blur_p=self.blur_p, flip_p=self.flip_p,
            background_p=self.background_p)
