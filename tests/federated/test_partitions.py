"""Non-IID partitions: every split covers each sample once, is seeded, meets min_size or says why."""

import copy
import json
import pickle
import time
from dataclasses import FrozenInstanceError, dataclass

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from federated.partitions import (
    PARTITIONS,
    Partition,
    PartitionConfig,
    PartitionError,
    PartitionSettings,
    client_noise,
    default_min_size,
    headlines,
    indices_sha256,
    partition,
    setting_fields,
    summary,
    write_partition_report,
)
from fpsfl.base.settings import setting

NAMES = list(PARTITIONS)


def _labels(seed: int, n: int, classes: int, skew: float = 100.0) -> np.ndarray:
    """``n`` labels in [0, classes) with class frequencies ~ Dir(skew) (small skew: a few big classes)."""
    rng = np.random.default_rng(seed)
    return rng.choice(classes, size=n, p=rng.dirichlet(np.full(classes, skew))).astype(np.int64)


@st.composite
def cases(draw, name: str):
    n = draw(st.integers(1, 2000))
    classes = draw(st.integers(1, 20))
    labels = _labels(draw(st.integers(0, 2**32 - 1)), n, classes, draw(st.sampled_from([0.1, 1.0, 100.0])))
    ids = np.random.default_rng(n).integers(0, draw(st.integers(1, 30)), n) * 7 - 50  # any ints, any order
    present = len(np.unique(labels))
    cfg = PartitionConfig(
        name=name, clients=draw(st.integers(1, min(n, 40))), alpha=10 ** draw(st.floats(-2, 2)),
        beta=10 ** draw(st.floats(-2, 2)), labels_per_client=draw(st.integers(1, present)),
        noise=draw(st.floats(0, 1)), min_size=draw(st.sampled_from([0, 1, 5, 20])),
        max_redraws=draw(st.integers(1, 5)), seed=draw(st.integers(0, 2**63)))
    return labels, ids, classes, cfg


def _must_fail(labels, ids, cfg) -> bool | None:
    """True: this case must raise; False: it must succeed; None: either (a bounded redraw may miss)."""
    if cfg.name == "natural":
        return bool(np.unique(ids, return_counts=True)[1].min() < cfg.min_size)
    if cfg.clients * cfg.min_size > len(labels):
        return True
    if cfg.name == "shards" and cfg.clients * cfg.labels_per_client < len(np.unique(labels)):
        return True
    if cfg.name in ("iid", "noise") or cfg.min_size == 0:
        return False
    return None


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_exact_cover_sorted_seeded_min_size_or_error(name, data):
    labels, ids, classes, cfg = data.draw(cases(name))
    expected = _must_fail(labels, ids, cfg)
    start = time.perf_counter()
    try:
        parts = partition(labels, cfg, natural=ids)
    except PartitionError as e:
        event("raised")
        assert time.perf_counter() - start < 5  # bounded redraws, never a hang
        assert "\n" not in str(e) and str(e)
        assert expected is not False, f"{cfg} should have succeeded: {e}"
        return
    assert expected is not True, f"{cfg} should have raised"
    event("split")
    n_parts = len(np.unique(ids)) if name == "natural" else cfg.clients
    assert len(parts) == n_parts
    for p in parts:
        assert p.dtype == np.int64 and p.ndim == 1 and np.all(np.diff(p) > 0)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))
    assert min(len(p) for p in parts) >= cfg.min_size
    again = partition(labels, cfg, natural=ids)  # determinism: same config, same split
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    info = summary(parts, labels, classes)
    assert info["sizes"] == [len(p) for p in parts] and info["n_samples"] == len(labels)
    assert np.asarray(info["class_counts"]).sum(0).tolist() == np.bincount(labels, minlength=classes).tolist()
    if name == "shards":
        assert max(info["classes_per_client"]) <= cfg.labels_per_client
    if name == "natural":  # part k is exactly the samples of the k-th smallest id
        for uid, p in zip(np.unique(ids), parts, strict=True):
            np.testing.assert_array_equal(p, np.flatnonzero(ids == uid))


