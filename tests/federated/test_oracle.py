"""Pure math of the analyses (Chen et al., ICLR 2023, §6): combinations, convex search, variance, BN."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from analysis.dynamics import gains
from federated.aggregate import weighted_average
from federated.oracle.combine import combine, loss_summary, sample_simplex, stack_states
from federated.oracle.convex import ConvexConfig, loss_variance, optimal_convex
from federated.oracle.evaluate import Evaluator, recompute_bn


class LinearTask:
    """A classification task on plain feature vectors, enough for the analyses."""

    def loss(self, output, target):
        return F.cross_entropy(output, target, reduction="none")

    def eval_inputs(self, x, y):
        return x, y

    @torch.no_grad()
    def evaluate(self, model, x, y):
        model.eval()
        out = model(x)
        return {"loss": self.loss(out, y).mean().item(), "acc": (out.argmax(1) == y).float().mean().item()}


def _toy(seed=0, n=400, d=8, k=4, clients=4):
    """Labels come from client 2's linear model; the others are random linear models."""
    g = torch.Generator().manual_seed(seed)
    states = [{"weight": torch.randn(k, d, generator=g), "bias": torch.zeros(k)} for _ in range(clients)]
    x = torch.randn(n, d, generator=g)
    y = (x @ states[2]["weight"].T).argmax(1)
    return states, x, y


def _search(states, x, y, sizes, cfg):
    model, task = nn.Linear(x.shape[1], states[0]["weight"].shape[0]), LinearTask()
    evaluate = Evaluator(model, task, x, y)

    def batches(epoch):
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(epoch))
        return [(x[order[i:i + cfg.batch_size]], y[order[i:i + cfg.batch_size]])
                for i in range(0, len(y), cfg.batch_size)]

    return optimal_convex(model, states, sizes, evaluate, task.loss, batches, cfg)


def test_combine_equals_fedavg_average_with_size_weights():
    g = torch.Generator().manual_seed(0)
    states = [{"w": torch.randn(3, 2, generator=g), "n": torch.tensor(5)} for _ in range(3)]
    mixed = combine(states, [10, 30, 60])
    expected = weighted_average(states, [10, 30, 60])
    assert torch.allclose(mixed["w"], expected["w"], atol=1e-6)
    assert mixed["n"] == 5
    assert torch.allclose(combine(stack_states(states), [1, 0, 0])["w"], states[0]["w"])
    with pytest.raises(ValueError):
        combine(states, [1, -1, 1])


def test_convex_search_finds_the_client_that_is_exactly_right():
    states, x, y = _toy()
    sizes = [500, 400, 10, 300]  # FedAvg barely weighs the right client
    result = _search(states, x, y, sizes, ConvexConfig(lr=5.0, epochs=30, batch_size=50, random_starts=1))
    assert result["fedavg_acc"] < 0.9
    assert result["convex_acc"] >= 0.97
    assert int(np.argmax(result["lambda"])) == 2 and result["lambda"][2] > 0.8
    assert abs(sum(result["lambda"]) - 1) < 1e-6


@pytest.mark.parametrize("seed", range(4))
def test_convex_result_is_never_below_fedavg(seed):
    states, x, y = _toy(seed)
    sizes = np.random.default_rng(seed).integers(1, 100, len(states)).tolist()
    result = _search(states, x, y, sizes, ConvexConfig(lr=1e-5, epochs=1, batch_size=32, random_starts=1))
    assert result["convex_acc"] >= result["fedavg_acc"]
    assert result["fedavg_lambda"] == pytest.approx(np.asarray(sizes) / sum(sizes))
    names = [c["start"] for c in result["candidates"]]
    assert names[:3] == ["fedavg-weights", "uniform", "fedavg"] and len(names) == 4


def test_loss_variance_of_identical_models_is_zero_and_of_distinct_ones_is_not():
    states, x, y = _toy()
    evaluate = Evaluator(nn.Linear(8, 4), LinearTask(), x, y)
    same = loss_variance([states[0]] * 4, evaluate, 300, np.random.default_rng(0))
    assert len(same) == 300 and loss_summary(same)["var"] < 1e-12
    spread = loss_summary(loss_variance(states, evaluate, 300, np.random.default_rng(0)))
    assert spread["var"] > 1e-3 and spread["p2_5"] <= spread["mean"] <= spread["p97_5"]


def test_simplex_samples_and_summary():
    lam = sample_simplex(1000, 5, np.random.default_rng(0))
    assert lam.shape == (1000, 5) and np.allclose(lam.sum(1), 1) and (lam >= 0).all()
    assert np.allclose(lam.mean(0), 0.2, atol=0.02)  # Dirichlet(1): uniform on the simplex
    summary = loss_summary(np.arange(1001.0))
    assert summary["mean"] == 500 and summary["p2_5"] == 25 and summary["p97_5"] == 975


def test_recomputed_bn_statistics_are_the_data_statistics():
    model = nn.Sequential(nn.BatchNorm1d(3))
    model[0].running_mean.fill_(7.0)
    data = torch.randn(6, 50, 3) * torch.tensor([1.0, 2.0, 3.0]) + 4.0
    recompute_bn(model, lambda: list(data))
    assert not model.training and model[0].momentum == 0.1
    assert torch.allclose(model[0].running_mean, data.reshape(-1, 3).mean(0), atol=1e-5)
    assert torch.allclose(model[0].running_var, data.var(1).mean(0), atol=1e-4)  # mean of unbiased vars


def test_eq3_gains_add_up_on_logged_numbers():
    rows = [{"round": 1, "test_acc": 0.31, "local_acc": 0.25, "init_test_acc": 0.1},
            {"round": 2, "test_acc": 0.47, "local_acc": 0.33},
            {"round": 3, "test_acc": 0.52, "local_acc": 0.55}]
    out = gains(rows)
    assert [r["prev"] for r in out] == [0.1, 0.31, 0.47]
    for r, row in zip(out, rows, strict=True):
        assert r["prev"] + r["d_local"] + r["d_global"] == pytest.approx(row["test_acc"], abs=1e-15)
    assert out[0]["d_local"] == pytest.approx(0.15) and out[0]["d_global"] == pytest.approx(0.06)
    assert len(gains(rows[1:])) == 1  # without the initial accuracy, round 2 is the first gain
