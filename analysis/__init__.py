"""Analyses of federated runs that explain why pre-training helps (Chen et al., ICLR 2023, §6)."""

import fpsfl.base  # noqa: F401,E402 (sets the OpenMP wait before torch loads: see fpsfl.base)
