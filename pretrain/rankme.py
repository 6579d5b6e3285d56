"""A label-free quality signal while pre-training: RankMe on a fixed held-out batch of fractal views.

Garrido et al., ICML 2023 ("RankMe"): the effective rank of a backbone's features on unseen inputs tracks
how well they transfer, without labels. FPS pre-training (Chen et al., ICLR 2023, §4.2) sees no natural
image, so ``pretrain`` logs ``rankme`` beside ``z_std`` every epoch (``rankme_init`` before training) and
says in one line when it falls steadily. It only reports: training goes on.
"""

from __future__ import annotations

import torch
from torch import nn

from fractals.stream import augment_views

from .signals import centred_rank

RANK_PAIRS = 256  # held-out pairs: 512 views, more than any backbone's feature width here (64 / 512)
RANK_SEED = 0x5A4C  # seed of the held-out views' augmentation, fixed so every epoch sees the same views
FALL_EPOCHS = 3  # "falls steadily": lower after each of this many epochs in a row ...
FALL_DROP = 0.05  # ... and by at least this fraction overall


class RankWatch:
    """Embeds the same augmented held-out views after every epoch and keeps the RankMe history."""

    def __init__(self, renders: torch.Tensor, n_views: int, augment, device: torch.device):
        gen = torch.Generator(device=device).manual_seed(RANK_SEED)
        views = augment_views(renders.to(device), n_views, augment, gen)  # (V, B, 3, S, S)
        self.views = views.flatten(0, 1)
        self.history: list[float] = []

    @torch.no_grad()
    def measure(self, backbone: nn.Module) -> float:
        """RankMe of ``backbone``'s eval-mode features on the held-out views, centred (a random init's
        uncentred RankMe is already ~5 from the features' mean direction alone); appended to the
        history."""
        was_training = backbone.training
        backbone.eval()
        dtype = next(backbone.parameters()).dtype
        feats = torch.cat([backbone(chunk.to(dtype)).float() for chunk in self.views.split(256)])
        backbone.train(was_training)
        rank = centred_rank(feats.cpu())
        self.history.append(rank)
        return rank


def falling(history: list[float], epochs: int = FALL_EPOCHS, drop: float = FALL_DROP) -> bool:
    """Whether the last ``epochs`` values each fell below the one before, by ``drop`` overall."""
    if len(history) <= epochs:
        return False
    tail = history[-epochs - 1:]
    steady = all(b < a for a, b in zip(tail, tail[1:], strict=False))
    return steady and tail[-1] < (1.0 - drop) * tail[0]
