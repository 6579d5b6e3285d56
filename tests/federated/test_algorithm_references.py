"""Every FL algorithm against an independent reference written from its paper's equations.

For each algorithm, a plain-torch re-implementation of one client's local SGD and of the server update
(sharing no code with ``federated/``: its own functional forward pass, BatchNorm, SGD with momentum and
weight decay, losses and aggregation) runs 3 rounds on a tiny float64 model with BatchNorm and fixed data,
and the global weights must match ``federate``'s round engine to 1e-9 after every round.

The only things the two share are the inputs (initial weights, data, partition) and the documented
randomness contract of ``federated.rounds``: round r's client selection (and FedVC's draws) come from
``numpy.random.default_rng(SeedSequence([seed, r, 0]))``; client c's sample order of round r from a torch
generator seeded with ``SeedSequence([seed, r, c, 1])``; both are re-derived here.

Conventions the references follow (each named in the algorithm's docstring and docs/federated.md): BatchNorm
running statistics are the sample-weighted average of the clients' (integers rounded), never transformed
by a server step; batches of one sample are skipped; learning rate x lr_decay every lr_decay_every rounds.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from federated.algorithms import ALGORITHMS
from federated.datasets import ImageData
from federated.experiment import FederateConfig
from federated.rounds import train_round
from federated.setup import Setup
from federated.tasks import Classifier
from fpsfl.base.rundir import RunDir

torch.set_default_dtype(torch.float32)
C, CH, SIDE = 3, 4, 6  # classes, conv channels, image side
SIZES = (7, 12, 17)  # unequal clients; batch 5 gives partial last batches of 2 (none of 1)
BATCH, EPOCHS, ROUNDS = 5, 2, 3
EPS, BN_MOMENTUM = 1e-5, 0.1  # torch BatchNorm defaults
TOL = 1e-9


# ---------------------------------------------------------------- engine side: model, task, data
class TinyBackbone(nn.Module):
    feature_dim = CH

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, CH, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(CH)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.bn(self.conv(x))).mean((2, 3))


class PlainTask:
    """Identity inputs (already float64 NCHW), per-sample cross-entropy: nothing random outside SGD."""

    n_classes = C
    provides = frozenset({"features", "sample_labels"})

    def train_inputs(self, x, y, generator, noise):
        return x, y

    def eval_inputs(self, x, y):
        return x, y

    def loss(self, output, target):
        return F.cross_entropy(output, target, reduction="none")

    def sample_labels(self, y):
        return y

    def class_counts(self, y):
        return torch.bincount(y, minlength=C)

    @torch.no_grad()
    def evaluate(self, model, x, y):
        was = model.training
        model.eval()
        out = model(x)
        model.train(was)
        return {"loss": self.loss(out, y).mean().item(), "acc": (out.argmax(1) == y).double().mean().item()}


def make_data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    n = sum(SIZES)
    y = torch.randint(0, C, (n,), generator=g)
    x = torch.randn(n, 3, SIDE, SIDE, generator=g, dtype=torch.float64) + y.view(-1, 1, 1, 1) * 0.5
    ty = torch.arange(9) % C
    tx = torch.randn(9, 3, SIDE, SIDE, generator=g, dtype=torch.float64) + ty.view(-1, 1, 1, 1) * 0.5
    data = ImageData(x, y, tx, ty, tx[:0], ty[:0], C, [str(i) for i in range(C)], None, SIDE)
    bounds = np.cumsum((0,) + SIZES)
    parts = [torch.arange(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return data, parts


def engine(algo: str, tmp_path, sets=None, **cfg_kw):
    """Run ROUNDS rounds of federate's engine; returns (initial global state, global state after each
    round, the config)."""
    cfg = FederateConfig(algo=algo, algo_args=sets or {}, clients=len(SIZES), rounds=ROUNDS,
                         local_epochs=EPOCHS, batch_size=BATCH, lr=0.05, lr_decay=0.1, lr_decay_every=2,
                         eval_local=False, seed=3, **cfg_kw)
    data, parts = make_data()
    torch.manual_seed(0)
    model = Classifier(TinyBackbone(), C)
    counts = np.stack([torch.bincount(data.train_y[p], minlength=C).numpy() for p in parts])
    algorithm = ALGORITHMS[algo](cfg.algo_config(), [len(p) for p in parts], counts)
    algorithm.attach(model)
    model = model.double()
    s = Setup(data, parts, PlainTask(), model, algorithm, "")
    init = copy.deepcopy(model.state_dict())
    history = []
    for rnd in range(ROUNDS):
        train_round(s, cfg, rnd, torch.device("cpu"), RunDir(tmp_path), None)
        history.append(copy.deepcopy(s.model.state_dict()))
    return init, history, cfg


# ---------------------------------------------------------------- reference side: plain torch
def round_rng(seed: int, rnd: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, rnd, 0]))


def order_generator(seed: int, rnd: int, client: int) -> torch.Generator:
    s = int(np.random.SeedSequence([seed, rnd, client, 1]).generate_state(1, np.uint64)[0] >> 1)
    return torch.Generator().manual_seed(s)


def is_param(name: str) -> bool:
    return not name.endswith(("running_mean", "running_var", "num_batches_tracked"))


def forward(w: dict, x: Tensor, train: bool) -> tuple[Tensor, Tensor, dict]:
    """(representation z, logits, new BatchNorm buffers) of the tiny model held in ``w``."""
    h = F.conv2d(x, w["backbone.conv.weight"], padding=1)
    buffers = {}
    if train:
        mean, var = h.mean((0, 2, 3)), h.var((0, 2, 3), unbiased=False)
        n = h.numel() / h.shape[1]
        buffers = {"backbone.bn.running_mean": (1 - BN_MOMENTUM) * w["backbone.bn.running_mean"]
                   + BN_MOMENTUM * mean.detach(),
                   "backbone.bn.running_var": (1 - BN_MOMENTUM) * w["backbone.bn.running_var"]
                   + BN_MOMENTUM * var.detach() * n / (n - 1),
                   "backbone.bn.num_batches_tracked": w["backbone.bn.num_batches_tracked"] + 1}
    else:
        mean, var = w["backbone.bn.running_mean"], w["backbone.bn.running_var"]
    h = (h - mean.view(1, -1, 1, 1)) / torch.sqrt(var.view(1, -1, 1, 1) + EPS)
    h = h * w["backbone.bn.weight"].view(1, -1, 1, 1) + w["backbone.bn.bias"].view(1, -1, 1, 1)
    z = F.relu(h).mean((2, 3))
    if "projector.0.weight" in w:  # MOON: a 2-layer MLP, and the classifier reads its output
        z = F.linear(F.relu(F.linear(z, w["projector.0.weight"], w["projector.0.bias"])),
                     w["projector.2.weight"], w["projector.2.bias"])
    return z, F.linear(z, w["head.weight"], w["head.bias"]), buffers


class Client:
    """One client's local SGD (torch's convention: d = g + wd w; b = rho b + d; w -= lr b)."""

    def __init__(self, w: dict, lr: float, momentum: float, wd: float):
        self.w = {k: v.clone() for k, v in w.items()}
        self.lr, self.momentum, self.wd, self.buf, self.steps = lr, momentum, wd, {}, 0

    def step(self, x: Tensor, y: Tensor, loss_fn, correction: dict | None = None) -> None:
        params = {k: v.clone().requires_grad_(True) for k, v in self.w.items() if is_param(k)}
        z, logits, buffers = forward({**self.w, **params}, x, train=True)
        loss = loss_fn(params, z, logits, x, y)
        grads = dict(zip(params, torch.autograd.grad(loss, list(params.values())), strict=True))
        for k, g in grads.items():
            d = g + self.wd * self.w[k] + (correction[k] if correction else 0)
            self.buf[k] = d.clone() if k not in self.buf else self.momentum * self.buf[k] + d
            self.w[k] = self.w[k] - self.lr * self.buf[k]
        self.w.update(buffers)
        self.steps += 1


def train_client(w: dict, pools: list[Tensor], data, seed, rnd, client, lr, loss_fn, momentum=0.9,
                 correction=None, wd=1e-4) -> Client:
    c = Client(w, lr, momentum, wd)
    gen = order_generator(seed, rnd, client)
    for pool in pools:
        order = pool[torch.randperm(len(pool), generator=gen)]
        for batch in order.split(BATCH):
            if len(batch) >= 2:
                c.step(data.train_x[batch], data.train_y[batch], loss_fn, correction)
    return c


def cross_entropy(params, z, logits, x, y):
    return F.cross_entropy(logits, y)


def average(states: list[dict], weights) -> dict:
    p = np.asarray(weights, dtype=np.float64) / np.sum(weights)
    out = {}
    for k, ref in states[0].items():
        v = sum(float(pi) * s[k].double() for pi, s in zip(p, states, strict=True))
        out[k] = v.round().to(ref.dtype) if not ref.is_floating_point() else v
    return out


def merge(params: dict, clients: list[Client], weights) -> dict:
    """Server parameters plus the sample-weighted average of the clients' buffers."""
    buffers = average([{k: v for k, v in c.w.items() if not is_param(k)} for c in clients], weights)
    return {**params, **buffers}


