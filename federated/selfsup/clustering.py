"""Orchestra's clustering math as pure functions on tensors (Lubana et al., ICML 2022, §4 and Algorithm 1).

Orchestra (the federated self-supervised method Chen et al., ICLR 2023 use for self-pre-training, §5 and
App. B.3) clusters twice each round. Each client clusters its last target representations into equal-size
local clusters (:func:`local_clustering`: spherical K-means whose assignments come from Sinkhorn-Knopp, so
no cluster is empty or holds most points); the server clusters all clients' local centroids into the global
centroids (:func:`global_clustering`: Sinkhorn-regularised soft K-means fitted by SGD, Genevay et al. 2019),
which every client's loss (:func:`cluster_loss`) then reads. :func:`sinkhorn_knopp` is the balancing both
share. The schedules (iterations, tolerances, the SGD of the server) are those of the official code
(akhilmathurs/orchestra, ``models.py``: ``sknopp``, ``local_clustering``, ``global_clustering``).

Every function takes and returns tensors, draws randomness only from the generator it is given, and does no
I/O; tests compare them with plain loop references and check the equal-size constraint.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

SK_SHARPNESS = 25.0  # lambda of the entropic transport: scores are multiplied by it (official sknopp)
SK_TOLERANCE = 1e-2  # stop when sum |c / c_new - 1| falls below it, checked every 10 iterations (official)
SK_CHECK_EVERY = 10  # iterations between convergence checks (official)


@torch.no_grad()
def sinkhorn_knopp(scores: Tensor, sharpness: float = SK_SHARPNESS, max_iters: int = 100,
                   tol: float = SK_TOLERANCE) -> Tensor:
    """Balanced soft assignments of N samples to K clusters from their scores (N, K) (e.g. cosine
    similarities to the centroids): the transport plan closest to softmax(sharpness * scores) whose every
    cluster receives N / K of the mass (Cuturi 2013; Asano et al. 2020). Returns (N, K) with rows summing
    to 1 and, once converged, columns summing to N / K.

    As the official ``sknopp``: start from the row-wise softmax, alternate the cluster scaling r and the
    sample scaling c, test convergence on c every :data:`SK_CHECK_EVERY` iterations (so with
    ``max_iters=10`` only after the first), and return diag(c) P diag(r) N.
    """
    n, k = scores.shape
    probs = F.softmax(scores * sharpness, dim=1).T  # (K, N)
    r = probs.new_full((k, 1), 1.0 / k)
    c = probs.new_full((n, 1), 1.0 / n)
    for it in range(max_iters):
        r = (1.0 / k) / (probs @ c)  # (K, 1): every cluster gets 1 / K of the mass
        c_new = (1.0 / n) / (r.T @ probs).T  # (N, 1): every sample gives 1 / N
        err = torch.nansum(torch.abs(c / c_new - 1)) if it % SK_CHECK_EVERY == 0 else None
        c = c_new
        if err is not None and err < tol:
            break
    return (probs * c.T).T * r.T * n  # (N, K)


@torch.no_grad()
def local_clustering(z: Tensor, k: int, generator: torch.Generator, iters: int = 5,
                     sk_iters: int = 10) -> Tensor:
    """Equal-size spherical K-means of a client's representations z (M, D) (unit rows) into k clusters;
    returns the centroids (min(k, M), D), unit rows.

    As the official ``local_clustering``: k distinct points drawn at random start the centroids; each of
    ``iters`` iterations assigns every point to the cluster of its largest Sinkhorn-Knopp assignment
    (``sk_iters`` iterations, which keeps the clusters near equal size) and moves each centroid to the
    normalised mean of its points; a cluster left empty restarts at a random point. A client with fewer than
    k representations (official: always at least k) returns one centroid per point.
    """
    m = z.shape[0]
    k = min(k, m)
    centroids = z[torch.randperm(m, generator=generator, device=generator.device)[:k].to(z.device)].clone()
    for _ in range(iters):
        choice = sinkhorn_knopp(z @ centroids.T, max_iters=sk_iters).argmax(dim=1)  # (M,)
        for j in range(k):
            members = z[choice == j]
            if members.shape[0] == 0:
                members = z[torch.randint(m, (1,), generator=generator, device=generator.device).to(z.device)]
            centroids[j] = F.normalize(members.mean(dim=0), dim=0)
    return centroids


def global_clustering(points: Tensor, centroids: Tensor, temperature: float, steps: int = 500,
                      lr: float = 0.01, momentum: float = 0.9, weight_decay: float = 1e-4) -> Tensor:
    """The server's clustering of all clients' local centroids ``points`` (N, D) into the global centroids
    (G, D), starting from ``centroids`` (the previous round's); returns new unit-norm centroids.

    The official ``global_clustering``: ``steps`` SGD steps (fresh momentum each round) on the centroids
    minimising -cos(SK, softmax(normalise(points) C^T / T)) averaged over points, SK the Sinkhorn-Knopp
    assignments of points C^T (held fixed), each step followed by normalising the centroids' rows: a
    soft K-means whose clusters are kept equal in size (Genevay et al. 2019).
    """
    points = points.detach()
    unit = F.normalize(points, dim=1)
    c = centroids.detach().clone().requires_grad_(True)
    optimizer = torch.optim.SGD([c], lr=lr, momentum=momentum, weight_decay=weight_decay)
    with torch.enable_grad():
        for _ in range(steps):
            target = sinkhorn_knopp(points @ c.detach().T)  # (N, G), no gradient
            probs = F.softmax(unit @ c.T / temperature, dim=1)
            loss = -F.cosine_similarity(target, probs, dim=-1).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                c.copy_(F.normalize(c, dim=1))
    return c.detach()


def cluster_loss(z_online: Tensor, z_target: Tensor, centroids: Tensor, temperature: float) -> Tensor:
    """Orchestra's clustering loss: the cross-entropy between the target's assignment of one view and the
    online model's assignment of the other, both softmax(z C^T / T) over the global centroids C (G, D);
    z (B, D) unit rows, the target's held fixed (official ``forward``: L_cluster)."""
    log_p_online = F.log_softmax(z_online @ centroids.T / temperature, dim=1)
    with torch.no_grad():
        p_target = F.softmax(z_target @ centroids.T / temperature, dim=1)
    return -(p_target * log_p_online).sum(dim=1).mean()


@torch.no_grad()
def ema_(target: list[Tensor], online: list[Tensor], decay: float) -> None:
    """target <- decay * target + (1 - decay) * online, in place, tensor by tensor (BYOL's target network;
    Orchestra's official ``update_target``)."""
    torch._foreach_mul_(target, decay)
    torch._foreach_add_(target, online, alpha=1.0 - decay)
