"""Evaluating combined models under one BatchNorm convention (Chen et al., ICLR 2023, §6; Appendix C).

The convention of every analysis (convex search, loss variance, landscapes) is that of FedAvg: a combined
model's BatchNorm running statistics are the same convex combination of the clients' statistics as its
weights. ``bn_recompute`` instead re-estimates them on training data (a forward pass in train mode with a
cumulative average), which removes the statistics mismatch that averaging can cause.
"""

from __future__ import annotations

from torch import Tensor, nn

from fpsfl.base.batchnorm import recompute_bn

from ..datasets.stream import chunks
from .combine import State


class Evaluator:
    """Loads a state into ``model`` and returns the task's metrics on (x, y), e.g. {"acc", "loss"}.

    ``task`` is a :class:`federated.tasks.Task`; ``recompute`` (raw training images and labels) switches on
    the BatchNorm re-estimation described above.
    """

    def __init__(self, model: nn.Module, task, x: Tensor, y: Tensor,
                 recompute: tuple[Tensor, Tensor] | None = None, batch_size: int = 500):
        self.model, self.task, self.x, self.y = model, task, x, y
        self.recompute, self.batch_size = recompute, batch_size

    def _recompute_batches(self) -> list[Tensor]:
        x, y = self.recompute
        return [self.task.eval_inputs(images, labels)[0] for images, labels in chunks(x, y, self.batch_size)]

    def __call__(self, state: State) -> dict[str, float]:
        self.model.load_state_dict(state)
        if self.recompute is not None:
            recompute_bn(self.model, self._recompute_batches)
        return self.task.evaluate(self.model, self.x, self.y)
