"""FedAvg-family algorithms, looked up by name (Chen et al., ICLR 2023, §4.3, Table 9)."""

from __future__ import annotations

from .base import AlgoConfig, ClientContext, ClientResult, FedAvg
from .fedavgm import FedAvgM
from .feddyn import FedDyn
from .fedir import FedIR
from .fednova import FedNova
from .fedprox import FedProx
from .fedvc import FedVC
from .moon import Moon
from .scaffold import Scaffold

ALGORITHMS: dict[str, type[FedAvg]] = {
    a.name: a for a in (FedAvg, FedProx, FedDyn, Moon, Scaffold, FedNova, FedAvgM, FedVC, FedIR)
}

__all__ = ["ALGORITHMS", "AlgoConfig", "ClientContext", "ClientResult", "FedAvg"]
