"""FL algorithms: every one runs and is deterministic; the equalities that define them; resume."""

import copy

import numpy as np
import pytest
import torch

from federated.aggregate import fednova, nova_norm, server_momentum, weighted_average
from federated.algorithms import ALGORITHMS, ClientContext
from federated.algorithms.fedir import importance_weights
from federated.config import FederateConfig
from federated.datasets import ImageData
from federated.local import local_train, make_optimizer
from federated.rounds import RunOptions, _generators, run, setup, train_round
from pretrain.rundir import RunDir

N_CLASSES, SIDE = 4, 16


def synthetic(n_train=96, n_test=32, seed=0) -> ImageData:
    """Class c is a bright square in quadrant c on noise: learnable in a few steps."""
    g = torch.Generator().manual_seed(seed)

    def make(n):
        y = torch.arange(n) % N_CLASSES
        x = torch.randint(0, 60, (n, SIDE, SIDE, 3), generator=g, dtype=torch.uint8)
        for i, c in enumerate(y.tolist()):
            r, q = divmod(c, 2)
            x[i, r * 8:(r + 1) * 8, q * 8:(q + 1) * 8] = 220
        return x, y

    (tx, ty), (sx, sy) = make(n_train), make(n_test)
    names = [str(c) for c in range(N_CLASSES)]
    return ImageData(tx, ty, sx, sy, sx[:0], sy[:0], N_CLASSES, names, None, SIDE)


def _cfg(algo="fedavg", **kw):
    base = dict(dataset="digits", algo=algo, clients=3, rounds=2, local_epochs=1, batch_size=16, lr=0.05,
                width=0.25, alpha=1.0, min_size=4, seed=0)
    return FederateConfig(**{**base, **kw})


def _run(tmp_path, cfg, name="run", **opts):
    return run(cfg, RunOptions(out=tmp_path / name, device="cpu", progress=False, **opts), synthetic())


def _final(tmp_path, name="run"):
    return torch.load(tmp_path / name / "final.pt", weights_only=True)["model"]


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_every_algorithm_runs_finite_and_deterministic(tmp_path, algo):
    rows_a = _run(tmp_path, _cfg(algo), "a")
    rows_b = _run(tmp_path, _cfg(algo), "b")
    assert [r["round"] for r in rows_a] == [1, 2]
    for row in rows_a:
        assert all(np.isfinite(row[k]) for k in ("test_acc", "test_loss", "train_loss", "local_acc"))
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in rows_a]
    assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in rows_b]
    a, b = _final(tmp_path, "a"), _final(tmp_path, "b")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_fedavg_with_one_client_equals_its_local_training(tmp_path):
    cfg = _cfg(clients=1, rounds=1, partition="iid")
    _run(tmp_path, cfg)
    s = setup(cfg, torch.device("cpu"), synthetic())  # the same initial model, data and pool
    model = copy.deepcopy(s.model)
    ctx_algo = ALGORITHMS["fedavg"](cfg.algo_config(), [len(s.parts[0])], np.ones((1, N_CLASSES)))
    ctx = ClientContext(0, copy.deepcopy(model), cfg.resolved_lr(), cfg.momentum, {})
    order, aug = _generators(cfg, 0, 0, torch.device("cpu"))
    optimizer = make_optimizer(model, "sgd", cfg.resolved_lr(), cfg.momentum, cfg.weight_decay)
    local_train(model, optimizer, ctx_algo, ctx, s.task, s.data.train_x, s.data.train_y, s.parts[0], 1, 16,
                order, aug)
    final = _final(tmp_path)
    assert all(torch.equal(final[k], v) for k, v in model.state_dict().items())


def test_fednova_equals_fedavg_with_equal_steps():
    g = torch.Generator().manual_seed(0)
    states = [{"w": torch.randn(3, 2, generator=g), "n": torch.tensor(5)} for _ in range(3)]
    glob = {"w": torch.randn(3, 2, generator=g), "n": torch.tensor(4)}
    weights = [10, 30, 60]
    nova = fednova(glob, states, weights, steps=[7, 7, 7], momentum=0.9)
    avg = weighted_average(states, weights)
    assert torch.allclose(nova["w"], avg["w"], atol=1e-6) and nova["n"] == avg["n"]
    unequal = fednova(glob, states, weights, steps=[1, 7, 20], momentum=0.9)
    assert not torch.allclose(unequal["w"], avg["w"], atol=1e-3)