def lr_of(cfg, rnd):
    return cfg.lr * cfg.lr_decay ** (rnd // cfg.lr_decay_every)


def select(rng, n, fraction, p=None):
    m = max(1, round(fraction * n))
    if m >= n:
        return list(range(n))
    if p is not None:  # proportional to size (FedVC): systematic sampling, written as a plain loop
        return proportional_select(rng, p, m)
    return sorted(rng.choice(n, m, replace=False).tolist())


def proportional_select(rng, p, m):
    """Inclusion probability min(1, ...) proportional to p, exactly m clients: a client whose share would
    reach 1 is certain and the others share the rest; then one uniform start and m unit steps over the
    clients in a random order."""
    pi, left, certain = [0.0] * len(p), m, set()
    while True:
        rest = [i for i in range(len(p)) if i not in certain]
        total = sum(p[i] for i in rest)
        new = {i for i in rest if left * p[i] / total >= 1}
        if not new:
            for i in rest:
                pi[i] = left * p[i] / total
            break
        certain |= new
        left -= len(new)
        for i in new:
            pi[i] = 1.0
        if left == 0:
            break
    order = rng.permutation(len(p))
    point, acc, chosen = rng.random(), 0.0, []
    for i in order:
        acc += pi[i]
        while point < acc and len(chosen) < m:
            chosen.append(int(i))
            point += 1.0
    return sorted(chosen)


def reference_rounds(cfg, init, round_fn):
    """Run ROUNDS rounds of ``round_fn(w, rnd, rng, lr) -> w`` from ``init``; the global state after each."""
    w, history = {k: v.clone() for k, v in init.items()}, []
    for rnd in range(ROUNDS):
        w = round_fn(w, rnd, round_rng(cfg.seed, rnd), lr_of(cfg, rnd))
        history.append(w)
    return history


def assert_same(engine_history, reference_history):
    for rnd, (a, b) in enumerate(zip(engine_history, reference_history, strict=True)):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].dtype == b[k].dtype, (rnd, k)
            err = (a[k].double() - b[k].double()).abs().max().item()
            assert err <= TOL, f"round {rnd + 1}, {k}: max |engine - reference| = {err:.3g}"


