"""The Flower server trusts no reply (issue 31), a late reply leaves no trace (issue 33), and a resume never
switches engines under a client's state (issue 33).

- Every algorithm's :meth:`check_result` takes a reply its own client step produced and refuses a broken one.
- Bad replies injected into Flower rounds (a size of 10^12 or -5, a wrong shape or dtype, a missing array,
  NaN weights, a NaN SCAFFOLD payload, 0 steps, another client's reply, an infinite loss): each round
  counts that client as missing, with its reason in metrics.jsonl, and the global model and state.pt equal
  those of the rounds in which the client simply failed.
- A SCAFFOLD client that answers round 2 after --flower-timeout: its reply is discarded and named, its node
  discards the state it staged, and the run equals the one in which that node was offline in round 2;
  SCAFFOLD's c stays the mean of the c_i that were aggregated (Karimireddy et al. 2020, Alg. 1).

The nodes are our ClientApp in this process behind a Grid stand-in (:mod:`.flower_grid`), so these run in
seconds; the late reply over real SuperNode processes is in test_flower_deploy.py (slow).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from federated import runner
from federated.algorithms import ALGORITHMS, ClientResult
from federated.experiment import FederateConfig, RunOptions
from fpsfl.base.rundir import RunDirError

from .flower_grid import TINY, LocalGrid, flower_identity
from .flower_grid import rows as _rows
from .flower_grid import serve as _serve


@pytest.fixture(autouse=True)
def _flower(monkeypatch):
    flower_identity(monkeypatch)


# ---- the algorithms' check of a client's result --------------------------------------------------------
def _one_result(algo):
    """An algorithm attached to TINY's model, the global state, and client 0's result of one round."""
    from federated.rounds import make_job, plan_round, train_client
    from federated.setup import setup

    cfg = FederateConfig(algo=algo, **TINY)
    s = setup(cfg, torch.device("cpu"))
    plan = plan_round(s, cfg, 0)
    result, _ = train_client(s, cfg, make_job(cfg, plan, 0, {}, torch.device("cpu")))  # what a node sends
    return s.algo, plan.global_state, result


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_every_algorithm_takes_its_own_result_and_refuses_a_broken_one(algo):
    algorithm, glob, result = _one_result(algo)
    assert algorithm.check_result(result, glob) == ""
    key = next(k for k, v in glob.items() if v.is_floating_point())
    broken = {
        "nan": {**result.state, key: torch.full_like(result.state[key], float("nan"))},
        "shape": {**result.state, key: result.state[key].flatten()},
        "dtype": {**result.state, key: result.state[key].double()},
        "keys": {k: v for k, v in result.state.items() if k != key},
    }
    for what, state in broken.items():
        reason = algorithm.check_result(ClientResult(0, state, result.n_samples, result.steps, result.extra),
                                        glob)
        assert reason and "\n" not in reason, what


def test_fednova_refuses_zero_steps_and_scaffold_a_nan_payload():
    nova, glob, result = _one_result("fednova")
    assert "divides by the step count" in nova.check_result(
        ClientResult(0, result.state, result.n_samples, 0, result.extra), glob)
    assert "momentum" in nova.check_result(
        ClientResult(0, result.state, result.n_samples, result.steps, {"momentum": 1.0}), glob)
    scaffold, glob, result = _one_result("scaffold")
    delta = dict(result.extra["delta_c"])
    key = next(iter(delta))
    delta[key] = torch.full_like(delta[key], float("nan"))
    reason = scaffold.check_result(ClientResult(0, result.state, result.n_samples, result.steps,
                                                {"delta_c": delta}), glob)
    assert reason == f"its delta_c/{key} is not finite"


# ---- bad replies injected into a Flower round ----------------------------------------------------------
def _metric(key, value):
    def tamper(msg, reply):
        reply.content["metrics"][key] = value
        return reply
    return tamper


def _array(change, record="arrays"):
    """A reply whose first floating-point array (of the model, or of a payload record) ``change`` makes
    another (None: removed); it travels packed, as the node sent it."""
    def tamper(msg, reply):
        from federated.flower.records import read_state, state_record

        state = read_state(reply.content[record])
        key = next(k for k, v in state.items() if v.is_floating_point())
        value = change(state[key].numpy().copy())
        if value is None:
            del state[key]
        else:
            state[key] = torch.from_numpy(value)
        reply.content[record] = state_record(state)
        return reply
    return tamper


def _nan(a):
    a[...] = np.nan
    return a


def _fail(msg, reply):
    """The reference: the node answers with an error, so the round goes on without its client."""
    from flwr.app import Error, Message

    return Message(Error(code=2, reason="the node failed"), reply_to=msg)


BAD = [  # (name, tamper, what metrics.jsonl says)
    ("huge size", _metric("num-examples", 10 ** 12), "it reports num-examples 1000000000000"),
    ("negative size", _metric("num-examples", -5), "it reports num-examples -5"),
    ("wrong shape", _array(lambda a: a.reshape(-1)), "is ("),
    ("NaN SCAFFOLD delta c", _array(_nan, "fpsfl.extra.arrays"), "its delta_c/"),
    ("zero steps", _metric("steps", 0), "it reports 0 steps"),
    ("wrong dtype", _array(lambda a: a.astype(np.float64)), "torch.float64"),
    ("missing array", _array(lambda a: None), "keys differ"),
    ("NaN weights", _array(_nan), "is not finite"),
    ("another client's reply", _metric("client", 0), "its reply is client 0's"),
    ("infinite loss", _metric("train-loss", float("inf")), "its train-loss is inf"),
]
FAST = 5  # the default suite injects the first five (issue 31's list), one a round; -m slow all of them


def bad_replies_equal_failures(tmp_path, kinds: list, run) -> None:
    """Client 2 sends the reply ``kinds[r - 1]`` makes in round r (``run(tampers, path)`` runs SCAFFOLD
    with these tampers, --min-replies 0.6): each round goes on without it, naming the reason, and the run
    equals the one in which client 2 failed every round."""
    run({rnd: tamper for rnd, (_, tamper, _) in enumerate(kinds, start=1)}, tmp_path / "bad")
    run({rnd: _fail for rnd in range(1, len(kinds) + 1)}, tmp_path / "failed")
    rows = _rows(tmp_path / "bad")
    for row, (name, _, says) in zip(rows, kinds, strict=True):
        assert row["missing_clients"] == [2] and row["clients"] == [0, 1], name
        why = row["missing_reasons"]["2"]
        assert why.startswith("its reply was refused: ") and says in why and "\n" not in why, (name, why)
    strip = lambda r: {k: v for k, v in r.items() if k not in ("seconds", "missing_reasons")}  # noqa: E731
    assert [strip(r) for r in rows] == [strip(r) for r in _rows(tmp_path / "failed")]
    _same_files(tmp_path / "bad", tmp_path / "failed")


def test_a_bad_reply_counts_as_a_missing_client(tmp_path):
    """SCAFFOLD (whose payload, delta c_i, reaches state.pt), one bad reply of client 2 a round: nothing
    derived from a refused reply reaches the aggregate or state.pt."""

    def run(tampers, path):
        grid = LocalGrid(3)
        grid.tamper.update({(102, rnd): tamper for rnd, tamper in tampers.items()})
        _serve(grid, path, algo="scaffold", rounds=len(tampers), min_replies="0.6")

    bad_replies_equal_failures(tmp_path, BAD[:FAST], run)


def _tampering_app(client: int, tampers: dict):
    """Our ClientApp, whose train reply for ``client`` in round r becomes ``tampers[r](msg, reply)``."""
    from flwr.clientapp import ClientApp

    from federated.flower import client_app as ours

    app = ClientApp()

    @app.query()
    def query(msg, context):
        return ours.query(msg, context)

    @app.train()
    def train(msg, context):
        reply = ours.train(msg, context)
        config = msg.content["config"]
        tamper = tampers.get(int(config["server-round"])) if int(config["client"]) == client else None
        return tamper(msg, reply) if tamper else reply

    return app


@pytest.mark.slow  # two Flower simulations of 10 rounds: about 3 minutes on the 2-core CPU VM
def test_every_bad_reply_in_flowers_simulation_runtime_counts_as_a_missing_client(tmp_path):
    """The whole table, one bad reply a round, in Flower's simulation runtime (Ray actors, Flower's
    messages and serialisation): every round equals the round in which client 2 failed."""
    pytest.importorskip("ray", reason="Flower's simulation engine needs Ray (pip install -e '.[flower]')")
    import sys

    from ray import cloudpickle

    from federated import flower
    from federated.flower.engine import simulate

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors need not import the tests
    threads = torch.get_num_threads()
    torch.set_num_threads(1)

    def run(tampers, path):
        cfg = FederateConfig(algo="scaffold", **{**TINY, "rounds": len(tampers)})
        opts = RunOptions(out=path, device="cpu", progress=False, engine="flower", min_replies="0.6")
        flower.require_flower(cfg, opts)
        runner.run(cfg, opts, host=lambda resolved, rounds: simulate(resolved, opts, rounds,
                                                                     clients=_tampering_app(2, tampers)))

    try:
        bad_replies_equal_failures(tmp_path, BAD, run)
    finally:
        torch.set_num_threads(threads)
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _same_files(a, b):
    """final.pt's model and state.pt (model and algorithm state) equal, bit for bit; the digests of their
    metrics lines (state.pt's metrics_sha256) differ with those lines (reasons, timings)."""
    fa, fb = (torch.load(p / "final.pt", weights_only=True)["model"] for p in (a, b))
    assert fa.keys() == fb.keys() and all(torch.equal(fa[k], fb[k]) for k in fa)
    sa, sb = (torch.load(p / "state.pt", weights_only=False) for p in (a, b))
    sa.pop("metrics_sha256"), sb.pop("metrics_sha256")
    assert _flat(sa) == _flat(sb)


def _flat(tree, path=""):
    """A nested state as {path: value}, tensors as lists (comparable with ==)."""
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() for k, v in _flat(value, f"{path}/{key}").items()}
    if isinstance(tree, list | tuple):
        return {k: v for i, value in enumerate(tree) for k, v in _flat(value, f"{path}/{i}").items()}
    return {path: tree.tolist() if isinstance(tree, torch.Tensor) else tree}


