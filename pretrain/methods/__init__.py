"""Pre-training methods, looked up by name (Chen et al., ICLR 2023, §4.2, Table 6).

One file per method, registering its class with ``@METHODS.register``; this package imports them all on the
first lookup (:class:`fpsfl.base.registry.Registry`).
"""

from __future__ import annotations

from fpsfl.base.registry import Registry

from .base import Method, MethodConfig, ViewsConfig, feature_std

METHODS: Registry[type[Method]] = Registry("method", discover="pretrain.methods")

from .simsiam import simsiam_loss  # noqa: E402 (after METHODS: the module registers itself in it)

__all__ = ["METHODS", "Method", "MethodConfig", "ViewsConfig", "feature_std", "simsiam_loss"]