# ---------------------------------------------------------------- one reference per algorithm
def fedavg_like(data, parts, cfg, loss_for=None, server=None, momentum=0.9):
    """Rounds in which every client trains with ``loss_for(client, w_global)`` and the server maps
    (w_global params, clients, sizes) to new params (default: the sample-weighted average)."""
    def round_fn(w, rnd, rng, lr):
        chosen = select(rng, len(parts), cfg.participation)
        clients = [train_client(w, [parts[i]] * EPOCHS, data, cfg.seed, rnd, i, lr,
                                loss_for(i, w) if loss_for else cross_entropy, momentum) for i in chosen]
        sizes = [len(parts[i]) for i in chosen]
        glob = {k: v for k, v in w.items() if is_param(k)}
        new = server(glob, clients, sizes) if server else average(
            [{k: v for k, v in c.w.items() if is_param(k)} for c in clients], sizes)
        return merge(new, clients, sizes)
    return round_fn


def test_fedavg(tmp_path):
    init, history, cfg = engine("fedavg", tmp_path)
    data, parts = make_data()
    assert_same(history, reference_rounds(cfg, init, fedavg_like(data, parts, cfg)))


def test_fedavg_partial_participation(tmp_path):
    init, history, cfg = engine("fedavg", tmp_path, participation=0.67)
    data, parts = make_data()
    assert_same(history, reference_rounds(cfg, init, fedavg_like(data, parts, cfg)))


