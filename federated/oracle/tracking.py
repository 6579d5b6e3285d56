"""Per-round analyses inside a federated run: optimal convex aggregation and loss variance over lambda.

Chen et al., ICLR 2023, §6.2 (Eq. 4, Figs. 7, 8, 13, 18). Every ``every`` rounds the round's local models
are combined (BatchNorm statistics with the same weights, as FedAvg does; or re-estimated on training data
with ``bn_recompute``) and:

* ``convex``: FedAvg's accuracy, the optimal-convex accuracy and lambda* (an *oracle* on the test set, as
  in the paper; ``data="val"`` searches on the validation split instead);
* ``variance``: the test loss of ``variance_samples`` combinations with lambda ~ Dirichlet(1): mean, 95%
  interval, variance and the losses themselves (for histograms).

``aggregation="optimal-convex"`` makes lambda* the aggregation of every round (Fig. 7's dashed curves):
the algorithm's own aggregate is still computed, so its server state stays updated, then replaced.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from fpsfl.base.cli import comma_list
from fpsfl.base.settings import check, setting

from .combine import State, combine, loss_summary
from .convex import ConvexConfig, loss_variance, optimal_convex
from .evaluate import Evaluator

TRACKS = ("convex", "variance")
AGGREGATIONS = ("algo", "optimal-convex")


@dataclass(frozen=True)
class TrackConfig:
    """What ``federate --track`` logs, and the settings of the convex search and the loss variance that
    ``analyze convex|variance`` share (the ``search`` group)."""

    track: tuple[str, ...] = setting((), f"log these analyses every --track-every rounds: "
                                         f"{', '.join(TRACKS)}", parse=comma_list(str), metavar="A,B",
                                     choices=TRACKS, group="tracking", default_text="none")
    every: int = setting(10, "rounds between tracked rounds", flag="--track-every", within="[1, inf)",
                         metavar="K", group="tracking")
    aggregation: str = setting("algo", "algo: the algorithm's own aggregation; optimal-convex: aggregate "
                                       "every round with the searched lambda* (oracle, Fig. 7's dashed "
                                       "curves)", choices=AGGREGATIONS, group="tracking")
    data: str = setting("test", "data of the convex search: test (the paper's oracle) or val",
                        flag="--convex-data", choices=("test", "val"), group="search")
    variance_samples: int = setting(300, "lambda ~ Dirichlet(1) draws per tracked round (§6.2, Fig. 8: the "
                                         "paper's 300)", within="[1, inf)", group="search")
    bn_recompute: bool = setting(False, "re-estimate combined models' BatchNorm statistics on 2,000 training "
                                        "images instead of averaging them (slower)", group="search")
    bn_samples: int = setting(2000, cli=False, within="[1, inf)")  # training images for that re-estimation
    convex_lr: float = setting(ConvexConfig.lr, "SGD lr of the search on w, lambda = softmax(w) (Appendix "
                                                "B.2)", within="(0, inf)", group="search")
    convex_epochs: int = setting(ConvexConfig.epochs, "search epochs over its data (Appendix B.2)",
                                 within="[1, inf)", group="search")
    convex_batch: int = setting(ConvexConfig.batch_size, "search batch size (Appendix B.2)",
                                within="[1, inf)", group="search")
    convex_starts: int = setting(ConvexConfig.random_starts, "Dirichlet(1) starts besides uniform and "
                                                             "FedAvg's weights", within="[0, inf)",
                                 group="search")

    def __post_init__(self) -> None:
        check(self)

    @property
    def active(self) -> bool:
        return bool(self.track) or self.aggregation == "optimal-convex"

    def convex(self, seed: int) -> ConvexConfig:
        return ConvexConfig(lr=self.convex_lr, epochs=self.convex_epochs, batch_size=self.convex_batch,
                            random_starts=self.convex_starts, seed=seed)


class Tracker:
    """Runs the configured analyses on a round's local models; built once per run."""

    def __init__(self, cfg: TrackConfig, model: torch.nn.Module, task, data, seed: int):
        if cfg.data == "val" and len(data.val_y) == 0:
            raise ValueError("--convex-data val needs a validation split; set --val-fraction above 0")
        self.cfg, self.task, self.seed = cfg, task, seed
        self.model = copy.deepcopy(model)
        recompute = None
        if cfg.bn_recompute:
            pick = torch.randperm(len(data.train_y), generator=torch.Generator().manual_seed(seed))
            pick = pick[:cfg.bn_samples].sort().values.to(data.train_y.device)
            recompute = (data.train_x[pick], data.train_y[pick])
        self.search_x, self.search_y = (data.test_x, data.test_y) if cfg.data == "test" else (data.val_x,
                                                                                              data.val_y)
        self.on_search = Evaluator(self.model, task, self.search_x, self.search_y, recompute)
        self.on_test = Evaluator(self.model, task, data.test_x, data.test_y, recompute)

    def due(self, rnd: int) -> bool:
        """Whether round ``rnd`` (1-based) runs the analyses (every round under optimal-convex)."""
        every_round = self.cfg.aggregation == "optimal-convex"
        return every_round or (bool(self.cfg.track) and rnd % self.cfg.every == 0)

    def _batches(self, rnd: int):
        def batches(epoch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
            gen = torch.Generator().manual_seed(int(np.random.SeedSequence([self.seed, rnd, epoch, 7])
                                                    .generate_state(1)[0]))
            order = torch.randperm(len(self.search_y), generator=gen).to(self.search_y.device)
            size = self.cfg.convex_batch
            return [self.task.eval_inputs(self.search_x[order[i:i + size]], self.search_y[order[i:i + size]])
                    for i in range(0, len(order), size)]
        return batches

    def __call__(self, rnd: int, states: list[State], sizes: list[int]) -> tuple[dict, State | None]:
        """(metrics to log, the state to aggregate to or None) for round ``rnd`` (1-based)."""
        record: dict = {}
        override = None
        track_convex = "convex" in self.cfg.track and rnd % self.cfg.every == 0
        if track_convex or self.cfg.aggregation == "optimal-convex":
            result = optimal_convex(self.model, states, sizes, self.on_search, self.task.loss,
                                    self._batches(rnd), self.cfg.convex(self.seed + rnd))
            if track_convex:
                record["convex"] = {k: v for k, v in result.items() if k != "candidates"} | {
                    "data": self.cfg.data, "candidates": result["candidates"]}
            if self.cfg.aggregation == "optimal-convex":
                override = combine(states, result["lambda"])
        if "variance" in self.cfg.track and rnd % self.cfg.every == 0:
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, rnd, 11]))
            losses = loss_variance(states, self.on_test, self.cfg.variance_samples, rng)
            record["variance"] = {**loss_summary(losses), "losses": losses}
        return record, override


# the settings of the convex search and the loss variance, which analyze convex|variance share
SEARCH = tuple(f.name for f in dataclasses.fields(TrackConfig) if f.metadata.get("group") == "search")
