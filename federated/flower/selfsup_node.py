"""A Flower node's round of federated self-pre-training (``federate self-pretrain``; Chen et al. §5), the
``train.selfpretrain`` messages of :mod:`.selfsup`.

- in: ``arrays`` (the global model, an ArrayRecord: the online and target networks, the heads and, for
  Orchestra, its global ``centroids``) and ``config`` (``server-round``: 0 is Orchestra's warm-up round;
  ``client``, else the node's ``partition-id``; ``fpsfl-self-pretrain``: the run's data, partition and
  self-pre-training settings as JSON; ``device``).
- out: ``arrays`` (the local model), ``metrics`` (``num-examples``, ``client``, the method's statistics as
  ``stat-NAME``), the method's payload as the tree ``fpsfl.extra`` (Orchestra's ``local_centroids``, an
  ArrayRecord), and ``fpsfl.node`` (the shard's sha256) on a node with a shard.

The client is stateless (the configuration Chen et al. use, App. B.3): everything it needs arrives with the
message, so it keeps nothing in its Flower Context and there is no state to stage or commit. Its work is
:func:`federated.selfsup.rounds.client_run` and :func:`~federated.selfsup.rounds.train_client`, the in-process
engine's functions, on its own images: the node's shard of ``federate export-partitions`` with ``data-dir``
in its node config (only that file is read), otherwise its partition drawn from the whole dataset as the
server draws it. The labels never leave the shard.
"""

from __future__ import annotations

import json

import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from fpsfl.base.device import resolve_device
from pretrain.backbones import create_backbone

from ..experiment import FederateConfig
from ..local import DivergenceError
from ..selfsup import FED_SSL
from ..selfsup.config import SelfPretrainConfig
from ..setup import partitioned
from ..shards import ShardError, check_manifest, load_shard, partition_settings
from .phases import Phases
from .records import EXTRA, is_packed, put_tree, read_state, state_record
from .refusal import Refused, error_reply

SPEC = "fpsfl-self-pretrain"  # the config key holding the run's settings
_DATA: dict[str, tuple] = {}  # this process's dataset and partition (one: the data load is slow)
_NODE: dict[str, tuple] = {}  # this process's method, model and client images


def train(msg: Message, context: Context, phases: Phases | None = None) -> Message:
    """One round of self-pre-training for the client the message names (default: this node's)."""
    from ..selfsup.rounds import client_run, train_client

    phases = phases or Phases("inline")
    config = msg.content["config"]
    try:
        fed, sp = configs(config)
        client = int(config.get("client", context.node_config.get("partition-id", -1)))
        device = resolve_device(str(context.node_config.get("device", config.get("device", "auto"))))
        method, model, images, size, sha256 = _node(fed, sp, context.node_config, client, device, phases)
        global_state = read_state(msg.content["arrays"], device)
        run = client_run(fed, sp, int(config["server-round"]), client, images, size)
        update = train_client(method, model, global_state, run)
    except Refused as exc:
        return error_reply(msg, exc.kind, exc.reason)
    except DivergenceError as exc:
        return error_reply(msg, "diverged", str(exc))
    phases.mark("train")
    metrics = {"num-examples": update.n_samples, "client": client,
               **{f"stat-{k}": float(v) for k, v in update.stats.items()}}
    reply = RecordDict({"arrays": state_record(update.state, packed=is_packed(msg.content["arrays"])),
                        "metrics": MetricRecord(metrics)})
    put_tree(reply, EXTRA, update.extra)
    if sha256 is not None:  # which data it trained on: the server checks it against its manifest
        reply["fpsfl.node"] = ConfigRecord({"shard-sha256": sha256})
    phases.mark("reply")
    return Message(reply, reply_to=msg)


def configs(config: ConfigRecord) -> tuple[FederateConfig, SelfPretrainConfig]:
    """The run's data/partition config and self-pre-training config from a message's ``config``."""
    try:
        spec = json.loads(str(config[SPEC]))
        return FederateConfig.from_dict(spec["federate"]), SelfPretrainConfig(**spec["self_pretrain"])
    except (KeyError, TypeError, ValueError) as exc:
        raise Refused("config", f"the message's {SPEC} settings are not usable ({exc})") from None


def _node(fed: FederateConfig, sp: SelfPretrainConfig, node_config: dict, client: int, device: torch.device,
          phases: Phases) -> tuple:
    """(method, model, the client's images on ``device``, input size, shard sha256 or None), built once per
    settings in this process."""
    values = fed.to_dict()
    if node_config.get("data-root"):
        values["data_root"] = str(node_config["data-root"])
    data_dir = str(node_config.get("data-dir") or "")
    key = json.dumps([values, sp.to_dict(), str(device), data_dir, client], sort_keys=True, default=str)
    if key not in _NODE:
        _NODE.clear()
        fed = FederateConfig.from_dict(values)
        try:
            if data_dir:
                shard = load_shard(data_dir, client)
                check_manifest(shard.manifest, partition_settings(fed), data_dir)
                data, images, sha256 = shard.data, shard.data.train_x, shard.sha256
            else:
                data_key = json.dumps(values, sort_keys=True, default=str)
                if data_key not in _DATA:  # a simulated node serves one client after another
                    _DATA.clear()
                    _DATA[data_key] = partitioned(fed)
                data, _, parts = _DATA[data_key]
                if not 0 <= client < len(parts):
                    raise Refused("config", f"this node serves client {client}, which a {len(parts)}-client "
                                            f"partition does not have (node config partition-id)")
                images, sha256 = data.train_x[torch.as_tensor(parts[client])], None
        except ShardError as exc:
            raise Refused("config", str(exc)) from None
        phases.mark("data")
        size = fed.input_size or data.input_size
        method = FED_SSL[sp.algo](sp.method_config(fed.preset()))
        model = method.build(create_backbone(fed.arch, fed.width), size)
        model = model.to(device, memory_format=torch.channels_last)  # the server's layout: the same sums
        _NODE[key] = (method, model, images.to(device), size, sha256)
        phases.mark("model")
    return _NODE[key]