def test_fedprox(tmp_path):
    mu = 0.3
    init, history, cfg = engine("fedprox", tmp_path, {"mu": mu})
    data, parts = make_data()

    def loss_for(client, w_glob):
        return lambda params, z, logits, x, y: F.cross_entropy(logits, y) + mu / 2 * sum(
            ((params[k] - w_glob[k]) ** 2).sum() for k in params)
    assert_same(history, reference_rounds(cfg, init, fedavg_like(data, parts, cfg, loss_for)))


def test_feddyn(tmp_path):
    alpha = 0.1
    init, history, cfg = engine("feddyn", tmp_path, {"alpha": alpha})
    data, parts = make_data()
    grad = {}  # client -> nabla L_k(theta_k^{t-1}), zero before its first round (Acar et al., Algorithm 1)
    h = {}

    def round_fn(w, rnd, rng, lr):
        glob = {k: v for k, v in w.items() if is_param(k)}
        clients = []
        for i in range(len(parts)):
            g = grad.get(i, {k: torch.zeros_like(v) for k, v in glob.items()})

            def loss(params, z, logits, x, y, g=g):
                return (F.cross_entropy(logits, y) - sum((g[k] * params[k]).sum() for k in params)
                        + alpha / 2 * sum(((params[k] - glob[k]) ** 2).sum() for k in params))
            c = train_client(w, [parts[i]] * EPOCHS, data, cfg.seed, rnd, i, lr, loss)
            grad[i] = {k: g[k] - alpha * (c.w[k] - glob[k]) for k in glob}
            clients.append(c)
        for k in glob:
            h[k] = h.get(k, 0) - alpha / len(parts) * sum(c.w[k] - glob[k] for c in clients)
        new = {k: sum(c.w[k] for c in clients) / len(clients) - h[k] / alpha for k in glob}
        return merge(new, clients, [len(p) for p in parts])
    assert_same(history, reference_rounds(cfg, init, round_fn))


def test_moon(tmp_path):
    mu, tau = 2.0, 0.5
    init, history, cfg = engine("moon", tmp_path, {"mu": mu, "tau": tau, "proj_dim": 3})
    assert init["head.weight"].shape == (C, 3)  # the classifier reads z, as MOON's reference model
    data, parts = make_data()
    previous = {}  # client -> its last local model (all entries)

    def round_fn(w, rnd, rng, lr):
        clients = []
        for i in range(len(parts)):
            prev = previous.get(i, w)

            def loss(params, z, logits, x, y, prev=prev):
                with torch.no_grad():
                    z_glob = forward(w, x, train=False)[0]
                    z_prev = forward(prev, x, train=False)[0]
                pos = F.cosine_similarity(z, z_glob, dim=1) / tau
                neg = F.cosine_similarity(z, z_prev, dim=1) / tau
                contrast = -torch.log(torch.exp(pos) / (torch.exp(pos) + torch.exp(neg)))
                return F.cross_entropy(logits, y) + mu * contrast.mean()
            c = train_client(w, [parts[i]] * EPOCHS, data, cfg.seed, rnd, i, lr, loss)
            previous[i] = dict(c.w)
            clients.append(c)
        sizes = [len(p) for p in parts]
        new = average([{k: v for k, v in c.w.items() if is_param(k)} for c in clients], sizes)
        return merge(new, clients, sizes)
    assert_same(history, reference_rounds(cfg, init, round_fn))


