"""Tasks by name: what a dataset's ``task`` field builds (Chen et al., ICLR 2023, §4.2 and Table 5)."""

from __future__ import annotations

from collections.abc import Callable

from .datasets import ImageData
from .experiment import FederateConfig
from .segmentation import SegmentationTask
from .task import ClassificationTask, Task


def parse_size(text: str) -> tuple[int, int]:
    """'1024x2048' (height x width) or '512' (square) -> (h, w)."""
    parts = text.lower().split("x")
    try:
        h, w = (int(parts[0]), int(parts[-1])) if len(parts) in (1, 2) else (0, 0)
    except ValueError:
        h = w = 0
    if h <= 0 or w <= 0:
        raise ValueError(f"--eval-size expects HxW such as 1024x2048, got {text!r}")
    return h, w


def _classification(data: ImageData, cfg: FederateConfig) -> Task:
    return ClassificationTask(data.n_classes, cfg.input_size or data.input_size, data.hflip)


def _segmentation(data: ImageData, cfg: FederateConfig) -> Task:
    native = tuple(data.test_y.shape[1:])
    eval_size = parse_size(cfg.eval_size) if cfg.eval_size else native
    return SegmentationTask(data.n_classes, cfg.crop_size or data.input_size, eval_size)


TASKS: dict[str, Callable[[ImageData, FederateConfig], Task]] = {
    "classification": _classification,
    "segmentation": _segmentation,
}
