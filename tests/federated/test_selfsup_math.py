"""Orchestra's clustering math (federated/selfsup/clustering.py) against plain loop references
(selfsup_reference.py) and invariants: the equal-size constraint, recovery of separated clusters."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from federated.selfsup.clustering import (
    cluster_loss,
    ema_,
    global_clustering,
    local_clustering,
    sinkhorn_knopp,
)

from .selfsup_reference import global_clustering_ref, local_clustering_ref, sinkhorn_ref


def _unit(n: int, d: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(seed)), dim=1)


def _blobs(sizes: list[int], d: int, spread: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit points around len(sizes) random unit centres, sizes[i] of them around centre i."""
    g = torch.Generator().manual_seed(seed)
    centres = F.normalize(torch.randn(len(sizes), d, generator=g), dim=1)
    points = torch.cat([centres[i] + spread * torch.randn(n, d, generator=g) for i, n in enumerate(sizes)])
    return F.normalize(points, dim=1), centres


@pytest.mark.parametrize("max_iters", [1, 10, 100])
def test_sinkhorn_matches_the_loop_reference(max_iters):
    scores = torch.randn(23, 5, generator=torch.Generator().manual_seed(0)) * 0.3
    got = sinkhorn_knopp(scores.double(), max_iters=max_iters)
    want = sinkhorn_ref(scores.numpy(), 25.0, max_iters, 1e-2)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)


def test_sinkhorn_converges_to_equal_cluster_masses():
    """The equal-size constraint: rows sum to 1, and each of K clusters receives N / K of the mass, even when
    the raw scores send 90% of the points to one cluster."""
    z, _ = _blobs([90, 10], 8, 0.1, seed=1)
    centroids = z[[0, 95]]  # one centroid in each blob
    raw = F.softmax(25 * z @ centroids.T, dim=1).sum(0)
    assert raw[0] > 80  # without balancing, cluster 0 takes most of the mass
    sk = sinkhorn_knopp((z @ centroids.T).double(), max_iters=5000, tol=1e-12)
    np.testing.assert_allclose(sk.sum(1).numpy(), 1.0, atol=1e-6)
    np.testing.assert_allclose(sk.sum(0).numpy(), [50.0, 50.0], atol=1e-3)
    sizes = torch.bincount(sk.argmax(1), minlength=2)
    assert sizes.min() >= 45


def test_local_clustering_matches_the_loop_reference():
    z = _unit(40, 6, seed=2)
    got = local_clustering(z.double(), 5, torch.Generator().manual_seed(3), iters=5, sk_iters=10)
    want = local_clustering_ref(z.numpy(), 5, torch.Generator().manual_seed(3), iters=5, sk_iters=10)
    np.testing.assert_allclose(got.numpy(), want, atol=1e-9)


def test_local_clusters_are_equal_sized_on_imbalanced_data():
    """Four blobs of 40/8/8/8 points: Orchestra's Sinkhorn assignments (10 iterations, as the official code:
    balanced only roughly) split them into four clusters of between 10 and 24 points, none near 40."""
    z, centres = _blobs([40, 8, 8, 8], 16, 0.1, seed=4)
    assert torch.bincount((z @ centres.T).argmax(1)).tolist() == [40, 8, 8, 8]  # the natural clusters
    cents = local_clustering(z, 4, torch.Generator().manual_seed(0))
    sizes = torch.bincount(sinkhorn_knopp(z @ cents.T, max_iters=10).argmax(1), minlength=4)
    assert sizes.sum() == 64 and sizes.min() >= 10 and sizes.max() <= 24, sizes.tolist()


def test_local_clustering_invariants():
    z = _unit(30, 6, seed=5)
    a = local_clustering(z, 4, torch.Generator().manual_seed(1))
    b = local_clustering(z, 4, torch.Generator().manual_seed(1))
    assert torch.equal(a, b)  # the generator fixes it
    np.testing.assert_allclose(a.norm(dim=1).numpy(), 1.0, atol=1e-6)
    assert local_clustering(z[:3], 8, torch.Generator().manual_seed(1)).shape == (3, 6)  # fewer points than k


def test_global_clustering_matches_the_plain_torch_reference():
    points, _ = _blobs([6, 6, 6], 8, 0.2, seed=6)
    start = F.normalize(torch.randn(3, 8, generator=torch.Generator().manual_seed(7)), dim=1)
    got = global_clustering(points.double(), start.double(), 0.1, steps=15, lr=0.01)
    want = global_clustering_ref(points, start, 0.1, steps=15, lr=0.01)
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-8)


def test_global_clustering_separates_clusters_into_equal_sizes():
    """Four blobs of local centroids; the start has two centroids on blob 0 and none on blob 3, so blobs 0 and
    3 share a centroid and one centroid is empty. The server's clustering gives each blob its own."""
    points, centres = _blobs([10, 10, 10, 10], 16, 0.05, seed=8)
    start = F.normalize(centres[[0, 0, 1, 2]] + 0.3 * torch.randn(4, 16, generator=torch.Generator()
                                                                   .manual_seed(9)), dim=1)
    blob = torch.arange(4).repeat_interleave(10)

    def clusters(c):  # the set of points each centroid is the nearest of, as sets of blobs
        near = (points @ c.T).argmax(1)
        return sorted(tuple(sorted(set(blob[near == j].tolist()))) for j in range(4))

    assert clusters(start) == [(), (0, 3), (1,), (2,)]
    got = global_clustering(points, start, 0.1)
    assert clusters(got) == [(0,), (1,), (2,), (3,)]
    np.testing.assert_allclose(got.norm(dim=1).numpy(), 1.0, atol=1e-5)
    shuffled = global_clustering(points[torch.randperm(40, generator=torch.Generator().manual_seed(1))],
                                 start, 0.1)
    np.testing.assert_allclose(shuffled.numpy(), got.numpy(), atol=1e-4)  # the order of clients' points


def test_cluster_loss_is_the_cross_entropy_of_assignments():
    z, t, c = _unit(5, 4, 11).requires_grad_(True), _unit(5, 4, 12).requires_grad_(True), _unit(3, 4, 13)
    loss = cluster_loss(z, t, c, 0.5)
    want = sum(-(torch.softmax(t[i] @ c.T / 0.5, 0) * torch.log(torch.softmax(z[i] @ c.T / 0.5, 0))).sum()
               for i in range(5)) / 5
    torch.testing.assert_close(loss, want)
    loss.backward()
    assert z.grad is not None and z.grad.abs().sum() > 0 and t.grad is None  # the target is held fixed


def test_ema_moves_the_target_towards_the_online_weights():
    target, online = [torch.ones(3), torch.zeros(2)], [torch.zeros(3), torch.ones(2)]
    ema_(target, online, 0.75)
    torch.testing.assert_close(target, [torch.full((3,), 0.75), torch.full((2,), 0.25)])
