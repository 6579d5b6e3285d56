"""scikit-learn's 8 x 8 digits upsampled to 32 px: embedded, needs no files, the default for smoke runs.

Not a dataset of Chen et al., ICLR 2023; it stands in for CIFAR-10 (same 32 px side and ResNet20) where no
data can be downloaded. Horizontal flips are off: a mirrored 2 is no 2.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from . import DataConfig, Preset, register_dataset
from .decode import Loaded

DIGITS_TEST = 0.2  # share of sklearn's 1,797 digits in the fixed test set
DIGITS_LEVELS = 16  # sklearn's digits take values 0..16


# Not in the paper. A digits client holds ~140 images, so batch 32 would give ~4 local steps a round;
# batch 8 and lr 0.02 were picked by a small sweep on digits (lr 0.01-0.1, batch 8-32).
@register_dataset(
    "digits", store_size=32, input_size=32, needs_root=False,
    description="scikit-learn's 8x8 digits at 32 px, embedded (1,437 train / 360 test)",
    preset=Preset(0.02, 8, "sgd"), hflip=False,
)
def read_digits(cfg: DataConfig, size: int) -> Loaded:
    """sklearn's 1,797 digits, upsampled (bilinear) to size px grey RGB, 0..255; a fixed stratified 80/20
    split (seed 0 whatever the config's seed, so the test set never changes). The config has nothing to
    add: the images are embedded in scikit-learn."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.from_numpy(digits.images).float()[:, None] * (255 / DIGITS_LEVELS)  # (N, 1, 8, 8)
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = x.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).expand(-1, -1, -1, 3).contiguous()
    y = torch.from_numpy(digits.target.astype(np.int64))
    train, test = train_test_split(np.arange(len(y)), test_size=DIGITS_TEST, stratify=digits.target,
                                   random_state=0)
    train, test = torch.from_numpy(np.sort(train)), torch.from_numpy(np.sort(test))
    return Loaded(x[train], y[train], x[test], y[test], [str(d) for d in range(10)])