# ---- a reply that comes after its round closed -----------------------------------------------------------
# CI's 20-minute budget (2026-12-02): 35 s; a bad reply, the test above, stays
@pytest.mark.slow
def test_a_late_reply_is_discarded_and_the_run_equals_one_that_missed_the_round(tmp_path):
    """SCAFFOLD, 3 clients, 3 rounds, --min-replies 0.6: client 1 trains round 2 but answers after the
    round closed. Its reply is discarded and named in round 3; its node commits round 1's state, not round
    2's, so the run equals the one in which client 1's node was offline in round 2, and c is the mean of
    the c_i the server aggregated (c = (1/N) sum_i c_i from c = c_i = 0: Karimireddy et al. 2020, Alg. 1)."""
    from federated.flower.node import COMMITTED, STAGED
    from federated.flower.records import get_tree

    settings = dict(algo="scaffold", rounds=3, min_replies="0.6")
    late = LocalGrid(3)
    late.slow.add((101, 2))
    _serve(late, tmp_path / "late", **settings)
    missed = LocalGrid(3)  # node 101 offline in round 2 only: three sessions, --resume in between
    _serve(missed, tmp_path / "missed", stop_after=1, **settings)
    missed.down.add(101)
    _serve(missed, tmp_path / "missed", resume=True, stop_after=1, **settings)
    missed.down.clear()
    _serve(missed, tmp_path / "missed", resume=True, **settings)

    rows = _rows(tmp_path / "late")
    assert rows[1]["missing_clients"] == [1] and "no reply within --flower-timeout" in \
        rows[1]["missing_reasons"]["1"]
    assert rows[2]["late_replies"] == [[1, 2]] and "missing_clients" not in rows[2]
    strip = lambda r: {k: v for k, v in r.items()  # noqa: E731
                       if k not in ("seconds", "missing_reasons", "late_replies")}
    assert [strip(r) for r in rows] == [strip(r) for r in _rows(tmp_path / "missed")]
    _same_files(tmp_path / "late", tmp_path / "missed")

    context = late.contexts[101].state  # round 2's state was discarded, round 1's committed
    assert get_tree(context, COMMITTED)["round"] == 1 and f"{STAGED}2" not in context
    c = torch.load(tmp_path / "late" / "state.pt", weights_only=False)["algo"]["server"]["c"]
    ci = [get_tree(late.contexts[100 + i].state, f"{STAGED}3")["state"]["c"] for i in range(3)]
    for key, value in c.items():
        assert torch.allclose(value, sum(x[key] for x in ci) / 3, atol=1e-6), key