@pytest.mark.parametrize("name", NAMES)
def test_seed_changes_the_split(name):
    labels = _labels(0, 600, 10)
    ids = np.arange(600) % 7
    a, b = (partition(labels, PartitionConfig(name=name, clients=5, seed=s), natural=ids) for s in (0, 1))
    same = all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert same == (name == "natural")  # natural ids leave nothing to draw


def _class_shares(parts, labels, classes):
    counts = np.asarray(summary(parts, labels, classes)["class_counts"], dtype=float)
    return counts / counts.sum(1, keepdims=True)


def test_dirichlet_large_alpha_is_near_iid_and_tiny_alpha_is_one_class_per_client():
    labels = np.repeat(np.arange(10), 2000)
    rng = np.random.default_rng(3)
    labels = labels[rng.permutation(len(labels))]

    def worst_gap(alpha):
        parts = partition(labels, PartitionConfig(alpha=alpha))
        return np.abs(_class_shares(parts, labels, 10) - 0.1).max()

    assert worst_gap(1e4) < 0.02
    assert worst_gap(0.3) > 0.1  # the default is far from IID: the check above can fail
    parts = partition(labels, PartitionConfig(alpha=0.01))
    assert max(len(p) for p in parts) <= len(labels) / 10 + 2000  # balance trick: full clients take no more
    shares = _class_shares(parts, labels, 10)
    assert (shares.max(1) > 0.5).sum() >= 8 and np.median(shares.max(1)) > 0.9  # one class holds the majority


def test_dirichlet_balance_none_is_the_plain_per_class_split():
    """balance=none (Chen et al. §4.2, issue 41): each class cut at its own Dir(alpha) draw, so a client may
    hold far more than N/M; niid-bench caps what a full client receives. Same seed, same classes' order."""
    labels = np.repeat(np.arange(10), 2000)
    plain = partition(labels, PartitionConfig(alpha=0.1, balance="none", seed=1))
    capped = partition(labels, PartitionConfig(alpha=0.1, balance="niid-bench", seed=1))
    assert sorted(np.concatenate(plain).tolist()) == list(range(len(labels)))  # every sample once
    assert max(len(p) for p in capped) <= len(labels) / 10 + 2000
    assert max(len(p) for p in plain) > len(labels) / 10 + 2000  # the plain split lets a client grow
    with pytest.raises(ValueError, match="balance"):
        PartitionConfig(balance="even")


@pytest.mark.parametrize("k", [1, 2, 3])
def test_shards_k_labels_each_and_even_split_within_a_label(k):
    labels = _labels(1, 3000, 10, skew=1.0)
    parts = partition(labels, PartitionConfig(name="shards", clients=12, labels_per_client=k, min_size=0))
    counts = np.asarray(summary(parts, labels, 10)["class_counts"])
    holders = counts > 0
    assert holders.sum(1).max() <= k
    uses = holders.sum(0)
    assert uses.min() >= 1 and uses.max() - uses.min() <= 1  # least-used-first dealing
    for c in range(10):  # a label's samples split evenly among its holders
        held = counts[holders[:, c], c]
        assert held.max() - held.min() <= 1


def test_shards_niid_bench_deal_gives_client_i_label_i_mod_c_and_refuses_orphan_labels():
    """NIID-Bench's code: client i holds label i mod C plus k - 1 others at random; a label nobody holds
    would lose its samples, which is refused."""
    labels = _labels(1, 3000, 10, skew=1.0)
    cfg = PartitionConfig(name="shards", clients=20, labels_per_client=3, min_size=0, deal="niid-bench")
    parts = partition(labels, cfg)
    holders = np.asarray(summary(parts, labels, 10)["class_counts"]) > 0
    assert (holders.sum(1) == 3).all() and all(holders[i, i % 10] for i in range(20))
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(labels)))
    balanced = partition(labels, PartitionConfig(name="shards", clients=20, labels_per_client=3, min_size=0))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, balanced, strict=True))
    with pytest.raises(PartitionError, match="deal=niid-bench left"):
        partition(labels, PartitionConfig(name="shards", clients=5, labels_per_client=2, min_size=0,
                                          deal="niid-bench"))


def test_quantity_sizes_vary_and_iid_sizes_do_not():
    labels = _labels(2, 5000, 10)
    sizes = [len(p) for p in partition(labels, PartitionConfig(name="quantity"))]
    assert np.std(sizes) / np.mean(sizes) > 0.2
    sizes = [len(p) for p in partition(labels, PartitionConfig(name="iid"))]
    assert max(sizes) - min(sizes) <= 1


