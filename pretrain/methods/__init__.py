"""Pre-training methods, looked up by name (Chen et al., ICLR 2023, §4.2, Table 6)."""

from __future__ import annotations

from .base import Method, MethodConfig, feature_std
from .mocov2 import MoCoV2
from .multilabel import MultiLabel
from .simsiam import SimSiam, simsiam_loss
from .supervised import Supervised

METHODS: dict[str, type[Method]] = {m.name: m for m in (SimSiam, MoCoV2, MultiLabel, Supervised)}

__all__ = ["METHODS", "Method", "MethodConfig", "feature_std", "simsiam_loss"]