# ---- the engine a run started with ----------------------------------------------------------------------
def _inprocess(path, algo, **opts):
    return runner.run(FederateConfig(algo=algo, **TINY), RunOptions(out=path, device="cpu", progress=False,
                                                                    **opts))


@pytest.mark.parametrize("first", ["inprocess", "flower"])
def test_a_resume_with_another_engine_that_would_lose_client_state_is_refused(tmp_path, first):
    """SCAFFOLD's c_i lives in state.pt (inprocess) or the nodes' Contexts (flower): a resume with the other
    engine would restart it from zero, so it is one line; FedAvg (no client state) switches freely."""
    start = {"inprocess": lambda p, a: _inprocess(p, a, stop_after=1),
             "flower": lambda p, a: _serve(LocalGrid(3), p, stop_after=1, algo=a)}[first]
    other = {"inprocess": lambda p, a: _serve(LocalGrid(3), p, resume=True, algo=a),
             "flower": lambda p, a: _inprocess(p, a, resume=True)}[first]
    start(tmp_path / "scaffold", "scaffold")
    assert json.loads((tmp_path / "scaffold" / "config.json").read_text())["config"]["engine"] == first
    with pytest.raises(RunDirError, match=f"started with --engine {first}, and its clients' scaffold state") \
            as refused:
        other(tmp_path / "scaffold", "scaffold")
    assert "\n" not in str(refused.value)
    start(tmp_path / "fedavg", "fedavg")
    other(tmp_path / "fedavg", "fedavg")
    assert [r["round"] for r in _rows(tmp_path / "fedavg")] == [1, 2]
