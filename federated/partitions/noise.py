"""Feature skew by noise: the IID split, client i's images get Gaussian noise (NIID-Bench, noise-based)."""

from __future__ import annotations

from dataclasses import dataclass

from fpsfl.base.settings import setting

from .base import PARTITIONS, PartitionError, PartitionSettings
from .iid import IID


@dataclass(frozen=True)
class NoiseConfig(PartitionSettings):
    noise: float = setting(0.1, "Gaussian noise scale sigma, [0, 1] pixel units: client i of N gets "
                           "sigma * i / N (NIID-Bench feature skew, sigma = 0.1)",
                           within="[0, inf)", group="partition")


@PARTITIONS.register
class Noise(IID):
    """Feature skew (NIID-Bench, noise-based): the IID split (inherited); :meth:`noise` gives each sigma."""

    name = "noise"
    Config = NoiseConfig

    def noise(self, client: int, clients: int) -> float:
        """``sigma * client / clients`` for ``client`` (0-based).

        NIID-Bench writes Gau(sigma * i / N) for party i; here i is 0-based, so client 0 is clean and the last
        gets sigma * (N - 1) / N (NIID-Bench's released code divides by N - 1, giving the last client sigma).
        """
        if not 0 <= client < clients:
            raise PartitionError(f"client {client} out of range for {clients} clients")
        return self.cfg.noise * client / clients