def _scaffold(tmp_path, momentum: float, sets: dict, count):
    """SCAFFOLD option II with partial participation; ``count(K)`` is the step count of c_i+."""
    init, history, cfg = engine("scaffold", tmp_path, sets, participation=0.67, momentum=momentum)
    data, parts = make_data()
    glob0 = {k: v for k, v in init.items() if is_param(k)}
    c_server = {k: torch.zeros_like(v) for k, v in glob0.items()}
    c_client = {i: {k: torch.zeros_like(v) for k, v in glob0.items()} for i in range(len(parts))}

    def round_fn(w, rnd, rng, lr):
        chosen = select(rng, len(parts), cfg.participation)
        glob = {k: v for k, v in w.items() if is_param(k)}
        clients, deltas = [], []
        for i in chosen:
            corr = {k: c_server[k] - c_client[i][k] for k in glob}
            c = train_client(w, [parts[i]] * EPOCHS, data, cfg.seed, rnd, i, lr, cross_entropy, momentum,
                             corr)
            new_ci = {k: c_client[i][k] - c_server[k] + (glob[k] - c.w[k]) / (count(c.steps) * lr)
                      for k in glob}
            deltas.append({k: new_ci[k] - c_client[i][k] for k in glob})
            c_client[i] = new_ci
            clients.append(c)
        for k in glob:
            c_server[k] = c_server[k] + len(chosen) / len(parts) * sum(d[k] for d in deltas) / len(deltas)
        sizes = [len(parts[i]) for i in chosen]
        new = average([{k: v for k, v in c.w.items() if is_param(k)} for c in clients], sizes)
        return merge(new, clients, sizes)
    assert_same(history, reference_rounds(cfg, init, round_fn))


def test_scaffold_option_two_plain_sgd(tmp_path):
    """Karimireddy et al. option II as written: c_i+ = c_i - c + (x - y_i) / (K lr), plain SGD."""
    _scaffold(tmp_path, momentum=0.0, sets={}, count=lambda k: k)


def test_scaffold_momentum_aware_variant(tmp_path):
    """The default under momentum: K replaced by a(K, rho) = (K - rho (1 - rho^K) / (1 - rho)) / (1 - rho)."""
    rho = 0.9
    _scaffold(tmp_path, momentum=rho, sets={},
              count=lambda k: (k - rho * (1 - rho ** k) / (1 - rho)) / (1 - rho))


def test_scaffold_plain_count_under_momentum(tmp_path):
    """steps=plain keeps option II's K even with momentum."""
    _scaffold(tmp_path, momentum=0.9, sets={"steps": "plain"}, count=lambda k: k)


def test_fednova(tmp_path):
    """Wang et al. 2020 / NIID-Bench: w - tau_eff sum_i p_i (w - w_i) / a_i, a_i momentum-aware."""
    rho = 0.9
    init, history, cfg = engine("fednova", tmp_path)
    data, parts = make_data()

    def server(glob, clients, sizes):
        p = np.asarray(sizes, dtype=np.float64) / sum(sizes)
        a = [(c.steps - rho * (1 - rho ** c.steps) / (1 - rho)) / (1 - rho) for c in clients]
        assert len({c.steps for c in clients}) > 1  # unequal local steps: the case FedNova is for
        tau_eff = sum(pi * ai for pi, ai in zip(p, a, strict=True))
        return {k: glob[k] - tau_eff * sum(pi / ai * (glob[k] - c.w[k]) for pi, ai, c in zip(p, a, clients,
                                                                                              strict=True))
                for k in glob}
    assert_same(history, reference_rounds(cfg, init, fedavg_like(data, parts, cfg, server=server)))


