"""Throughput of the FPS pair stream: the renderer figures of docs/performance.md.

What is timed is exactly what pre-training consumes: batches from :class:`FractalStream` (code sampling,
rendering, colouring, placement, blur, uint8 conversion and, with ``augs``, the image-level augmentations on
CPU), after one warm-up batch so that JIT compilation is excluded. One worker means one core: numba and torch
are both held to one thread. ``ns_per_point`` is the wall time divided by the chaos-game points drawn
(points per instance x chaos games), so it includes every other step too.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numba
import torch
from threadpoolctl import threadpool_limits
from torch.utils.data import DataLoader
from tqdm import tqdm

from fpsfl.base.images import AugmentConfig

from .ifs import CodeBank
from .scenes import RenderConfig
from .stream import FractalStream, StreamConfig


def default_batch(size: int) -> int:
    """Pairs per batch: 256 at 32 px (the paper's batch), 32 at larger sizes to bound worker memory."""
    return 256 if size <= 32 else 32


def measure(bank: CodeBank, size: int, pairs: int, workers: int = 1, augs: bool = False,
            seed: int = 0, progress: bool = False, look: str = "paper", instances: str = "shared") -> dict:
    """Time ``pairs`` FPS pairs at ``size`` px; returns the JSON record of ``fractals bench``."""
    render = RenderConfig.preset(size, look=look, instances=instances)
    cfg = StreamConfig(kind="fps", batch_size=min(default_batch(size), pairs), pairs_per_epoch=pairs,
                       seed=seed)
    stream = FractalStream(bank, render, cfg, AugmentConfig() if augs else None)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    blas = threadpool_limits(1)  # numpy's BLAS pool must not spin on the second core either
    try:
        warm = FractalStream(bank, render, replace(cfg, pairs_per_epoch=min(8, pairs), seed=seed + 1),
                             stream.augment_cfg)
        next(iter(warm))  # compile (or load the cached) kernels before the clock starts
        if workers > 1:
            batches = DataLoader(stream, batch_size=None, num_workers=workers, prefetch_factor=4)
        else:
            batches = stream
        done = codes = 0
        bar = tqdm(total=pairs, unit="pair", disable=not progress, leave=False)
        start = time.perf_counter()
        for batch in batches:
            n = batch["codes"].shape[0]
            done += n
            codes += int((batch["codes"] >= 0).sum())
            bar.update(n)
        seconds = time.perf_counter() - start
        bar.close()
    finally:
        torch.set_num_threads(threads)
        blas.restore_original_limits()
    # chaos games per code: one shared by both views, else one per view (a shared instance rendered at each
    # view's size, render_full off, replays its points per view)
    games = 1 if instances == "shared" and render.render_full else 2
    points = codes * games * render.points_per_instance
    return {
        "size": size,
        "augs": augs,
        "workers": workers,
        "pairs": done,
        "seconds": round(seconds, 4),
        "pairs_per_s": round(done / seconds, 1),
        "ns_per_point": round(seconds * 1e9 / points, 3),
    }
