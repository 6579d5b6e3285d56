"""Seconds per federated round in the paper's CIFAR-10 default setting, on synthetic CIFAR-shaped data.

Chen et al., ICLR 2023, §4.2: ResNet20, 10 clients, Dir(0.3), full participation, 5 local epochs, batch
32, FedAvg. The data are random uint8 images of CIFAR-10's shape (50,000 train / 10,000 test, 32 px, 10
classes), so the timing covers exactly the work of a real run (augmentation on the device, local
training, local and global evaluation) without needing the dataset. ``--scale`` shrinks the data (e.g.
0.02 on a CPU). Prints one JSON line.

    python bench/federate_round.py --device cuda --rounds 2
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from federated.datasets import ImageData
from federated.experiment import FederateConfig, RunOptions
from federated.runner import run
from fpsfl.base.device import device_name


def cifar_shaped(scale: float, seed: int = 0) -> ImageData:
    g = torch.Generator().manual_seed(seed)
    n, m = round(50_000 * scale), round(10_000 * scale)
    x = torch.randint(0, 256, (n + m, 32, 32, 3), generator=g, dtype=torch.uint8)
    y = torch.randint(0, 10, (n + m,), generator=g)
    return ImageData(x[:n], y[:n], x[n:], y[n:], x[:0], y[:0], 10, [str(c) for c in range(10)], None, 32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto")
    p.add_argument("--rounds", type=int, default=2, help="rounds to time (the first includes warm-up)")
    p.add_argument("--scale", type=float, default=1.0, help="fraction of CIFAR-10's size (default 1)")
    p.add_argument("--local-epochs", type=int, default=5)
    args = p.parse_args()
    cfg = FederateConfig(dataset="cifar10", rounds=args.rounds, local_epochs=args.local_epochs, lr=0.01,
                         batch_size=32)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        rows = run(cfg, RunOptions(out=Path(tmp) / "run", device=args.device, progress=False),
                   cifar_shaped(args.scale))
        total = time.perf_counter() - start
    per_round = [round(r["seconds"], 2) for r in rows]
    print(json.dumps({"setting": "cifar10-shaped, resnet20, 10 clients, Dir(0.3), E=5, B=32, fedavg",
                      "scale": args.scale, "seconds_per_round": per_round,
                      "steady_seconds_per_round": per_round[-1], "total_seconds": round(total, 1),
                      "device": device_name(args.device)}))


if __name__ == "__main__":
    main()
