"""The Flower engine: the same rounds with each client a Flower ClientApp (Beutel et al. 2020).

Flower (``pip install -e ".[flower]"``) only carries the messages: a client's local training and client
step are :func:`federated.rounds.train_client`, the server's planning, aggregation, evaluation and metrics
are :func:`federated.rounds.plan_round` and :func:`federated.rounds.close_round`, the functions the
in-process engine runs, so both engines give the same run by construction (tests/federated/test_flower.py).

- :mod:`.run_config`: the app's typed run config (``flwr run . --run-config ...``) as federate's config.
- :mod:`.records`: model states (packed: two arrays) and our nested dicts of tensors as Flower records.
- :mod:`.client_app`: the ClientApp (one per client; its state in the Flower ``Context``), lean: it
  imports neither torch nor the run's code, and trains through :mod:`.node` (in its own process, or in a
  warm :mod:`.worker` that keeps torch, the shard and the model loaded across Flower's per-message processes).
- :mod:`.executor`: a SuperNode's tasks in one long-lived process (``--isolation process``): no Flower
  process per message at all (a deployment's default, recipes/flower_deploy.sh).
- :mod:`.node`: a node's work on a message (train, evaluate), and the staging of its client state.
- :mod:`.server_app`: the dispatcher the round loop calls, and the app's ServerApp (``flwr run .``);
  :mod:`.replies` checks every reply, :mod:`.nodes` decides which node serves which client.
- :mod:`.engine`: one machine, Flower's simulation runtime (Ray), for ``federate --engine flower``.
- :mod:`.tls`: self-signed certificates and SuperNode keys for an authenticated deployment.

The engine is chosen at the top: federate's CLI calls :func:`run` here, the Flower app calls
:func:`.server_app.serve`; :mod:`federated.runner` never imports this package (an import-linter contract
in pyproject.toml). Nothing here imports ``flwr`` or torch at module level: a ClientApp process imports this
package first, and every import it makes is paid again in each of Flower's per-message processes.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import TYPE_CHECKING

from fpsfl.base.cli import UsageError

if TYPE_CHECKING:
    from ..datasets import ImageData
    from ..experiment import FederateConfig, RunOptions

EXTRA = "pip install -e '.[flower]'"
# Flower Error codes of this app's replies (Flower's own are 0-8, flwr.common.constant.ErrorCode): a node
# that cannot serve the run (its settings, its shard), a client whose state is gone, a diverged local loss
ERROR_CODES = {"config": 100, "lost": 101, "diverged": 102}


class FlowerError(RuntimeError):
    """A Flower run that cannot go on (a node missing or failing); one line, exit code 1."""


def require_flower(cfg: FederateConfig, opts: RunOptions, data_given: bool = False) -> None:
    """Refuse ``--engine flower`` with one line when it cannot run: Flower (or its Ray backend) missing,
    the centralised baseline (no clients), data given in memory (each ClientApp loads its own), or CUDA
    clients without a GPU share (Ray hides the GPU from actors that ask for none)."""
    from ..experiment import flower_resources

    if find_spec("flwr") is None or find_spec("ray") is None:
        raise UsageError(f"--engine flower needs Flower with its simulation engine: {EXTRA}")
    if cfg.centralized:
        raise UsageError("--engine flower: --centralized trains no clients; use the inprocess engine")
    if opts.shards is not None:
        raise UsageError("--shards: node-local shards are for a deployment (flwr run . on a SuperLink, each "
                         "SuperNode with node config data-dir); the simulation's clients draw the partition")
    if opts.node_names:
        raise UsageError("--node-names binds clients to SuperNodes registered on an authenticated SuperLink "
                         "(flwr run . on a deployment); the simulation's nodes have no names")
    if data_given:
        raise UsageError("--engine flower: each ClientApp loads --dataset itself; data passed in memory is "
                         "for the inprocess engine")
    if opts.device.startswith("cuda") and not flower_resources(opts.flower_resources).get("num_gpus"):
        raise UsageError(f"--device {opts.device} with --engine flower needs a GPU share for each client, "
                         f"e.g. --flower-resources num_cpus=1,num_gpus=0.25")


def run(cfg: FederateConfig, opts: RunOptions, data: ImageData | None = None) -> list[dict]:
    """``federate --engine flower``: the run in Flower's simulation runtime, one SuperNode per client."""
    require_flower(cfg, opts, data is not None)  # one line, before anything is loaded
    from .. import runner
    from .engine import simulate  # imports flwr: only now

    return runner.run(cfg, opts, data, host=lambda resolved, rounds: simulate(resolved, opts, rounds))
