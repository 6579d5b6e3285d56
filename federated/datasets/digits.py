"""scikit-learn's 8 x 8 digits upsampled to 32 px: embedded, needs no files, the default for smoke runs.

Not a dataset of Chen et al., ICLR 2023; it stands in for CIFAR-10 (same 32 px side and ResNet20) where no
data can be downloaded. Horizontal flips are off: a mirrored 2 is no 2.
"""

from __future__ import annotations

from pretrain.probe import digits

from . import DataConfig, Preset, register_dataset
from .decode import Loaded


# Not in the paper. A digits client holds ~140 images, so batch 32 would give ~4 local steps a round;
# batch 8 and lr 0.02 were picked by a small sweep on digits (lr 0.01-0.1, batch 8-32).
@register_dataset(
    "digits", store_size=32, input_size=32, needs_root=False,
    description="scikit-learn's 8x8 digits at 32 px, embedded (1,437 train / 360 test)",
    preset=Preset(0.02, 8, "sgd"), hflip=False,
)
def read_digits(cfg: DataConfig, size: int) -> Loaded:
    """sklearn's 1,797 digits at ``size`` px (:func:`pretrain.probe.digits`, shared with ``pretrain
    --probe``); the config has nothing to add: the images are embedded in scikit-learn."""
    return Loaded(*digits(size), [str(d) for d in range(10)])
