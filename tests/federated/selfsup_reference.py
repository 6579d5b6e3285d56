"""Slow plain references of Orchestra's math and of one Orchestra round, written from the equations of
Lubana et al., ICML 2022 (§4, Algorithm 1) and the schedules of the official code (akhilmathurs/orchestra)
without the implementation's helpers: loops over entries, hand-written SGD, EMA and FedAvg. Tests compare
:mod:`federated.selfsup` against them."""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
import torch.nn.functional as F


def sinkhorn_ref(scores: np.ndarray, sharpness: float, max_iters: int, tol: float,
                 check_every: int = 10) -> np.ndarray:
    """Sinkhorn-Knopp by loops over entries, float64: P = softmax(sharpness * s) per row; alternate
    r_k = (1/K) / sum_n P_nk c_n and c_n = (1/N) / sum_k r_k P_nk; stop when sum_n |c_n / c_new_n - 1| < tol
    at an iteration that is a multiple of ``check_every``; return N c_n P_nk r_k."""
    s = np.asarray(scores, dtype=np.float64)
    n, k = s.shape
    p = np.empty((n, k))
    for i in range(n):
        row = [math.exp(sharpness * (s[i, j] - s[i].max())) for j in range(k)]
        total = sum(row)
        for j in range(k):
            p[i, j] = row[j] / total
    r, c = [1.0 / k] * k, [1.0 / n] * n
    for it in range(max_iters):
        r = [(1.0 / k) / sum(p[i, j] * c[i] for i in range(n)) for j in range(k)]
        c_new = [(1.0 / n) / sum(r[j] * p[i, j] for j in range(k)) for i in range(n)]
        err = sum(abs(c[i] / c_new[i] - 1) for i in range(n)) if it % check_every == 0 else None
        c = c_new
        if err is not None and err < tol:
            break
    return np.array([[n * c[i] * p[i, j] * r[j] for j in range(k)] for i in range(n)])


def local_clustering_ref(z: np.ndarray, k: int, generator: torch.Generator, iters: int,
                         sk_iters: int) -> np.ndarray:
    """Equal-size spherical K-means by loops: k random distinct points start; each iteration assigns every
    point to its largest Sinkhorn-Knopp entry and sets each centroid to the normalised mean of its points
    (an empty cluster: a random point). Draws from ``generator`` in the implementation's order."""
    z = np.asarray(z, dtype=np.float64)
    m = len(z)
    k = min(k, m)
    start = torch.randperm(m, generator=generator)[:k].tolist()
    cents = [z[i].copy() for i in start]
    for _ in range(iters):
        scores = np.array([[float(np.dot(z[i], cents[j])) for j in range(k)] for i in range(m)])
        sk = sinkhorn_ref(scores, 25.0, sk_iters, 1e-2)
        choice = [int(np.argmax(sk[i])) for i in range(m)]
        for j in range(k):
            members = [z[i] for i in range(m) if choice[i] == j]
            if not members:
                members = [z[int(torch.randint(m, (1,), generator=generator))]]
            mean = sum(members) / len(members)
            cents[j] = mean / max(np.linalg.norm(mean), 1e-12)
    return np.stack(cents)


def global_clustering_ref(points: torch.Tensor, centroids: torch.Tensor, temperature: float, steps: int,
                          lr: float, momentum: float = 0.9, weight_decay: float = 1e-4) -> torch.Tensor:
    """The server's clustering with hand-written SGD (v <- mu v + g + wd w; w <- w - lr v, then rows
    normalised), the Sinkhorn target from :func:`sinkhorn_ref`, the gradient from autograd."""
    w = centroids.detach().clone().double()
    x = points.detach().double()
    v = torch.zeros_like(w)
    for _ in range(steps):
        target = torch.from_numpy(sinkhorn_ref((x @ w.T).numpy(), 25.0, 100, 1e-2))
        w.requires_grad_(True)
        unit = x / x.norm(dim=1, keepdim=True)
        probs = torch.softmax(unit @ w.T / temperature, dim=1)
        cos = (target * probs).sum(1) / (target.norm(dim=1) * probs.norm(dim=1))
        (grad,) = torch.autograd.grad(-cos.mean(), w)
        with torch.no_grad():
            v = momentum * v + grad + weight_decay * w
            w = w - lr * v
            w = w / w.norm(dim=1, keepdim=True)
    return w.detach()


