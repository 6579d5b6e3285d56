"""Federated simulation with FedAvg-family algorithms (Chen et al., ICLR 2023, §4.2-4.4)."""

import fpsfl.base  # noqa: F401,E402 (sets the OpenMP wait before torch loads: see fpsfl.base)
