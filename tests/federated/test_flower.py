"""``federate --engine flower`` (Beutel et al. 2020): the same run as the in-process engine, Flower's own
FedAvg / FedAvgM as a peer oracle for our aggregation, the records codec, and the one-line errors.

Tests that need Flower skip with a reason when it is absent (``pip install -e ".[flower]"``); the
simulation tests also need Ray (Flower's simulation extra). The loopback deployment is in
test_flower_deploy.py (slow).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from federated import flower, runner
from federated.algorithms import ALGORITHMS, ClientResult
from federated.cli import main
from federated.experiment import FederateConfig, RunOptions

TINY = dict(dataset="digits", clients=3, rounds=2, local_epochs=1, batch_size=32, width=0.25, alpha=1.0,
            seed=0, eval_local=False)


def _flower():
    return pytest.importorskip("flwr", reason="Flower is not installed (pip install -e '.[flower]')")


def _ray():
    _flower()
    pytest.importorskip("ray", reason="Flower's simulation engine needs Ray (pip install -e '.[flower]')")


def _run(path, engine, algo, extra=None, **opts):
    return (flower.run if engine == "flower" else runner.run)(
        FederateConfig(algo=algo, **{**TINY, **(extra or {})}),
        RunOptions(out=path, device="cpu", progress=False, engine=engine, **opts))


def _same_run(a, b):
    rows = lambda p: [{k: v for k, v in r.items() if k != "seconds"}  # noqa: E731
                      for r in map(json.loads, (p / "metrics.jsonl").read_text().splitlines())]
    assert rows(a) == rows(b)
    wa = torch.load(a / "final.pt", weights_only=True)["model"]
    wb = torch.load(b / "final.pt", weights_only=True)["model"]
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.allclose(wa[k].double(), wb[k].double(), atol=1e-6, rtol=0), k


# ---- the simulation engine gives the in-process run -------------------------------------------------
@pytest.mark.slow  # about 40 s each on the 2-core CPU VM: Ray's start-up, not the 2 rounds (5 s)
@pytest.mark.parametrize("algo,extra", [(algo, {}) for algo in sorted(ALGORITHMS)]
                         + [("fedavg", {"bn": "local", "participation": 0.67})])
def test_flower_simulation_equals_in_process(tmp_path, algo, extra, one_thread):
    """Same seed, same metrics.jsonl (every value but the timing) and final weights within 1e-6: every
    algorithm, with its client state (SCAFFOLD, MOON, FedDyn, FedIR, --bn local) in the Flower Context."""
    _ray()
    _run(tmp_path / "inprocess", "inprocess", algo, extra)
    _run(tmp_path / "flower", "flower", algo, extra)
    _same_run(tmp_path / "inprocess", tmp_path / "flower")


@pytest.mark.slow  # two Flower simulations: about 70 s on the 2-core CPU VM
def test_flower_resume_names_the_clients_whose_context_is_gone(tmp_path, one_thread):
    """A SCAFFOLD run stopped after round 1 and resumed: Flower's Contexts start empty in the new run and
    c_i lives nowhere else (state.pt holds only server state), so the run stops with one line naming the
    clients, and round 1 stays as it was."""
    _ray()
    from federated.flower import FlowerError

    _run(tmp_path / "flower", "flower", "scaffold", stop_after=1)
    state = torch.load(tmp_path / "flower" / "state.pt", weights_only=False)
    assert state["algo"]["clients"] == [{"in-context": True, "round": 1}] * 3
    assert "c" in state["algo"]["server"]
    with pytest.raises(FlowerError, match=r"client\(s\) 0, 1, 2: their scaffold state is gone") as info:
        _run(tmp_path / "flower", "flower", "scaffold", resume=True)
    assert "\n" not in str(info.value)
    assert len((tmp_path / "flower" / "metrics.jsonl").read_text().splitlines()) == 1


# ---- Flower's own strategies as a peer oracle for our aggregation ----------------------------------
class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Linear(4, 3)


def _rounds_of_updates(rounds=3, sizes=(7, 12, 17), seed=0):
    """Each round's client states: the global state plus noise (buffers too), float64."""
    g = torch.Generator().manual_seed(seed)
    model = _Net().double()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    noise = lambda v: v + 0.1 * torch.randn(v.shape, generator=g, dtype=v.dtype)  # noqa: E731
    return model, start, [[{k: noise(v) if v.is_floating_point() else v + 3 for k, v in start.items()}
                           for _ in sizes] for _ in range(rounds)], list(sizes)


