"""Learning-rate schedules of pre-training, one value per epoch (the official SimSiam and MoCo-v2 code step
the rate once an epoch: ``adjust_learning_rate`` at each epoch's start).

``cosine`` is the paper's (Chen et al., ICLR 2023, App. A.2, after SimSiam §4 and MoCo-v2): the base rate
decays to 0 over the run's epochs. ``constant`` keeps the base rate throughout: issue 38's experiment in
which the backbone keeps turning while MoCo-v2's heads spread (docs/pretraining.md, "A constant learning
rate"), the horizon no longer set by ``--epochs``, so one long run's ``--keep-every`` checkpoints are the
same schedule at every budget.

``warmup`` scales any of them by a linear rise over the run's first epochs, set every step (SimCLR, Chen et
al. 2020, warms up over its first 10 epochs): issue 38's last candidate, which asks whether the first steps
at a small init turn the backbone by noise while the heads are still random.
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


def warmup(progress: float, epochs: float) -> float:
    """The warm-up's factor after ``progress`` epochs of training (fractional: steps / steps per epoch):
    rising linearly to 1 at ``epochs``, 1 from then on and throughout when ``epochs`` is 0."""
    if epochs <= 0:
        return 1.0
    return min(1.0, max(progress, 0.0) / epochs)


LR_SCHEDULES: dict[str, Callable[[float, int, int], float]] = {"cosine": cosine_lr, "constant": constant_lr}

__all__ = ["LR_SCHEDULES", "constant_lr", "cosine_lr", "warmup"]