def test_noise_is_the_iid_split_with_a_per_client_sigma():
    labels = _labels(4, 1000, 10)
    noisy = PartitionConfig(name="noise", clients=4, noise=0.2, seed=5)
    plain = PartitionConfig(name="iid", clients=4, seed=5)
    assert all(np.array_equal(a, b) for a, b in zip(partition(labels, noisy), partition(labels, plain),
                                                      strict=True))
    np.testing.assert_allclose([client_noise(noisy, i) for i in range(4)], [0.0, 0.05, 0.1, 0.15])
    assert client_noise(plain, 3) == 0.0 and client_noise(PartitionConfig(), 0) == 0.0
    with pytest.raises(PartitionError):
        client_noise(noisy, 4)
    variance = PartitionConfig(name="noise", clients=4, noise=0.2, seed=5, noise_scale="variance")
    np.testing.assert_allclose([client_noise(variance, i) for i in range(4)],  # NIID-Bench's text: a variance
                               np.sqrt([0.0, 0.05, 0.1, 0.15]))


def test_natural_groups_ignore_clients_and_enforce_min_size():
    ids = np.array([3, 1, 3, 2, 1, 3, 2, 2])
    labels = np.zeros(8, np.int64)
    parts = partition(labels, PartitionConfig(name="natural", clients=99, min_size=2), natural=ids)
    assert [p.tolist() for p in parts] == [[1, 4], [3, 6, 7], [0, 2, 5]]
    with pytest.raises(PartitionError, match="min_size"):
        partition(labels, PartitionConfig(name="natural", min_size=3), natural=ids)


@pytest.mark.parametrize("make", [
    lambda: PartitionConfig(alpha=0.0),
    lambda: PartitionConfig(alpha=-1.0),
    lambda: PartitionConfig(alpha=float("nan")),
    lambda: PartitionConfig(beta=0.0),
    lambda: PartitionConfig(clients=0),
    lambda: PartitionConfig(min_size=-1),
    lambda: PartitionConfig(name="pathological"),
    lambda: PartitionConfig(beta=float("inf")),
    lambda: PartitionConfig(labels_per_client=2.5),
    lambda: PartitionConfig(labels_per_client=0),
    lambda: PartitionConfig(gamma=1.0),
    lambda: partition(np.zeros(5, np.int64), PartitionConfig(clients=10, min_size=0)),
    lambda: partition(np.zeros(50, np.int64), PartitionConfig(clients=10, min_size=6)),
    lambda: partition(np.zeros(50, np.int64), PartitionConfig(name="natural")),
    lambda: partition(np.zeros(50, np.int64), PartitionConfig(name="natural"), natural=np.zeros(49)),
    lambda: partition(np.zeros(50), PartitionConfig()),
    lambda: partition(np.zeros((5, 10), np.int64), PartitionConfig(clients=2, min_size=0)),
    lambda: partition(np.arange(50) % 3, PartitionConfig(name="shards", labels_per_client=4, min_size=0)),
    lambda: partition(np.arange(50) % 5, PartitionConfig(name="shards", clients=2, labels_per_client=2,
                                                         min_size=0)),
])
def test_bad_requests_raise_one_line_partition_errors(make):
    with pytest.raises(PartitionError) as info:
        make()
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


def test_hopeless_min_size_gives_up_quickly_with_a_hint():
    labels = _labels(5, 2000, 20)
    start = time.perf_counter()
    with pytest.raises(PartitionError, match="larger alpha"):
        partition(labels, PartitionConfig(clients=50, alpha=1e-3, min_size=40))  # 1000 redraws by default
    assert time.perf_counter() - start < 10
    with pytest.raises(PartitionError, match="larger beta"):
        partition(labels, PartitionConfig(name="quantity", clients=100, beta=1e-3, min_size=20,
                                          max_redraws=5))