def _flower_replies(states, sizes):
    """The clients' train replies as a Flower strategy receives them (explicit metadata: no run here)."""
    from flwr.app import Array, ArrayRecord, Message, Metadata, MetricRecord, RecordDict

    def reply(i, state, n):
        content = RecordDict({"arrays": ArrayRecord({k: Array(v.numpy()) for k, v in state.items()}),
                              "metrics": MetricRecord({"num-examples": n})})
        meta = Metadata(run_id=1, message_id="", src_node_id=i + 1, dst_node_id=0, reply_to_message_id="m",
                        group_id="", created_at=0.0, ttl=60.0, message_type="train")
        return Message(content=content, metadata=meta)

    return [reply(i, state, n) for i, (state, n) in enumerate(zip(states, sizes, strict=True))]


def _ours(name, cfg, model, start, rounds, sizes):
    algo = ALGORITHMS[name](ALGORITHMS[name].Config(**cfg), sizes, np.ones((len(sizes), 3)))
    algo.attach(model)
    glob, out = start, []
    for states in rounds:
        results = [ClientResult(i, s, n, 1) for i, (s, n) in enumerate(zip(states, sizes, strict=True))]
        glob = algo.aggregate(glob, results)
        out.append(glob)
    return out


def test_fedavg_aggregates_as_flowers_fedavg():
    """McMahan et al. 2017, Algorithm 1: the sample-weighted average, ours and flwr's FedAvg strategy."""
    _flower()
    from flwr.serverapp.strategy import FedAvg

    model, start, rounds, sizes = _rounds_of_updates(rounds=1)
    ours = _ours("fedavg", {}, model, start, rounds, sizes)[0]
    theirs = FedAvg().aggregate_train(1, _flower_replies(rounds[0], sizes))[0]
    for key, value in ours.items():
        if value.is_floating_point():  # integer buffers: ours rounds back to int64, Flower's stays float
            assert np.allclose(value.numpy(), theirs[key].numpy(), rtol=0, atol=1e-12), key


@pytest.mark.parametrize("beta,server_lr", [(0.9, 1.0), (0.5, 0.7), (0.0, 1.3)])
def test_fedavgm_aggregates_as_flowers_fedavgm(beta, server_lr):
    """Hsu et al. 2019: v <- beta v + (w - avg), w <- w - lr v over three rounds, ours and flwr's FedAvgM
    (Flower's is the heavy-ball form, so ours runs with nesterov=false; Nesterov is our default).
    Compared on parameters only: our rule averages BatchNorm buffers by samples and never moves them with
    the server momentum, while Flower's FedAvgM applies the momentum to every array it is sent."""
    _flower()
    from flwr.app import Array, ArrayRecord
    from flwr.serverapp.strategy import FedAvgM

    model, start, rounds, sizes = _rounds_of_updates()
    ours = _ours("fedavgm", {"beta": beta, "server_lr": server_lr, "nesterov": False}, model, start, rounds,
                 sizes)
    strategy = FedAvgM(server_momentum=beta, server_learning_rate=server_lr)
    # what configure_train records before the first round
    strategy.current_arrays = ArrayRecord({k: Array(v.numpy()) for k, v in start.items()})
    params = {name for name, _ in model.named_parameters()}
    for rnd, (states, mine) in enumerate(zip(rounds, ours, strict=True), start=1):
        theirs = strategy.aggregate_train(rnd, _flower_replies(states, sizes))[0]
        for key in params:
            assert np.allclose(mine[key].numpy(), theirs[key].numpy(), rtol=0, atol=1e-12), (rnd, key)


