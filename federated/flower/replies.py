"""A client's Flower train reply, read and checked: the server trusts no reply (issue 31).

A reply comes from another process, maybe another machine, and may be wrong by a bug, a fault or intent.
Nothing it says is believed where the server knows better, and nothing in it reaches the aggregate (or,
through it, state.pt) unchecked. A reply is refused (:class:`Refused`, one line; the round then counts its
client as missing, with that reason in metrics.jsonl) when:

- it answers for another client than the message named;
- its ``num-examples`` is not what the server sent the client (the FedAvg weight, McMahan et al. 2017,
  Alg. 1, is the server's own count, so one reply of 10^12 cannot become the global model, and a negative
  one cannot push the average past every client), or its ``steps`` are not the steps the server's own
  batching of those examples makes (FedNova divides by them, Wang et al. 2020);
- its loss is not finite, its node trained on a shard that is not the manifest's (``shards``);
- its arrays are not the global model's keys, shapes and dtypes, or not finite, or its payload is not
  what the algorithm expects (:meth:`federated.algorithms.FedAvg.check_result`).
"""

from __future__ import annotations

import math

import torch
from flwr.app import Message

from ..algorithms import ClientResult
from ..experiment import FederateConfig
from ..rounds import RoundPlan, planned_batches
from ..setup import Setup
from . import ERROR_CODES
from .records import read_update

KINDS = {code: kind for kind, code in ERROR_CODES.items()}


class Refused(Exception):
    """A reply the round does not take; the message is its reason (one line)."""


def error_kind(reply: Message) -> str:
    """This app's name for a Flower Error reply's code ("" for Flower's own errors)."""
    return KINDS.get(int(reply.error.code), "") if reply.has_error() else ""


def read_reply(s: Setup, cfg: FederateConfig, plan: RoundPlan, i: int, reply: Message, device: torch.device,
               shard_sha256: str | None = None) -> tuple[ClientResult, float]:
    """The ``i``-th client's reply of the round as its ClientResult and mean local loss, once it passes the
    checks above; ``shard_sha256``: the manifest's hash of its shard (None: nodes without shards)."""
    client, content = plan.selected[i], reply.content
    if "arrays" not in content or "metrics" not in content:
        raise Refused("its reply holds no arrays or metrics")
    metrics = content["metrics"]
    try:
        said, n, steps, loss = (int(metrics["client"]), int(metrics["num-examples"]), int(metrics["steps"]),
                                float(metrics["train-loss"]))
    except (KeyError, TypeError, ValueError, OverflowError):
        raise Refused("its metrics lack client, num-examples, steps or train-loss") from None
    examples = len(plan.pools[i][0]) if plan.pools[i] else 0
    planned = len(planned_batches(cfg, plan, i))
    if said != client:
        raise Refused(f"its reply is client {said}'s")
    if n != examples:
        raise Refused(f"it reports num-examples {n}; the server sent it {examples}")
    if steps != planned:
        raise Refused(f"it reports {steps} steps; its {examples} examples make {planned}")
    if not math.isfinite(loss):
        raise Refused(f"its train-loss is {loss}")
    if shard_sha256 is not None:
        node = content["fpsfl.node"] if "fpsfl.node" in content else {}
        got = str(node.get("shard-sha256", ""))
        if got != shard_sha256:
            trained = f"a shard with sha256 {got[:16]}" if got else "no shard (its SuperNode has no data-dir)"
            raise Refused(f"its node trained on {trained}, not the manifest's {shard_sha256[:16]}; give it "
                          f"the manifest's shard (node config data-dir)")
    try:
        state, extra = read_update(content, device)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise Refused(f"its arrays cannot be read ({type(exc).__name__})") from None
    result = ClientResult(client, state, examples, steps, extra)
    reason = s.algo.check_result(result, plan.global_state)
    if reason:
        raise Refused(reason)
    return result, loss