@pytest.mark.parametrize("nesterov", [False, True])
def test_fedavgm(tmp_path, nesterov):
    """Hsu et al. 2019: v <- beta v + (w - avg); w <- w - lr v (Nesterov: w - lr (delta + beta v))."""
    beta, server_lr = 0.7, 0.8
    init, history, cfg = engine("fedavgm", tmp_path, {"beta": beta, "server_lr": server_lr,
                                                      "nesterov": nesterov})
    data, parts = make_data()
    v = {}

    def server(glob, clients, sizes):
        avg = average([{k: c.w[k] for k in glob} for c in clients], sizes)
        out = {}
        for k in glob:
            delta = glob[k] - avg[k]
            v[k] = beta * v[k] + delta if k in v else delta
            out[k] = glob[k] - server_lr * (delta + beta * v[k] if nesterov else v[k])
        return out
    assert_same(history, reference_rounds(cfg, init, fedavg_like(data, parts, cfg, server=server)))


@pytest.mark.parametrize("draw", ["round", "epoch"])
def test_fedvc(tmp_path, draw):
    """Hsu et al. 2020: selection proportional to size, k examples resampled once per round the client is
    selected (with replacement for a smaller client) and passed over E times, equal weights; draw=epoch:
    a fresh draw every local epoch."""
    k = 10
    init, history, cfg = engine("fedvc", tmp_path, {"examples": k, "draw": draw}, participation=0.67)
    data, parts = make_data()

    def round_fn(w, rnd, rng, lr):
        sizes = np.asarray(SIZES, dtype=np.float64)
        chosen = select(rng, len(parts), cfg.participation, p=sizes / sizes.sum())
        clients = []
        for i in chosen:
            n = len(parts[i])
            if draw == "round":
                pools = [parts[i][torch.as_tensor(rng.choice(n, k, replace=n < k))]] * EPOCHS
            else:
                pools = [parts[i][torch.as_tensor(rng.choice(n, k, replace=n < k))] for _ in range(EPOCHS)]
            clients.append(train_client(w, pools, data, cfg.seed, rnd, i, lr, cross_entropy))
        glob = {key: v for key, v in w.items() if is_param(key)}
        new = {key: sum(c.w[key] for c in clients) / len(clients) for key in glob}
        return merge(new, clients, [k] * len(clients))
    assert_same(history, reference_rounds(cfg, init, round_fn))


def test_fedir(tmp_path):
    """Hsu et al. 2020: loss sum_j w_j l_j / sum_j w_j with w = p(y) / q_i(y)."""
    init, history, cfg = engine("fedir", tmp_path)
    data, parts = make_data()
    p = torch.bincount(data.train_y, minlength=C).double()
    p = p / p.sum()

    def loss_for(client, w_glob):
        q = torch.bincount(data.train_y[parts[client]], minlength=C).double()
        q = q / q.sum()

        def loss(params, z, logits, x, y):
            weight = p[y] / q[y]
            return (weight * F.cross_entropy(logits, y, reduction="none")).sum() / weight.sum()
        return loss
    assert_same(history, reference_rounds(cfg, init, fedavg_like(data, parts, cfg, loss_for)))


def test_fedavg_local_batchnorm(tmp_path):
    """--bn local: each client starts from its own last running statistics; the global model's are the
    sample-weighted average, as ever."""
    init, history, cfg = engine("fedavg", tmp_path, bn="local")
    data, parts = make_data()
    own = {}

    def round_fn(w, rnd, rng, lr):
        clients = []
        for i in range(len(parts)):
            start = {**w, **own.get(i, {})}
            c = train_client(start, [parts[i]] * EPOCHS, data, cfg.seed, rnd, i, lr, cross_entropy)
            own[i] = {k: v for k, v in c.w.items() if not is_param(k)}
            clients.append(c)
        sizes = [len(p) for p in parts]
        new = average([{k: v for k, v in c.w.items() if is_param(k)} for c in clients], sizes)
        return merge(new, clients, sizes)
    assert_same(history, reference_rounds(cfg, init, round_fn))


def test_every_algorithm_has_a_reference():
    tested = {name.removeprefix("test_").split("_")[0] for name in globals() if name.startswith("test_")}
    assert set(ALGORITHMS) <= tested, sorted(set(ALGORITHMS) - tested)