# ---- records, errors, start-up -----------------------------------------------------------------------
def test_records_carry_nested_state_bit_for_bit():
    _flower()
    from flwr.app import RecordDict

    from federated.flower.records import get_tree, put_tree

    conv = torch.randn(4, 3, 3, 3).to(memory_format=torch.channels_last)
    tree = {"c": {"conv.weight": conv, "n": torch.tensor(7)}, "empty": {}, "w": torch.rand(5).double(),
            "momentum": 0.9, "steps": 3, "name": "x", "none": None, "flag": True}
    records = RecordDict()
    put_tree(records, "t", tree)
    back = get_tree(records, "t")
    assert back["c"]["conv.weight"].shape == conv.shape and torch.equal(back["c"]["conv.weight"], conv)
    assert back["c"]["n"].dtype == torch.int64 and back["c"]["n"].shape == () and back["empty"] == {}
    assert back["w"].dtype == torch.float64 and torch.equal(back["w"], tree["w"])
    assert {k: back[k] for k in ("momentum", "steps", "name", "none", "flag")} == {
        "momentum": 0.9, "steps": 3, "name": "x", "none": None, "flag": True}
    with pytest.raises(TypeError, match="t/model"):
        put_tree(records, "t", {"model": nn.Linear(1, 1)})


STATE_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32,
                torch.uint8, torch.bool]


@pytest.mark.parametrize("packed", [True, False])
def test_a_model_state_travels_bit_for_bit_in_either_form(packed):
    """Packed (our server and clients: two arrays, whatever the model) or Flower's one array per name (what
    Flower's strategies average): every dtype, 0-d, empty and non-contiguous tensors come back equal."""
    _flower()
    from federated.flower.records import is_packed, read_state, state_record

    gen = torch.Generator().manual_seed(0)
    state = {f"t{i}": (torch.randn(3, 5, generator=gen) * 100).to(d) for i, d in enumerate(STATE_DTYPES)
             if d is not torch.bfloat16 or packed}  # numpy, Flower's own form, has no bfloat16
    state |= {"scalar": torch.tensor(7), "empty": torch.zeros(0, 4), "view": torch.randn(4, 6).t()}
    record = state_record(state, packed=packed)
    assert is_packed(record) == packed and len(record) == (2 if packed else len(state))
    back = read_state(record)
    assert list(back) == list(state)
    for k, v in state.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v), k


@pytest.mark.parametrize("edit, reason", [
    (lambda layout, blob: ("not json", blob), "not JSON"),
    (lambda layout, blob: ([["w", "float32", [2, 3], 20]], blob), "is not 20 bytes"),
    (lambda layout, blob: ([["w", "complex_nonsense", [6], 24]], blob), "no tensor dtype"),
    (lambda layout, blob: ([["w", "float32", [-6], 24]], blob), "is not [name, dtype, shape, bytes]"),
    (lambda layout, blob: ([["w", "float32", [12], 48]], blob), "runs past the bytes"),
    (lambda layout, blob: (layout, torch.cat([blob, blob[:4]])), "extra bytes"),
    (lambda layout, blob: (layout + [layout[0]], torch.cat([blob, blob[:24]])), "repeated name"),
])
def test_a_packed_state_that_lies_about_its_bytes_is_refused(edit, reason):
    """Another process wrote it (a bug, a fault or intent): a layout that does not describe its bytes
    exactly is a ValueError, which the server's reply check turns into a refused reply."""
    _flower()
    from flwr.app import Array, ArrayRecord

    from federated.flower.records import BYTES, LAYOUT, read_state, state_record

    record = state_record({"w": torch.randn(2, 3)})
    layout = json.loads(record[LAYOUT].numpy().tobytes().decode())
    blob = torch.from_numpy(record[BYTES].numpy())
    layout, blob = edit(layout, blob)
    text = layout if isinstance(layout, str) else json.dumps(layout)
    head = torch.tensor(list(text.encode()), dtype=torch.uint8)
    forged = ArrayRecord({LAYOUT: Array.from_torch_tensor(head), BYTES: Array.from_torch_tensor(blob)})
    with pytest.raises(ValueError, match=re.escape(reason)):
        read_state(forged)


