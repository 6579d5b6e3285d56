"""``federate --engine flower`` on one machine: Flower's simulation runtime (Beutel et al. 2020, §4).

:func:`simulate` runs the app's ServerApp logic (:func:`.server_app.serve`'s round loop, in this process:
it writes the run directory, as the in-process engine does) and ``cfg.clients`` virtual SuperNodes, each
running :mod:`.client_app` in a Ray actor with the ``--flower-resources`` it asks for
(``num_cpus=1,num_gpus=0``: as many concurrent clients as cores, on the CPU; ``num_gpus=0.5``: two clients
share a GPU). Node ``i`` is client ``i`` (Flower sets its ``partition-id`` node config).

flwr 1.41 (the version tested) offers one in-process entry to its simulation runtime, ``run_simulation``,
and marks it deprecated; the other, ``flwr run .`` (pyproject.toml ``[tool.flwr.app]``), starts a local
SuperLink and runs the app in processes of its own, so its metrics and errors would not come back here.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

from flwr.app import Context
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from ..experiment import FederateConfig, RunOptions, flower_resources
from ..rounds import Dispatch
from .client_app import app as client_app
from .dispatch import dispatch_for


def simulate(cfg: FederateConfig, opts: RunOptions, rounds: Callable[[Dispatch | None], list[dict]],
             make_dispatch: Callable[[Grid], Any] | None = None,
             clients: ClientApp = client_app) -> list[dict]:
    """``rounds(dispatch)`` (the run's round loop) as a ServerApp, with one simulated SuperNode per client
    running ``clients`` (the app's ClientApp; tests wrap it); returns its metrics rows (a
    :data:`federated.runner.Host`). An exception in the round loop reaches the caller as it was raised.
    ``make_dispatch(grid)``: the dispatcher (default: federate's, for these options; self-pre-training's is
    :class:`.selfsup.SelfPretrainDispatch`)."""
    rows: list[dict] = []
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        rows.extend(rounds(make_dispatch(grid) if make_dispatch is not None else dispatch_for(grid, opts)))

    backend = {"client_resources": flower_resources(opts.flower_resources),
               "init_args": {"include_dashboard": False}}
    flwr_log = logging.getLogger("flwr")
    level = flwr_log.level
    if not opts.progress:  # --quiet: Flower's INFO lines too, and its note that run_simulation is deprecated
        flwr_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # Ray's note on accelerator variables
            run_simulation(server_app=server, client_app=clients, num_supernodes=cfg.clients,
                           backend_config=backend)
    finally:
        flwr_log.setLevel(level)
    return rows
