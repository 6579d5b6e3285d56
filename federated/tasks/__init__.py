"""Tasks by name: what a dataset's ``task`` field builds (Chen et al., ICLR 2023, §4.2 and Table 5).

One file per task (:mod:`.classification`, :mod:`.segmentation`), each registering a builder
``(ImageData, FederateConfig) -> Task`` with ``@TASKS.register``; :mod:`.base` is the interface the round loop
and the algorithms use, :mod:`.transforms` the batched augmentation on the training device.
"""

from __future__ import annotations

from fpsfl.base.registry import Registry

TASKS: Registry = Registry("task", discover="federated.tasks")

from .base import Task  # noqa: E402
from .classification import ClassificationTask, Classifier  # noqa: E402 (registers classification)

__all__ = ["TASKS", "ClassificationTask", "Classifier", "Task"]
