"""Federated self-pre-training on Flower (``federate self-pretrain --engine flower``; ``flwr run .`` with run
config ``self-pretrain='orchestra'``): the rounds of :mod:`federated.selfsup.runner`, each client a Flower
ClientApp (Beutel et al. 2020; Chen et al. §5).

:class:`SelfPretrainDispatch` trains a round's clients with one ``train.selfpretrain`` message each (what
it carries: :mod:`.selfsup_node`), through the supervised dispatcher's machinery
(:class:`.server_app.FlowerDispatch`: the book of nodes, each message's ``ttl`` and ``group_id``, replies
matched by id, late replies discarded and named, ``--min-replies``, node-local shards checked against their
manifest). The server trusts no reply: one that answers for another client, reports another sample count
than the server's partition gives that client, or whose model or payload fails the method's
:meth:`~federated.selfsup.base.FederatedSSL.check_update` is refused and its client counted missing, with
the reason in metrics.jsonl. Planning, aggregation (FedAvg, then the method's server step: Orchestra's
global clustering), metrics, checkpoints and ``--resume`` are the in-process engine's code. The clients are
stateless, so nothing waits in a Flower Context between rounds.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid
from tqdm import tqdm

from fpsfl.base.settings import coerce, field_types

from ..aggregate import State
from ..experiment import needed_replies
from ..local import DivergenceError
from ..selfsup import FED_SSL
from ..selfsup.base import ClientUpdate, FederatedSSL
from ..selfsup.config import SelfPretrainConfig, SelfPretrainOptions
from ..selfsup.runner import data_config, run
from ..shards import check_manifest, partition_settings
from . import FlowerError, require_flower
from .dispatch import FlowerDispatch
from .nodes import NodeBook, node_names
from .records import read_update, state_record
from .replies import error_kind
from .run_config import options_from_run_config
from .selfsup_node import SPEC

ACTION = "train.selfpretrain"  # the message type: the ClientApp's @app.train("selfpretrain")
# run config keys that are self-pre-training's (the rest are federate's data, partition and run keys)
SP_KEYS = {"self-pretrain": "algo", "num-server-rounds": "rounds", "local-epochs": "local_epochs", "lr": "lr",
           "batch-size": "batch_size"}


class SelfPretrainDispatch(FlowerDispatch):
    """A :data:`federated.selfsup.rounds.Dispatch` over Flower messages."""

    def __init__(self, grid: Grid, fed, sp: SelfPretrainConfig, opts: SelfPretrainOptions,
                 wait_s: float | None = None):
        super().__init__(grid, opts.device, wait_s=opts.node_wait if wait_s is None else wait_s,
                         timeout_s=opts.flower_timeout, min_replies=opts.min_replies, shards=opts.shards,
                         names=opts.node_names)
        self.fed, self.sp = fed, sp
        self.method: FederatedSSL = FED_SSL[sp.algo](sp.method_config(fed.preset()))
        self.spec = json.dumps({"federate": data_config(fed), "self_pretrain": sp.to_dict()})

    def __call__(self, rnd: int, selected: list[int], global_state: State,  # type: ignore[override]
                 sizes: list[int]) -> tuple[list[ClientUpdate], dict]:
        fed = self.fed
        need = needed_replies(self.min_replies, len(selected))
        if self.manifest is not None and self.expected is None:
            self.expected = check_manifest(self.manifest, partition_settings(fed), str(self.shards), sizes)
        if self.book is None:
            self.book = NodeBook(self.grid, self._exchange, self.wait_s, node_names(self.names, fed.clients))
        nodes = self.book.online(fed.clients, selected, need, f"--min-replies {self.min_replies}")
        arrays = state_record(global_state)
        sent = [c for c in selected if c in nodes]
        config = {"server-round": rnd, "device": self.device, SPEC: self.spec}
        # ttl: an undelivered message dies with its round, so a slow node never runs an abandoned round
        messages = [Message(RecordDict({"arrays": arrays, "config": ConfigRecord({**config, "client": c})}),
                            dst_node_id=nodes[c], message_type=ACTION, ttl=self.timeout_s,
                            group_id=f"sp-{rnd}") for c in sent]
        answers = self._exchange(messages, self.timeout_s, [(c, rnd) for c in sent])
        missing = {c: "no Flower node online" for c in selected if c not in nodes}
        taken: dict[int, ClientUpdate] = {}
        for client, reply in zip(sent, answers, strict=True):
            if reply is None:
                missing[client] = f"no reply within --flower-timeout {self.timeout_s:g} s"
            elif error_kind(reply) == "diverged":
                raise DivergenceError(reply.error.reason)
            elif reply.has_error():
                missing[client] = f"its node reported error {reply.error.code}: {reply.error.reason}"
            else:
                try:
                    taken[client] = self._read(reply, client, sizes[client], global_state)
                except ValueError as exc:
                    missing[client] = f"its reply was refused: {exc}"
        why = "; ".join(f"client {c}: {reason}" for c, reason in sorted(missing.items()))
        if len(taken) < need:
            raise FlowerError(f"self-pretrain round {rnd}: {len(taken)} of {len(selected)} clients replied, "
                              f"--min-replies {self.min_replies} needs {need} ({why}); the rounds before "
                              f"are kept (--resume continues)")
        notes: dict[str, Any] = {}
        if missing:
            tqdm.write(f"federate self-pretrain: round {rnd} goes on without {why}", file=sys.stderr)
            notes["missing_reasons"] = {str(c): reason for c, reason in sorted(missing.items())}
        if self.late_seen:
            notes["late_replies"], self.late_seen = self.late_seen, []
        return [taken[c] for c in selected if c in taken], notes

    def _read(self, reply: Message, client: int, size: int, global_state: State) -> ClientUpdate:
        """The reply as the client's update, once it passes the checks (ValueError: why not, one line)."""
        content = reply.content
        if "arrays" not in content or "metrics" not in content:
            raise ValueError("its reply holds no arrays or metrics")
        metrics = content["metrics"]
        try:
            said, n = int(metrics["client"]), int(metrics["num-examples"])
            stats = {k.removeprefix("stat-"): float(v) for k, v in metrics.items() if k.startswith("stat-")}
        except (KeyError, TypeError, ValueError, OverflowError):
            raise ValueError("its metrics lack client or num-examples") from None
        if said != client:
            raise ValueError(f"its reply is client {said}'s")
        if n != size:  # the FedAvg weight is the server's own count (McMahan et al. 2017, Alg. 1)
            raise ValueError(f"it reports num-examples {n}; the client holds {size}")
        if not all(math.isfinite(v) for v in stats.values()):
            raise ValueError("its statistics are not finite")
        if self.expected is not None:
            node = content["fpsfl.node"] if "fpsfl.node" in content else {}
            if str(node.get("shard-sha256", "")) != self.expected[client]:
                raise ValueError(f"its node did not train on the manifest's shard "
                                 f"{self.expected[client][:16]}")
        device = next(iter(global_state.values())).device
        try:
            state, extra = read_update(content, device)
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"its arrays cannot be read ({type(exc).__name__})") from None
        update = ClientUpdate(client, state, size, extra, stats)
        reason = self.method.check_update(update, global_state)
        if reason:
            raise ValueError(reason)
        return update


