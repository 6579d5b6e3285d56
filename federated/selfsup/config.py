"""Typed settings of ``federate self-pretrain`` with the defaults of Chen et al., ICLR 2023, App. B.3.

The clients' data, partition and model come from :class:`federated.experiment.FederateConfig` (the fields in
:data:`DATA_FIELDS` and every partition's settings), so both stages draw the same clients with the same flags;
local training, rounds and the method are :class:`SelfPretrainConfig`'s. A dataset's preset may change a
method's settings (``Preset.algos``: Tiny-ImageNet's 256 / 32 clusters), below ``--set``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fpsfl.base.settings import check, group_fields, override, setting

from ..datasets import Preset
from ..experiment import FederateConfig, RunOptions
from . import FED_SSL
from .base import SSLConfig

GROUP = "self-pre-training"
# the FederateConfig fields self-pre-training reads: its data, partition and model groups (every partition's
# own settings beside them), client sampling and seed; the others (rounds, lr, ...) are supervised ones
DATA_FIELDS = (*group_fields(FederateConfig, "data", "partition"), "participation",
               *group_fields(FederateConfig, "model"), "seed")


@dataclass(frozen=True)
class SelfPretrainConfig:
    algo: str = setting("orchestra", lambda: " | ".join(FED_SSL), group=GROUP)
    algo_args: dict[str, Any] = setting(default_factory=dict, cli=False)  # --set overrides
    rounds: int = setting(50, "communication rounds of self-pre-training (App. B.3), after the method's "
                              "warm-up round (Orchestra's round 0 initialises its centroids)",
                          within="[1, inf)", group=GROUP)
    local_epochs: int = setting(5, "local epochs a round (App. B.3)", within="[1, inf)", group=GROUP)
    lr: float = setting(0.003, "local SGD learning rate, constant over the rounds (App. B.3)",
                        within="(0, inf)", group=GROUP)
    batch_size: int = setting(32, "local batch (App. B.3)", within="[2, inf)", group=GROUP)
    momentum: float = setting(0.9, "local SGD momentum (official Orchestra client.py)", within="[0, 1)",
                              group=GROUP)
    weight_decay: float = setting(1e-4, "local weight decay (official Orchestra client.py)",
                                  within="[0, inf)", group=GROUP)

    def __post_init__(self) -> None:
        check(self)
        FED_SSL.lookup(self.algo)

    def method_config(self, preset: Preset) -> SSLConfig:
        """The method's settings: its defaults, then the dataset preset's, then ``algo_args`` (--set)."""
        values = {**preset.algos.get(self.algo, {}), **self.algo_args}
        return override(FED_SSL[self.algo].Config, values, self.algo)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SelfPretrainOptions(RunOptions):
    """federate's run options (the engine and its Flower settings among them), with ``out`` the checkpoint
    and the run directory beside it."""

    out: Path | None = setting(None, "the backbone checkpoint (fpsfl-backbone/1) that federate --init reads",
                               parse=Path, group="run", default_text="sp-<dataset>-<algo>-s<seed>.ckpt")
    run_dir: Path | None = setting(None, "run directory: config.json, metrics.jsonl, partition.json/.png, "
                                         "state.pt", parse=Path, group="run",
                                   default_text="beside --out, sp.ckpt -> sp.run/")
