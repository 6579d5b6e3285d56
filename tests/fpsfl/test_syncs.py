"""The host-sync counter (issue 40) and the training steps it watches: one client's local step of
``federate`` reads nothing back from the device, for every algorithm."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from federated.algorithms import ALGORITHMS, ClientContext
from federated.local import compile_model, epoch_batches, local_train, make_optimizer
from federated.seeding import client_generators
from federated.setup import setup
from fpsfl.base.syncs import SyncCounter
from tests.federated.test_algorithms import _cfg, synthetic
from tests.pretrain.test_graphed import MOCO_VARIANTS

X = torch.arange(6.0) - 2.5
COUNTS = torch.tensor([1, 0, 2, 1, 1, 1])

SYNCS = {  # one call of each kind a GPU step must not make, and its name in the counter
    "item": lambda: X[0].item(),
    "tolist": lambda: X.tolist(),
    "cpu": lambda: X.cpu(),
    "__bool__": lambda: bool(X[0] > 0),
    "__float__": lambda: float(X.sum()),
    "nonzero": lambda: X.nonzero(),
    "bool-index": lambda: X[X > 0],
    "where(cond)": lambda: torch.where(X > 0),
    "tensor": lambda: torch.tensor([1.0, 2.0], device=X.device),
    "new_tensor": lambda: X.new_tensor([1.0]),
    "to": lambda: X.to("cpu"),
    "repeat_interleave": lambda: X.repeat_interleave(COUNTS),
}


@pytest.mark.parametrize("name", sorted(SYNCS))
def test_each_kind_of_sync_is_counted_once(name):
    with SyncCounter() as counter:
        SYNCS[name]()
    assert dict(counter.calls) == {name: 1}


def test_device_work_is_not_counted():
    with SyncCounter() as counter:
        y = (X * 2 + 1).to(torch.float64).relu().sum(0, keepdim=True)
        X.repeat_interleave(3)  # a fixed count: the output size is known without the values
        torch.where(X > 0, X, -X)
        torch.as_tensor(y, device=X.device)  # a tensor from a tensor: no host data
        torch.tensor([1, 2])  # a host tensor: nothing copied to a device
    assert counter.total == 0, dict(counter.calls)


def one_client(algo_name: str, epochs: int, batch: int, compiled: bool = False, size: int | None = None):
    """One client's local training as federate runs it, from a fresh model (compiled in place with
    ``compiled``, :func:`federated.local.compile_model`) on ``size`` px inputs: ``train(steps)`` runs
    :func:`local_train` over those batches (the loss read after the last, as on a GPU), ``batches`` are
    ``epochs`` local epochs of ``batch`` samples, and ``model`` is what trains."""
    cfg = _cfg(algo_name, clients=1, rounds=1, partition="iid", input_size=size)
    s = setup(cfg, torch.device("cpu"), synthetic(n_train=128))
    model = copy.deepcopy(s.model)
    if compiled:
        compile_model(model, torch.device("cpu"))
    algo = ALGORITHMS[algo_name](cfg.algo_config(), [len(s.parts[0])], np.ones((1, 4)))
    algo.attach(model)
    ctx = ClientContext(0, copy.deepcopy(model).eval().requires_grad_(False), 0.05, 0.9, algo.clients[0])
    order, aug = client_generators(0, 0, 0, torch.device("cpu"))
    optimizer = make_optimizer(model, "sgd", 0.05, 0.9, 1e-4)
    batches = epoch_batches([s.parts[0]] * epochs, batch, order)

    def train(steps: list[torch.Tensor]) -> None:
        local_train(model, optimizer, algo, ctx, s.task, s.data.train_x, s.data.train_y, steps, aug,
                    check_every=0)
    return train, batches, model


def _local_syncs(algo_name: str, epochs: int) -> tuple[int, dict]:
    train, batches, _ = one_client(algo_name, epochs, 16)
    train(batches[:1])  # warm-up: the device constants are made once
    with SyncCounter() as counter:
        train(batches)
    return len(batches), dict(counter.calls)


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_a_local_step_of_federate_reads_nothing_back(one_thread, algo):
    """Twice the steps, the same syncs: all of them are per local training (the one read of the summed
    loss, the hooks' tensors moved once), none per step. As a GPU runs it: the loss read after the last
    step only (check_every=0; a CPU reads it every 8 steps, where a read waits for nothing)."""
    short, few = _local_syncs(algo, 1)
    long, more = _local_syncs(algo, 2)
    assert long == 2 * short >= 8
    assert few == more and few.get("item") == 1, (few, more)


@pytest.fixture
def sync_free(monkeypatch):
    import fpsfl.base.images as images
    monkeypatch.setattr(images, "SYNC_FREE", True)
    return images


def _pretrain_methods() -> list[str]:
    from pretrain.methods import METHODS
    return list(METHODS)


def _views(n: int = 24) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, 256, (2, n, 32, 32, 3), dtype=torch.uint8, generator=gen)


@pytest.mark.parametrize("background_p", [0.0, 0.5])
def test_pretraining_augmentation_has_a_sync_free_form_equal_to_the_host_form(monkeypatch, background_p):
    """The host form (CPU default) reads the jitter order and the selected samples back; the form
    accelerators run reads nothing and gives the same views, bit for bit, from the same generator (with
    backgrounds behind half the views too)."""
    import fpsfl.base.images as images
    from fractals.stream import augment_views
    out, calls = {}, {}
    cfg = images.AugmentConfig(background_p=background_p)
    for form in (False, True):
        monkeypatch.setattr(images, "SYNC_FREE", form)
        gen = torch.Generator().manual_seed(0)
        augment_views(_views(), 2, cfg, gen)  # warm-up: device constants
        with SyncCounter() as counter:
            out[form] = augment_views(_views(), 2, cfg, gen)
        calls[form] = dict(counter.calls)
    assert calls[True] == {} and calls[False].get("nonzero", 0) >= 2 and calls[False].get("tolist") == 2
    assert torch.equal(out[True], out[False])


@pytest.mark.parametrize("name", [*sorted(_pretrain_methods()), *(f"mocov2+{v}" for v in MOCO_VARIANTS)])
def test_a_pretraining_step_reads_nothing_back(sync_free, name):
    """Every method's step (MoCo-v2's bank update included: lightly reads its position back every step; the
    mask of a bank that started empty; the uniformity term's masked diagonal)."""
    from fractals.stream import augment_views
    from pretrain.methods import METHODS
    from pretrain.recipe import PretrainConfig
    from pretrain.train import build_method, make_optimizer
    name, _, variant = name.partition("+")
    cfg = PretrainConfig(method=name, width=0.25, batch_size=16, method_args=MOCO_VARIANTS.get(variant, {}))
    n_classes = 5 if METHODS[name].labels else None
    method = build_method(cfg, n_classes, torch.device("cpu")).train()
    optimizer, _ = make_optimizer(method, cfg)
    gen = torch.Generator().manual_seed(0)
    labels = {"multihot": (torch.arange(16 * 5).view(16, 5) % 3 == 0).float(), "class": torch.arange(16) % 5}

    def step():
        views = augment_views(_views(16), method.n_views, method.augment, gen)
        loss, _ = method(views, labels.get(method.labels))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        method.after_step()
    step()
    with SyncCounter() as counter:
        step()
    assert counter.total == 0, dict(counter.calls)


@pytest.mark.parametrize("algo", ["fedavg", "scaffold", "moon"])
def test_a_vectorised_round_reads_the_same_whatever_its_steps(tmp_path, monkeypatch, one_thread, algo):
    """``--client-batch``: a round of 2 local epochs makes the syncs of a round of 1 (evaluation and
    aggregation), none per step, with partial groups (alpha 0.5 gives clients of unequal sizes). As a GPU
    runs it: the losses read after the last step."""
    import federated.batched as batched
    from tests.federated.test_batched import _round
    monkeypatch.setattr(batched, "check_interval", lambda device: 0)
    calls = []
    for epochs in (1, 2):
        cfg = _cfg(algo, clients=4, batch_size=12, local_epochs=epochs, alpha=0.5)
        with SyncCounter() as counter:
            _round(tmp_path, cfg, 4, f"e{epochs}")
        calls.append(dict(counter.calls))
    assert calls[0] == calls[1]