def test_aggregation_hand_computed():
    a, b = {"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, 6.0])}
    assert torch.allclose(weighted_average([a, b], [1, 3])["w"], torch.tensor([2.5, 5.0]))
    assert nova_norm(5, 0.0) == 5.0
    assert nova_norm(1, 0.9) == pytest.approx(1.0)  # one step: a = 1 whatever the momentum
    glob, avg = {"w": torch.tensor([1.0])}, {"w": torch.tensor([0.5])}
    new, v = server_momentum(glob, avg, None, beta=0.9, lr=1.0, nesterov=False)
    assert torch.allclose(new["w"], torch.tensor([0.5])) and torch.allclose(v["w"], torch.tensor([0.5]))
    new, v = server_momentum(new, {"w": torch.tensor([0.0])}, v, beta=0.9, lr=1.0, nesterov=False)
    assert torch.allclose(v["w"], torch.tensor([0.95])) and torch.allclose(new["w"], torch.tensor([-0.45]))


def test_fedvc_equals_fedavg_with_equal_client_sizes(tmp_path):
    _run(tmp_path, _cfg("fedavg", partition="iid"), "avg")  # 96 samples over 3 clients: 32 each
    _run(tmp_path, _cfg("fedvc", partition="iid"), "vc")
    a, b = _final(tmp_path, "avg"), _final(tmp_path, "vc")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_fedir_weights_are_one_for_the_global_distribution():
    global_counts = np.array([10.0, 20.0, 30.0, 40.0])
    assert np.allclose(importance_weights(global_counts, global_counts / 10), 1.0)
    skewed = importance_weights(global_counts, np.array([0.0, 5.0, 5.0, 0.0]))
    assert skewed[0] == 0 and skewed[1] == pytest.approx(0.2 / 0.5)


def test_scaffold_server_variate_is_the_mean_of_client_variates(tmp_path):
    cfg = _cfg("scaffold", rounds=1)
    s = setup(cfg, torch.device("cpu"), synthetic())
    train_round(s, cfg, 0, torch.device("cpu"), RunDir(tmp_path), None)
    for name, c in s.algo.server["c"].items():
        mean = sum(client["c"][name] for client in s.algo.clients) / len(s.algo.clients)
        assert torch.allclose(c, mean, atol=1e-6), name
    assert any(c.abs().sum() > 0 for c in s.algo.server["c"].values())


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_scaffold_client_variate_is_the_mean_gradient_under_momentum(momentum):
    """With a constant gradient g the client variate must come out as g, with or without momentum (a
    variate of g / (1 - rho) fed back through the momentum made SCAFFOLD collapse)."""
    algo = ALGORITHMS["scaffold"](ALGORITHMS["scaffold"].Config(), [10], np.ones((1, 2)))
    model = torch.nn.Linear(3, 1)
    ctx = ClientContext(0, copy.deepcopy(model), 0.1, momentum, algo.clients[0])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    g = torch.tensor([[0.5, -1.0, 2.0]])
    for _ in range(7):
        optimizer.zero_grad()
        ((model.weight * g).sum() + 2 * model.bias.sum()).backward()
        algo.before_step(ctx, model)
        optimizer.step()
        ctx.steps += 1
    algo.finish_client(ctx, model)
    assert torch.allclose(ctx.state["c"]["weight"], g, atol=1e-5)
    assert torch.allclose(ctx.state["c"]["bias"], torch.tensor([2.0]), atol=1e-5)


@pytest.mark.parametrize("algo,extra", [("fedavg", {}), ("scaffold", {}), ("feddyn", {}), ("moon", {}),
                                        ("fedavgm", {}), ("fedavg", {"centralized": True}),
                                        ("fedavg", {"bn": "local", "participation": 0.67})])
def test_resume_equals_uninterrupted(tmp_path, algo, extra):
    cfg = _cfg(algo, rounds=3, **extra)
    full = _run(tmp_path, cfg, "full")
    _run(tmp_path, cfg, "cut", stop_after=1)
    assert not (tmp_path / "cut" / "final.pt").exists()
    cut = _run(tmp_path, cfg, "cut", resume=True)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(full) == strip(cut)
    a, b = _final(tmp_path, "full"), _final(tmp_path, "cut")
    assert all(torch.equal(a[k], b[k]) for k in a)
