"""The app's ServerApp (``flwr run .``): federate, or federated self-pre-training, with its clients behind
the Grid, through :class:`.dispatch.FlowerDispatch`.

``app`` is the ServerApp of ``flwr run .`` (pyproject.toml ``[tool.flwr.app]``): it reads federate's
settings from the typed run config (:mod:`.run_config`) and runs :func:`federated.runner.run` on the Grid.
"""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ..experiment import FederateConfig, RunOptions
from ..runner import run
from .dispatch import FlowerDispatch, dispatch_for
from .run_config import options_from_run_config

__all__ = ["FlowerDispatch", "app", "dispatch_for", "serve"]


def serve(grid: Grid, cfg: FederateConfig, opts: RunOptions) -> list[dict]:
    """federate's run with its clients behind ``grid``; its metrics rows."""
    return run(cfg, opts, host=lambda _cfg, rounds: rounds(dispatch_for(grid, opts)))


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """The ServerApp of ``flwr run .``: federate with the settings of the Flower run config, or federated
    self-pre-training when its ``self-pretrain`` key names a method (:mod:`.selfsup`)."""
    run_config = dict(context.run_config)
    if str(run_config.get("self-pretrain") or "").strip():
        from .selfsup import serve as serve_self_pretrain

        serve_self_pretrain(grid, run_config)
        return
    cfg, opts = options_from_run_config(run_config)
    serve(grid, cfg, opts)
