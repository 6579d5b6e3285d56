"""The official FPS generator (andytu28/FPS_Pre-training) beside ``fractals bench`` and ``fractals stats``.

    python bench/official_fractals.py CHECKOUT [--pairs N] [--stats]

CHECKOUT is a checkout of the official repository (its code only; the code bank it ships is replaced by
fpsfl's 100K-code bank from --seed, written in its pickle format). It needs opencv (``cv2``) importable,
e.g. ``pip install --target DIR opencv-python-headless`` and PYTHONPATH=DIR; fpsfl does not depend on it.
The generator is configured as ``main_simsiam.py`` configures it at 32 px with the ResNet20 script's
arguments (cache of 32 renders per class over at most 1,024 classes, 1,000 points, 2 objects, random colour,
two views, no background), driven through its own dataset class without image-level augmentation, on one
thread. After ``--warmup`` pairs (the cache fills), it times ``--pairs`` pairs and prints one JSON line in
the shape of ``fractals bench --json`` and, with ``--stats``, the statistics of :mod:`fractals.stats`.
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _systems(seed: int, own: bool) -> list[dict]:
    """100K codes as the official param file's list of {'system': (K, 2, 3)}: fpsfl's bank from ``seed`` or,
    with ``own``, the official sampler's (its ifs.sample_system, K in 2..4 as its ifs.py defaults)."""
    from fractals.ifs import PAPER_BANK, sample_codes

    if own:
        from fractal_datamodule.datasets.fractals import ifs

        rng = np.random.default_rng(seed)
        return [{"system": ifs.sample_system((2, 5), bval=1, rng=rng)} for _ in range(PAPER_BANK)]

    bank = sample_codes(PAPER_BANK, seed)
    out = []
    for maps, k in zip(bank.maps, bank.n_maps, strict=True):
        m = maps[:k]  # (K, 6): a11, a12, a21, a22, b1, b2
        out.append({"system": np.stack([np.stack([m[:, 0], m[:, 1], m[:, 4]], 1),
                                        np.stack([m[:, 2], m[:, 3], m[:, 5]], 1)], 1)})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkout", type=Path, help="a checkout of andytu28/FPS_Pre-training")
    p.add_argument("--pairs", type=int, default=5000, help="pairs timed (default 5000)")
    p.add_argument("--warmup", type=int, default=3000, help="pairs drawn before timing (default 3000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the code bank and of the generator")
    p.add_argument("--stats", action="store_true", help="also the view statistics of the timed pairs")
    p.add_argument("--own-bank", action="store_true",
                   help="codes from the official sampler instead of fpsfl's bank (same seed)")
    args = p.parse_args()
    if not (args.checkout / "fractal_datamodule" / "datasets" / "selfsup_fractaldata.py").is_file():
        print(f"official_fractals: {args.checkout} is not a checkout of andytu28/FPS_Pre-training",
              file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(args.checkout))
    from fractal_datamodule.datasets import selfsup_fractaldata as official
    from fractal_datamodule.datasets.selfsup_fractaldata import SelfSupGenerator, SelfSupMultiFractalDataset

    # It calls random.sample on sets, which Python 3.11 refuses; 3.10 and earlier took tuple(set) silently
    official.random = argparse.Namespace(sample=lambda pop, k: random.sample(tuple(pop), k))

    random.seed(args.seed)
    np.random.seed(args.seed)  # noqa: NPY002 (the official draws from the legacy global state)
    n_class = 100_000
    generator = SelfSupGenerator(size=32, cache_size_per_class=32, max_num_cached_class=1024, niter=1000,
                                 num_class=n_class, num_objects=(2, 2), color_mode="random", num_augs=2,
                                 background=False)
    generator.rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        param_file = Path(tmp) / "ifs-100k.pkl"
        param_file.write_bytes(pickle.dumps({"params": _systems(args.seed, args.own_bank)}))
        dataset = SelfSupMultiFractalDataset(str(param_file), num_systems=n_class, num_class=n_class,
                                             per_class=1, generator=generator, period=2, num_augs=2)
    rng = np.random.default_rng(args.seed + 1)
    for idx in rng.integers(0, n_class, args.warmup):  # the DataLoader shuffles: random indices
        dataset[int(idx)]
    views = []
    start = time.perf_counter()
    for idx in rng.integers(0, n_class, args.pairs):
        a, b, _ = dataset[int(idx)]
        if args.stats:
            views += [a, b]
    seconds = time.perf_counter() - start
    record = {"generator": "official", "bank": "official" if args.own_bank else "fpsfl", "size": 32,
              "pairs": args.pairs, "seconds": round(seconds, 4),
              "pairs_per_s": round(args.pairs / seconds, 1)}
    if args.stats:
        from fractals.stats import view_stats

        uint8 = torch.stack(views).mul(255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
        record.update(view_stats(uint8))
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
