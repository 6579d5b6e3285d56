"""Seconds per federated round, the clients trained one after another or as one vectorised model.

``--setting cifar10`` is Chen et al., ICLR 2023, §4.2's default: ResNet20, 10 clients, Dir(0.3), full
participation, 5 local epochs, batch 32, FedAvg, on random uint8 images of CIFAR-10's shape (50,000 train /
10,000 test, 32 px, 10 classes), so the timing covers exactly the work of a real run (augmentation on the
device, local training, local and global evaluation) without needing the dataset; ``--scale`` shrinks the
data (e.g. 0.02 on a CPU). ``--setting digits`` is the demo's: the embedded digits, 10 clients, batch 8,
1 local epoch. ``--client-batch K`` trains K clients at a time (``federate --client-batch``; 1: one after
another). Prints one JSON line.

    python bench/federate_round.py --device cuda --rounds 2 --client-batch 10
    python bench/federate_round.py --setting digits --device cpu --client-batch 1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from collections.abc import Callable
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


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def timed_training(device: torch.device, log: list[tuple[float, int]],
                   before: Callable[[int], None] | None = None):
    """Wrap federate's in-process dispatcher: each round's local training timed (a sync before and after)
    with its image-steps (the clients' samples x local epochs); ``before(round)`` may stop the run."""
    import federated.rounds as rounds

    inner = rounds.train_in_process

    def timed(s, cfg, plan, device_, bar):
        if before is not None:
            before(plan.rnd)
        sync(device)
        t = time.perf_counter()
        out = inner(s, cfg, plan, device_, bar)
        sync(device)
        log.append((time.perf_counter() - t, sum(len(p) for pools in plan.pools for p in pools)))
        return out
    rounds.train_in_process = timed
    try:
        yield
    finally:
        rounds.train_in_process = inner


@contextlib.contextmanager
def vectorised_on_cpu(allow: bool):
    """The dry run's vectorised clients: federate refuses --client-batch K > 1 on a CPU (it cannot equal
    K = 1 there), which is no matter for a timing."""
    import federated.runner as runner

    refuse = runner.check_client_batch
    if allow:
        runner.check_client_batch = lambda cfg, device: None
    try:
        yield
    finally:
        runner.check_client_batch = refuse


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto")
    p.add_argument("--rounds", type=int, default=2, help="rounds to time (the first includes warm-up)")
    p.add_argument("--scale", type=float, default=1.0, help="fraction of CIFAR-10's size (default 1)")
    p.add_argument("--local-epochs", type=int, default=None, help="default: 5 (cifar10), 1 (digits)")
    p.add_argument("--setting", choices=("cifar10", "digits"), default="cifar10")
    p.add_argument("--client-batch", type=int, default=1, help="clients trained together (1: sequential)")
    p.add_argument("--algo", default="fedavg")
    args = p.parse_args()
    if args.setting == "cifar10":
        epochs = args.local_epochs or 5
        cfg = FederateConfig(dataset="cifar10", rounds=args.rounds, local_epochs=epochs, lr=0.01,
                             batch_size=32, client_batch=args.client_batch, algo=args.algo)
        data = cifar_shaped(args.scale)
        what = f"cifar10-shaped, resnet20, 10 clients, Dir(0.3), E={epochs}, B=32"
    else:
        epochs = args.local_epochs or 1
        cfg = FederateConfig(dataset="digits", rounds=args.rounds, local_epochs=epochs,
                             client_batch=args.client_batch, algo=args.algo)
        data, what = None, f"digits, resnet20, 10 clients, Dir(0.3), E={epochs}, B=8"
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        rows = run(cfg, RunOptions(out=Path(tmp) / "run", device=args.device, progress=False), data)
        total = time.perf_counter() - start
    per_round = [round(r["seconds"], 2) for r in rows]
    print(json.dumps({"setting": f"{what}, {args.algo}", "client_batch": args.client_batch,
                      "scale": args.scale if args.setting == "cifar10" else None,
                      "seconds_per_round": per_round, "steady_seconds_per_round": per_round[-1],
                      "total_seconds": round(total, 1), "device": device_name(args.device),
                      "final_test_acc": round(rows[-1]["test_acc"], 4)}))


if __name__ == "__main__":
    main()