@pytest.mark.parametrize(("clients", "classes"), [(10, 10), (100, 1000)])
def test_report_files(tmp_path, clients, classes):
    labels = _labels(6, 20 * classes, classes)
    cfg = PartitionConfig(clients=clients, min_size=0)
    parts = partition(labels, cfg)
    write_partition_report(tmp_path / "run", parts, labels, classes, cfg)
    write_partition_report(tmp_path / "run", parts, labels, classes, cfg)  # overwrites in place
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["partition.json", "partition.png"]
    record = json.loads((tmp_path / "run" / "partition.json").read_text())
    counts, sizes = np.asarray(record["summary"]["class_counts"]), record["summary"]["sizes"]
    assert counts.shape == (clients, classes) and counts.sum() == len(labels) == sum(sizes)
    assert record["config"]["name"] == "dirichlet" and record["config"]["alpha"] == 0.3
    assert record["indices_sha256"] == indices_sha256(parts) != indices_sha256(
        partition(labels, PartitionConfig(clients=clients, min_size=0, seed=1)))
    png = (tmp_path / "run" / "partition.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000


@dataclass(frozen=True)
class RoundRobinConfig(PartitionSettings):
    offset: int = setting(0, "clients the deal is rotated by (a toy)", within="[0, inf)", group="partition")


class RoundRobin(Partition):
    """Sample i goes to client (i + offset) mod clients: a partition and its setting, in one class."""

    name = "roundrobin"
    Config = RoundRobinConfig

    def split(self, labels, clients, rng):
        owner = (np.arange(len(labels)) + self.cfg.offset) % clients
        return [np.flatnonzero(owner == c).astype(np.int64) for c in range(clients)]


@dataclass(frozen=True)
class ClashConfig(PartitionSettings):
    alpha: float = setting(1.0, "an alpha with another default than dirichlet's", within="(0, inf)")


class Clash(RoundRobin):
    name = "clash"
    Config = ClashConfig


@pytest.fixture
def registered():
    """Registers toy partitions for one test and always unregisters them."""
    added = []

    def register(cls):
        PARTITIONS.register(cls)
        added.append(cls.name)
    try:
        yield register
    finally:
        for name in added:
            PARTITIONS.unregister(name)


def test_a_partition_is_one_file(registered):
    # Prepare
    registered(RoundRobin)
    labels = np.zeros(10, np.int64)
    # Execute
    cfg = PartitionConfig(name="roundrobin", clients=3, min_size=0, offset=1)
    parts = partition(labels, cfg)
    # Assert
    assert [p.tolist() for p in parts] == [[2, 5, 8], [0, 3, 6, 9], [1, 4, 7]]
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))
    assert setting_fields()["offset"].metadata["within"] == "[0, inf)"
    assert cfg.offset == 1 and cfg.own() == RoundRobinConfig(offset=1) and cfg.to_dict()["offset"] == 1
    assert headlines()["roundrobin"] == "offset" and default_min_size("roundrobin") == 10
    assert PartitionConfig().offset == 0  # every registered setting, its default filled
    with pytest.raises(PartitionError, match="offset"):
        PartitionConfig(offset=-1)  # validated whichever partition is chosen
    assert client_noise(cfg, 2) == 0.0


def test_two_partitions_may_not_give_one_setting_two_defaults(registered):
    registered(Clash)
    with pytest.raises(ValueError, match="alpha"):
        setting_fields()


def test_partition_config_is_a_flat_immutable_record():
    cfg = PartitionConfig(name="shards", clients=4, labels_per_client=np.int64(3), seed=np.uint64(7))
    assert cfg.labels_per_client == 3 and type(cfg.labels_per_client) is int and type(cfg.seed) is int
    assert list(cfg.to_dict())[:2] == ["name", "clients"] and list(cfg.to_dict())[-3:] == [
        "min_size", "max_redraws", "seed"]
    assert set(cfg.settings) == set(setting_fields()) and cfg.own().labels_per_client == 3
    assert cfg == PartitionConfig(**cfg.to_dict()) == copy.deepcopy(cfg) == pickle.loads(pickle.dumps(cfg))
    assert hash(cfg) == hash(PartitionConfig(**cfg.to_dict())) and cfg != PartitionConfig(name="shards")
    assert repr(cfg).startswith("PartitionConfig(name='shards', clients=4, ")
    with pytest.raises(FrozenInstanceError):
        cfg.alpha = 1.0
    with pytest.raises(AttributeError):
        _ = cfg.gamma
