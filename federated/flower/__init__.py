"""``federate --engine flower``: the same rounds with each client a Flower ClientApp (Beutel et al. 2020).

Flower (``pip install -e ".[flower]"``) only carries the messages: a client's local training and client
step are :func:`federated.rounds.train_client`, the server's planning, aggregation, evaluation and metrics
are :func:`federated.rounds.plan_round` and :func:`federated.rounds.close_round`, the functions the
in-process engine runs, so both engines give the same run by construction (tests/federated/test_flower.py).

- :mod:`.records`: our tensors and nested dicts as Flower records.
- :mod:`.client_app`: the ClientApp (one per client; its state in the Flower ``Context``).
- :mod:`.server_app`: the dispatcher the round loop calls, and the ServerApp of a deployment.
- :mod:`.engine`: one machine, Flower's simulation engine (Ray).

Nothing here imports ``flwr`` at module level: this package is loaded only once the engine is chosen.
"""

from __future__ import annotations

from importlib.util import find_spec

from fpsfl.base.cli import UsageError

from ..experiment import FederateConfig, RunOptions, flower_resources

EXTRA = "pip install -e '.[flower]'"


class FlowerError(RuntimeError):
    """A Flower run that cannot go on (a node missing or failing); one line, exit code 1."""


def require_flower(cfg: FederateConfig, opts: RunOptions, data_given: bool = False) -> None:
    """Refuse ``--engine flower`` with one line when it cannot run: Flower (or its Ray backend) missing,
    the centralised baseline (no clients), data given in memory (each ClientApp loads its own), or CUDA
    clients without a GPU share (Ray hides the GPU from actors that ask for none)."""
    if find_spec("flwr") is None or find_spec("ray") is None:
        raise UsageError(f"--engine flower needs Flower with its simulation engine: {EXTRA}")
    if cfg.centralized:
        raise UsageError("--engine flower: --centralized trains no clients; use the inprocess engine")
    if data_given:
        raise UsageError("--engine flower: each ClientApp loads --dataset itself; data passed in memory is "
                         "for the inprocess engine")
    if opts.device.startswith("cuda") and not flower_resources(opts.flower_resources).get("num_gpus"):
        raise UsageError(f"--device {opts.device} with --engine flower needs a GPU share for each client, "
                         f"e.g. --flower-resources num_cpus=1,num_gpus=0.25")
