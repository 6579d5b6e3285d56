"""Learning-rate schedules of pre-training, one value per epoch (the official SimSiam and MoCo-v2 code step
the rate once an epoch: ``adjust_learning_rate`` at each epoch's start).

``cosine`` is the paper's (Chen et al., ICLR 2023, App. A.2, after SimSiam §4 and MoCo-v2): the base rate
decays to 0 over the run's epochs. ``constant`` keeps the base rate throughout: issue 38's experiment in
which the backbone keeps turning while MoCo-v2's heads spread (docs/pretraining.md, "A constant learning
rate"), the horizon no longer set by ``--epochs``, so one long run's ``--keep-every`` checkpoints are the
same schedule at every budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable


def cosine_lr(base: float, epoch: int, epochs: int) -> float:
    """Learning rate of ``epoch`` (0-based): base * (1 + cos(pi * epoch / epochs)) / 2 (SimSiam, MoCo-v2)."""
    return base * 0.5 * (1.0 + math.cos(math.pi * epoch / epochs))


def constant_lr(base: float, epoch: int, epochs: int) -> float:
    """The base rate at every epoch."""
    return base


LR_SCHEDULES: dict[str, Callable[[float, int, int], float]] = {"cosine": cosine_lr, "constant": constant_lr}

__all__ = ["LR_SCHEDULES", "constant_lr", "cosine_lr"]