def orchestra_round_ref(model, images: list[torch.Tensor], runs: list, cfg, warmup: bool, views_fn,
                        rotations_fn, rotate_fn) -> dict[str, torch.Tensor]:
    """One Orchestra round of every client and the server, from the paper's equations: per step, online
    assignment of view 2, EMA target (theta_t <- m theta_t + (1 - m) theta) then its assignment of view 1,
    L = -mean_i sum_k p_t log p_o + CE(rotation head(view 3), turns), SGD with momentum by hand; local
    clustering of the last ``memory`` target representations; FedAvg of the states by sample counts; the
    server's clustering of all local centroids. ``views_fn``/``rotations_fn``/``rotate_fn`` are the
    augmentations (shared, tested elsewhere), drawn in the same order as the implementation."""
    from federated.selfsup.methods.orchestra import SOLARIZE_P, VIEW, VIEW_PRIME

    states, weights, locals_ = [], [], []
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    for x, run in zip(images, runs, strict=True):
        net = copy.deepcopy(model)
        net.load_state_dict(global_state)
        net.train()
        memory = []
        if warmup:
            saved = {k: v.clone() for k, v in net.named_buffers()}
            with torch.no_grad():
                for batch in run.batches:
                    if sum(len(t) for t in memory) >= cfg.memory:
                        break
                    (x1,) = views_fn(x[batch], (VIEW,), run.aug_gen, run.size)
                    memory.append(F.normalize(net.target_projector(net.target_backbone(x1)), dim=1))
            net.load_state_dict(saved, strict=False)
        else:
            online = [*net.backbone.parameters(), *net.projector.parameters()]
            target = [*net.target_backbone.parameters(), *net.target_projector.parameters()]
            trained = [p for p in net.parameters() if p.requires_grad]
            velocity = [torch.zeros_like(p) for p in trained]
            for batch in run.batches:
                x1, x2, x3 = views_fn(x[batch], (VIEW, VIEW_PRIME, VIEW), run.aug_gen, run.size, SOLARIZE_P)
                turns = rotations_fn(len(batch), run.aug_gen, x3.device)
                x3 = rotate_fn(x3, turns)
                c = net.centroids.detach()
                z2 = F.normalize(net.projector(net.backbone(x2)), dim=1)
                with torch.no_grad():
                    for t, o in zip(target, online, strict=True):
                        t.copy_(cfg.ema * t + (1 - cfg.ema) * o)
                    t1 = F.normalize(net.target_projector(net.target_backbone(x1)), dim=1)
                p_t = torch.softmax(t1 @ c.T / cfg.temperature, dim=1)
                log_p_o = torch.log(torch.softmax(z2 @ c.T / cfg.temperature, dim=1))
                l_cluster = -(p_t * log_p_o).sum(1).mean()
                logits = net.deg_layer(net.projector(net.backbone(x3)))
                l_deg = -torch.log_softmax(logits, 1)[torch.arange(len(turns)), turns].mean()
                grads = torch.autograd.grad(l_cluster + l_deg, trained, allow_unused=True)
                with torch.no_grad():
                    for p, g, v in zip(trained, grads, velocity, strict=True):
                        if g is None:  # torch's SGD skips a parameter without a gradient (weight decay too)
                            continue
                        v.mul_(run.momentum).add_(g + run.weight_decay * p)
                        p.sub_(run.lr * v)
                memory.append(t1)
        bank = torch.cat(memory)[-cfg.memory:] if not warmup else torch.cat(memory)[: cfg.memory]
        centroids = local_clustering_ref(bank.numpy(), cfg.local_clusters, run.gen, 5, 10)
        locals_.append(torch.from_numpy(centroids))
        states.append({k: v.detach().clone() for k, v in net.state_dict().items()})
        weights.append(len(x))
    total = float(sum(weights))
    average = {}
    for key, ref in states[0].items():
        acc = sum(s[key].double() * (w / total) for s, w in zip(states, weights, strict=True))
        average[key] = acc.round().to(ref.dtype) if not ref.is_floating_point() else acc.to(ref.dtype)
    points = torch.cat(locals_).float()
    average["centroids"] = global_clustering_ref(points, average["centroids"], cfg.temperature,
                                                 cfg.server_steps, cfg.server_lr).float()
    return average
