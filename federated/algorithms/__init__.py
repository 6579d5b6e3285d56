"""FedAvg-family algorithms, looked up by name (Chen et al., ICLR 2023, §4.3, Fig. 4;
NIID-Bench; Hsu et al. 2019/2020).

One small file per algorithm, registering its class with ``@ALGORITHMS.register``; this package imports them
all on the first lookup (:class:`fpsfl.base.registry.Registry`), so a new algorithm touches one file.
"""

from __future__ import annotations

from fpsfl.base.registry import Registry

ALGORITHMS: Registry[type] = Registry("algorithm", discover="federated.algorithms")

from .base import AlgoConfig, ClientContext, ClientResult, FedAvg  # noqa: E402 (registers fedavg)

__all__ = ["ALGORITHMS", "AlgoConfig", "ClientContext", "ClientResult", "FedAvg"]