def run_simulation(fed, sp: SelfPretrainConfig, opts: SelfPretrainOptions) -> list[dict]:
    """``federate self-pretrain --engine flower``: the run in Flower's simulation runtime, one SuperNode per
    client."""
    require_flower(fed, opts)  # one line, before anything is loaded
    from .engine import simulate  # imports Flower's simulation runtime: only now

    return run(fed, sp, opts, host=lambda rounds: simulate(
        fed, opts, rounds, make_dispatch=lambda grid: SelfPretrainDispatch(grid, fed, sp, opts)))


def serve(grid: Grid, run_config: dict[str, Any]) -> list[dict]:
    """The ServerApp's self-pre-training (``flwr run .`` with ``self-pretrain`` set) on ``grid``."""
    fed, sp, opts = options_from_sp_run_config(run_config)
    return run(fed, sp, opts, host=lambda rounds: rounds(SelfPretrainDispatch(grid, fed, sp, opts)))


def options_from_sp_run_config(run_config: dict[str, Any]):
    """(data/partition config, self-pre-training config, options) of a Flower run config whose
    ``self-pretrain`` names the method: ``num-server-rounds``, ``local-epochs``, ``lr``, ``batch-size`` and
    ``set`` are self-pre-training's (empty: its App. B.3 defaults), ``out`` the checkpoint (its run
    directory beside it), the other keys federate's data, partition, model and run keys."""
    rest = dict(run_config)
    kinds = field_types(SelfPretrainConfig)
    values = {}
    for key, name in SP_KEYS.items():
        value = rest.pop(key, "")
        if not (isinstance(value, str) and value.strip() == ""):
            values[name] = coerce(key, value, kinds[name])
    pairs = [p.partition("=") for p in str(rest.pop("set", "")).split()]
    out = str(rest.pop("out", "") or "")
    fed, opts = options_from_run_config(rest)
    sp = SelfPretrainConfig(**values, algo_args={k.strip(): v.strip() for k, _, v in pairs})
    ckpt = Path(out).expanduser() if out else Path(f"runs/sp-{fed.dataset}-{sp.algo}-s{fed.seed}-flower.ckpt")
    fields = {k: getattr(opts, k) for k in ("device", "resume", "flower_timeout", "min_replies", "shards",
                                            "node_names", "node_wait", "log_rounds", "progress")}
    return fed, sp, SelfPretrainOptions(**fields, engine="flower", out=ckpt,
                                        run_dir=ckpt.with_name(f"{ckpt.stem}.run"))