def test_engine_flower_without_flower_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    import federated.flower as flower

    monkeypatch.setattr(flower, "find_spec", lambda name: None)
    code = main(["--out", str(tmp_path / "r"), "--engine", "flower", "--rounds", "1", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and ".[flower]" in err, err
    assert not (tmp_path / "r").exists()


def test_engine_flower_refuses_the_centralised_baseline(tmp_path, capsys):
    code = main(["--out", str(tmp_path / "r"), "--engine", "flower", "--centralized", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--centralized" in err, err


@pytest.mark.parametrize("text", ["num_cpus=0", "cpus=1", "num_gpus=x", "num_cpus"])
def test_bad_flower_resources_are_one_line(tmp_path, capsys, text):
    code = main(["--out", str(tmp_path / "r"), "--flower-resources", text, "--rounds", "1", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--flower-resources" in err, err


def test_help_does_not_import_flower():
    code = ("import sys\nfrom federated.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n"
            "    pass\nprint('LOADED', *[m for m in ('flwr', 'ray') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert out.splitlines()[-1].split() == ["LOADED"]


# ---- what travels: the messages carry only what the algorithm's client needs -----------------------
def _train_message(content, round_=1):
    from flwr.app import Message, Metadata

    meta = Metadata(run_id=1, message_id=f"m{round_}", src_node_id=0, dst_node_id=7, reply_to_message_id="",
                    group_id="", created_at=0.0, ttl=60.0, message_type="train")
    return Message(content=content, metadata=meta)


def _server_message(s, cfg, rnd, confirmed):
    """What FlowerDispatch sends client 0 in round ``rnd`` (all clients, no FedVC: no pools)."""
    from flwr.app import ArrayRecord, ConfigRecord, RecordDict

    from federated.flower.records import put_tree

    content = RecordDict({"arrays": ArrayRecord({k: v.detach() for k, v in s.model.state_dict().items()}),
                          "config": ConfigRecord({"server-round": rnd + 1, "lr": 0.05, "client": 0,
                                                  "confirmed": confirmed, "device": "cpu",
                                                  "fpsfl-config": json.dumps(cfg.to_dict())})})
    reads = {k: s.algo.server[k] for k in type(s.algo).client_reads if k in s.algo.server}
    if reads:
        put_tree(content, "fpsfl.server", reads)
    return _train_message(content, rnd + 1)


def _context(run_id=1):
    from flwr.app import Context, RecordDict

    return Context(run_id=run_id, node_id=7, node_config={"partition-id": 0}, state=RecordDict(),
                   run_config={})


@pytest.mark.parametrize("algo,extra,kept", [("fedavg", {}, set()), ("scaffold", {}, {"c"}),
                                             ("moon", {}, {"prev"}), ("feddyn", {}, {"g"}),
                                             ("fedavg", {"bn": "local"}, {"bn"})])
def test_the_client_state_stays_in_the_context(algo, extra, kept):
    """The reply holds the local model, its metrics and the client step's payload only: the client's
    state (SCAFFOLD's c_i, MOON's previous model, FedDyn's gradient, --bn local statistics) stays in the
    node's Context, staged under its round; a later round that confirms that round, on a node whose Context
    is empty, is refused as lost (a Flower Error)."""
    _flower()
    from federated import flower
    from federated.flower.client_app import train
    from federated.flower.node import COMMITTED, STAGED
    from federated.flower.records import get_tree, tree_names
    from federated.setup import setup

    cfg = FederateConfig(algo=algo, **{**TINY, **extra})
    s = setup(cfg, torch.device("cpu"))
    context = _context()
    reply = train(_server_message(s, cfg, 0, 0), context)
    payload = {"scaffold": {"fpsfl.extra", "fpsfl.extra.arrays"}}.get(algo, set())
    assert set(reply.content) == {"arrays", "metrics"} | payload
    metrics = reply.content["metrics"]
    assert metrics["num-examples"] == len(s.parts[0]) and metrics["keeps-state"] == int(bool(kept))
    assert set(reply.content["arrays"]) == set(s.model.state_dict())
    assert COMMITTED not in context.state  # nothing is committed before the server confirms it
    if kept:
        assert tree_names(context.state, STAGED) == [f"{STAGED}1"]
        assert set(get_tree(context.state, f"{STAGED}1")["state"]) >= kept
        lost = train(_server_message(s, cfg, 1, 1), _context(run_id=2))
        assert lost.has_error() and lost.error.code == flower.ERROR_CODES["lost"]
    else:
        assert not tree_names(context.state, "fpsfl.")


def test_a_node_commits_only_the_rounds_the_server_confirms():
    """Round 1's state is committed when round 2's message confirms round 1; round 2's reply is never
    confirmed (round 3 says 1 again), so its state is discarded and round 3 starts from round 1's: the
    staged state of round 3 equals that of a node that never trained round 2."""
    _flower()
    from federated.flower.client_app import train
    from federated.flower.node import COMMITTED, STAGED
    from federated.flower.records import get_tree, tree_names
    from federated.setup import setup

    cfg = FederateConfig(algo="scaffold", **TINY)
    s = setup(cfg, torch.device("cpu"))
    late, skipped = _context(), _context()
    for context in (late, skipped):
        train(_server_message(s, cfg, 0, 0), context)
    train(_server_message(s, cfg, 1, 1), late)  # trained, but the server never aggregates it
    assert get_tree(late.state, COMMITTED)["round"] == 1 and tree_names(late.state, STAGED) == [f"{STAGED}2"]
    for context in (late, skipped):
        train(_server_message(s, cfg, 2, 1), context)
        assert get_tree(context.state, COMMITTED)["round"] == 1
        assert tree_names(context.state, STAGED) == [f"{STAGED}3"]
    a, b = (get_tree(c.state, f"{STAGED}3")["state"]["c"] for c in (late, skipped))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---- the Flower app's typed run config (pyproject.toml [tool.flwr.app.config]) ----------------------
def _app_config():
    from pathlib import Path

    import tomllib

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    return tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]


def test_the_apps_run_config_defaults_are_federates():
    from federated.cli import build_parser, options_from
    from federated.flower.run_config import options_from_run_config

    app = _app_config()
    assert app["components"] == {"serverapp": "federated.flower.server_app:app",
                                 "clientapp": "federated.flower.client_app:app"}
    cfg, opts = options_from_run_config(app["config"])
    assert cfg == options_from(build_parser().parse_args([]))[0]
    assert opts.engine == "flower" and not opts.resume


def test_run_config_overrides_are_typed_and_round_trip():
    from federated.flower.run_config import options_from_run_config, run_config_of

    config = {**_app_config()["config"], "algo": "scaffold", "alpha": 0.1, "num-server-rounds": 2,
              "lr": 0.05, "set": "steps=plain", "out": "/tmp/r"}
    cfg, opts = options_from_run_config(config)
    assert (cfg.algo, cfg.alpha, cfg.rounds, cfg.lr, cfg.algo_config().steps) == ("scaffold", 0.1, 2, 0.05,
                                                                                   "plain")
    assert options_from_run_config(run_config_of(cfg, opts)) == (cfg, opts)
    with pytest.raises(ValueError, match="unknown key 'rounds-x'"):
        options_from_run_config({"rounds-x": 1})
    with pytest.raises(ValueError, match="local-epochs"):
        options_from_run_config({"local-epochs": "many"})


# ---- interoperability: our ClientApp under Flower's own FedAvg strategy ---------------------------
@pytest.mark.slow  # a Flower simulation and an in-process run: about 40 s on the 2-core CPU VM
def test_our_clientapp_under_flowers_fedavg_strategy_matches_the_inprocess_engine(tmp_path, one_thread):
    """flwr.serverapp.strategy.FedAvg drives our ClientApp with Flower's standard train message (the
    global ``arrays`` and a ``config``; our federate config rides in it as ``fpsfl-config``), and its
    evaluation round (the default fraction_evaluate=1.0) with @app.evaluate; its round gives the in-process
    engine's FedAvg weights within float tolerance. One round: Flower averages in
    float32 and keeps the BatchNorm batch counts as fractions, ours in float64 with integer counts; that
    1e-7 difference, trained on for another round of small BatchNorm batches, grew to 1e-2 (measured)."""
    _ray()
    from flwr.app import ArrayRecord, ConfigRecord, Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    from federated.flower.client_app import app as client_app
    from federated.setup import setup

    _run(tmp_path / "inprocess", "inprocess", "fedavg", {"rounds": 1})
    cfg = FederateConfig(algo="fedavg", **{**TINY, "rounds": 1})
    initial = setup(cfg, torch.device("cpu")).model.state_dict()
    final, evaluated = [], []
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = FedAvg(min_train_nodes=cfg.clients, min_available_nodes=cfg.clients,
                          min_evaluate_nodes=cfg.clients)
        fpsfl_config = ConfigRecord({"fpsfl-config": json.dumps(cfg.to_dict())})
        result = strategy.start(grid=grid, initial_arrays=ArrayRecord(initial), num_rounds=cfg.rounds,
                                train_config=fpsfl_config, evaluate_config=fpsfl_config)
        final.append(result.arrays.to_torch_state_dict())
        evaluated.append(result.evaluate_metrics_clientapp)

    run_simulation(server_app=server, client_app=client_app, num_supernodes=cfg.clients,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0},
                                   "init_args": {"include_dashboard": False}})
    ours = torch.load(tmp_path / "inprocess" / "final.pt", weights_only=True)["model"]
    assert final and final[0].keys() == ours.keys()
    metrics = evaluated[0][cfg.rounds]  # the clients' eval-acc, averaged by num-examples
    assert 0.0 <= metrics["eval-acc"] <= 1.0 and metrics["eval-loss"] > 0
    for key, value in ours.items():
        if value.is_floating_point():  # integer buffers: ours rounds back to int64, Flower's stays float
            assert torch.allclose(final[0][key].to(value.dtype), value, rtol=1e-5, atol=1e-6), key


# ---- replies: matched by reply_to_message_id, bounded by --flower-timeout --------------------------
class _Grid:
    """A Grid that answers some pushed messages, in reverse order, from a node that is not theirs."""

    def __init__(self, answer):
        self.answer, self.pushed = answer, []

    def push_messages(self, messages):
        self.pushed = [f"id{i}" for i, _ in enumerate(messages)]
        return list(self.pushed)

    def pull_messages(self, ids):
        from flwr.app import Message, Metadata, RecordDict

        def reply(i):
            meta = Metadata(run_id=1, message_id=f"r{i}", src_node_id=1, dst_node_id=0,
                            reply_to_message_id=f"id{i}", group_id="", created_at=0.0, ttl=60.0,
                            message_type="train")
            return Message(content=RecordDict(), metadata=meta)

        return [reply(int(i[2:])) for i in reversed(list(ids)) if int(i[2:]) in self.answer]


def test_replies_are_matched_by_message_id_and_a_silent_client_times_out():
    _flower()
    from federated.flower.server_app import FlowerDispatch

    grid = _Grid(answer={0, 2})
    replies = FlowerDispatch(grid, timeout_s=0.3)._exchange([None, None, None], 0.3)
    assert [r.metadata.reply_to_message_id if r else None for r in replies] == ["id0", None, "id2"]


# ---- the shipped weights under flwr run -----------------------------------------------------------------
def test_shipped_weights_are_found_from_a_flower_app_bundle(tmp_path):
    """`flwr run .` runs the ServerApp from an installed copy of the app bundle, which carries source files
    only: a shipped --init name resolves to the installed fpsfl checkout's weights/ file."""
    import shutil

    from federated.initialisation import SHIPPED, installed_checkout

    checkout = installed_checkout()
    there = [n for n, p in SHIPPED.items() if checkout and (checkout / "weights" / p.name).is_file()]
    name = there[0] if there else None
    if name is None:
        pytest.skip("fpsfl is not installed from a checkout with shipped weights (pip install -e .)")
    root = Path(__file__).resolve().parents[2]
    for package in ("fpsfl", "fractals", "pretrain", "federated"):
        shutil.copytree(root / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    code = (f"from federated.initialisation import shipped_path, WEIGHTS\n"
            f"print(WEIGHTS.is_dir(), shipped_path({name!r}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=120, check=True).stdout
    assert out.split() == ["False", str(checkout / "weights" / SHIPPED[name].name)]


def test_shipped_weights_out_of_reach_are_one_line_naming_the_path_to_pass(monkeypatch, tmp_path):
    import federated.initialisation as init

    monkeypatch.setattr(init, "WEIGHTS", tmp_path / "weights")
    monkeypatch.setattr(init, "SHIPPED", {"fps-resnet20": tmp_path / "weights" / "fps-resnet20.ckpt"})
    monkeypatch.setattr(init, "installed_checkout", lambda: None)
    with pytest.raises(init.InitError, match=r"a Flower app bundle carries source files only.*"
                                             r"init='/path/to/fpsfl/weights/fps-resnet20.ckpt'") as refused:
        init.shipped_path("fps-resnet20")
    assert "\n" not in str(refused.value)


# ---- the ClientApp's cold start ----------------------------------------------------------------------------
HEAVY = ("numba", "matplotlib", "analysis", "scipy", "sklearn", "pandas", "lightly", "torchvision")


def _imports(module: str) -> set[str]:
    code = f"import sys, {module}\nprint(*sorted({{m.split('.')[0] for m in sys.modules}}))"
    return set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              check=True).stdout.split())


def test_the_clientapp_process_imports_neither_torch_nor_the_run():
    """Each of Flower's per-message flwr-clientapp processes imports the app module: with a warm worker it
    only forwards the message, so it must not pay for torch (1.8 CPU-s of the 2-vCPU VM) or our code."""
    _flower()
    loaded = _imports("federated.flower.client_app")
    assert not loaded & {"torch", "pretrain", "fractals", *HEAVY}, loaded


def test_the_training_path_imports_nothing_it_does_not_use():
    """A ClientApp or worker that trains imports torch and the client step, never the renderer (numba),
    plotting, the analyses or other heavy libraries."""
    _flower()
    loaded = _imports("federated.flower.node")
    assert "torch" in loaded and not loaded & set(HEAVY), loaded


# ---- Flower's conventions: evaluate, proximal-mu -----------------------------------------------------------
def test_evaluate_tests_the_global_model_on_the_clients_own_data():
    """@app.evaluate (a Flower strategy's evaluation round, fraction_evaluate=1.0 by default): the global
    model on the node's partition, as a MetricRecord a strategy averages by num-examples."""
    _flower()
    from flwr.app import ArrayRecord, ConfigRecord, RecordDict

    from federated.flower.client_app import evaluate
    from federated.setup import setup

    cfg = FederateConfig(**TINY)
    s = setup(cfg, torch.device("cpu"))
    config = ConfigRecord({"server-round": 1, "fpsfl-config": json.dumps(cfg.to_dict())})
    content = RecordDict({"arrays": ArrayRecord({k: v.detach() for k, v in s.model.state_dict().items()}),
                          "config": config})
    reply = evaluate(_train_message(content), _context())
    part = s.parts[0]
    expected = s.task.evaluate(s.model, s.data.train_x[part], s.data.train_y[part])
    metrics = reply.content["metrics"]
    assert metrics["num-examples"] == len(part)
    assert metrics["eval-acc"] == pytest.approx(expected["acc"]) and metrics["eval-loss"] == pytest.approx(
        expected["loss"], rel=1e-5)


def test_flowers_fedprox_proximal_mu_trains_fedprox_with_that_mu():
    """Flower's FedProx strategy sends proximal-mu: a FedAvg run config then trains FedProx with that mu
    (the reply equals our FedProx's); with an algorithm that is not FedAvg or FedProx it is an Error reply."""
    _flower()
    from federated import flower
    from federated.flower.client_app import train
    from federated.setup import setup

    def reply(algo, extra=None, **algo_args):
        cfg = FederateConfig(algo=algo, algo_args=algo_args, **TINY)
        message = _server_message(setup(FederateConfig(**TINY), torch.device("cpu")), cfg, 0, 0)
        message.content["config"].update(extra or {})
        return train(message, _context())

    arrays = lambda r: r.content["arrays"].to_torch_state_dict()  # noqa: E731
    via_flower = arrays(reply("fedavg", {"proximal-mu": 0.5}))
    ours, plain = arrays(reply("fedprox", mu=0.5)), arrays(reply("fedavg"))
    assert all(torch.equal(via_flower[k], ours[k]) for k in ours)
    assert not all(torch.equal(plain[k], ours[k]) for k in ours)
    refused = reply("scaffold", {"proximal-mu": 0.5})
    assert refused.has_error() and refused.error.code == flower.ERROR_CODES["config"]
    assert "proximal-mu" in refused.error.reason
