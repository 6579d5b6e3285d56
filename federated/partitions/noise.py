"""Feature skew by noise: the IID split, client i's images get Gaussian noise (NIID-Bench, noise-based)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fpsfl.base.settings import setting

from .base import PARTITIONS, PartitionError, PartitionSettings
from .iid import IID


@dataclass(frozen=True)
class NoiseConfig(PartitionSettings):
    noise: float = setting(0.1, "Gaussian noise scale sigma, [0, 1] pixel units: client i of N gets "
                           "sigma * i / N (NIID-Bench feature skew, sigma = 0.1)",
                           within="[0, inf)", group="partition")
    noise_scale: str = setting("std", "what sigma * i / N is: std (the standard deviation, as "
                                      "NIID-Bench's released code draws it) | variance (NIID-Bench's text, "
                                      "Gau(sigma i / N) with variance sigma i / N: std sqrt(sigma i / N))",
                               choices=("std", "variance"), group="partition")


@PARTITIONS.register
class Noise(IID):
    """Feature skew (NIID-Bench, noise-based): the IID split (inherited); :meth:`noise` gives each sigma.

    NIID-Bench's text (§III-B) says Gau(sigma * i / N) has *variance* sigma * i / N; its released code, which
    made its published numbers, multiplies a standard normal by sigma * i / (N - 1), a standard deviation.
    The default (``noise_scale=std``) follows the code's reading (numbers comparable with the published
    ones); ``noise_scale=variance`` is the text's. Chen et al. use no noise partition.
    """

    name = "noise"
    Config = NoiseConfig

    def noise(self, client: int, clients: int) -> float:
        """The noise's standard deviation for ``client`` (0-based): ``sigma * client / clients``, or its
        square root with ``noise_scale=variance``.

        NIID-Bench writes Gau(sigma * i / N) for party i; here i is 0-based, so client 0 is clean and the last
        gets sigma * (N - 1) / N (NIID-Bench's released code divides by N - 1, giving the last client sigma).
        """
        if not 0 <= client < clients:
            raise PartitionError(f"client {client} out of range for {clients} clients")
        level = self.cfg.noise * client / clients
        return math.sqrt(level) if self.cfg.noise_scale == "variance" else level
