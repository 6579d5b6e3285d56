"""fractals: the synthetic-data engine of fpsfl.

IFS code sampling (Anderson & Farrell 2022) and a numba renderer that makes Fractal Pair Similarity (FPS)
pairs on the fly (Chen et al., ICLR 2023, §4.2, Appendix A.1), plus the multi-label and single-fractal
baselines and the image-level augmentations used for self-supervised pre-training.
"""

from .ifs import BankError, CodeBank, load_bank, sample_codes, save_bank
from .scenes import RenderConfig, fps_pairs, multilabel_images, render_batch, single_images

__all__ = [
    "BankError",
    "CodeBank",
    "RenderConfig",
    "fps_pairs",
    "load_bank",
    "multilabel_images",
    "render_batch",
    "sample_codes",
    "save_bank",
    "single_images",
]
