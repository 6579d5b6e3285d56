"""The GPU verification of issue 26 in one process: every section's figures into one JSON file.

``bench/gpu.sh`` installs the carried wheels and calls this. Sections, each recorded as it finishes (so a run
cut short still leaves what it measured), each with ``status`` ok | failed | skipped:

- ``environment``: torch, CUDA device, cores, commit; ``install``: which optional packages import.
- ``pytest_gpu``: ``pytest -m gpu`` (passed / failed / skipped counts).
- ``pretrain``: pairs/s at 32 px (ResNet20, batch 256) and 224 px (ResNet18, batch 64), with and without
  ``--amp``, with 0, 4 and 8 workers; each row the second epoch (the first pays cuDNN's autotuning and the
  renderer's start), its ``data_wait`` share, the model's consumption (pairs/s while not waiting for data)
  and the renderer's feed (``fractals bench``'s pairs/s with as many workers, at least 1).
- ``federate``: seconds a round on CIFAR-10-shaped random data (50,000 / 10,000 images, 10 clients,
  Dir(0.3), 1 local epoch, batch 32) at ``--client-batch 1`` and auto, FedAvg and SCAFFOLD.
- ``torchrun``: a 1-process torchrun pre-training on the GPU, and an NCCL all-reduce (a world of one process
  creates no process group in ``pretrain``, so the collective is checked on its own).
- ``flower``: ``federate --engine flower`` with ``num_gpus`` client resources.

``--dry-run`` runs the same steps on the CPU at tiny sizes (gloo instead of NCCL, 0 and 1 workers), for CI.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Sizes:
    """What each section runs; the GPU sizes fit the whole script in 10 minutes on one H100."""

    device: str
    pretrain: tuple[tuple[int, str, float, int, int], ...]  # (px, arch, width, batch, steps an epoch)
    workers: tuple[int, ...]
    feed_pairs: dict[int, int]  # px -> pairs the renderer is timed on, per worker
    fed_scale: float  # fraction of CIFAR-10's size
    fed_clients: int
    fed_rounds: int  # the last is reported (the first includes warm-up)
    flower: tuple[int, int, str]  # (clients, rounds, resources)
    timeout: int  # s per subprocess


GPU = Sizes("cuda", ((32, "resnet20", 1.0, 256, 24), (224, "resnet18", 1.0, 64, 6)), (0, 4, 8),
            {32: 5000, 224: 100}, 1.0, 10, 2, (4, 2, "num_cpus=1,num_gpus=0.25"), 240)
DRY = Sizes("cpu", ((16, "resnet20", 0.25, 8, 1), (32, "resnet20", 0.25, 8, 1)), (0, 1),
            {16: 40, 32: 40}, 0.004, 2, 1, (2, 1, "num_cpus=1,num_gpus=0"), 120)


class Skip(Exception):
    """A section that cannot run here (e.g. Flower not installed); recorded as skipped with the reason."""


def one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")[:500]


class Report:
    """The JSON file, rewritten after every section."""

    def __init__(self, path: Path, budget_s: float):
        self.path, self.data, self.start, self.budget = path, {}, time.perf_counter(), budget_s

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.start)

    def section(self, name: str, fn: Callable[[], dict]) -> None:
        t = time.perf_counter()
        if self.left() <= 0:
            result = {"status": "skipped", "reason": "time budget spent"}
        else:
            try:
                result = {"status": "ok", **fn()}
            except Skip as why:
                result = {"status": "skipped", "reason": str(why)}
            except Exception as exc:  # a failed section is a result; the next sections still run
                result = {"status": "failed", "error": one_line(exc),
                          "where": traceback.format_exc().splitlines()[-3:]}
        result["seconds"] = round(time.perf_counter() - t, 1)
        self.data[name] = result
        self.path.write_text(json.dumps(self.data, indent=1) + "\n")
        print(f"[gpu.sh] {name}: {result['status']} ({result['seconds']} s)", flush=True)


def run(cmd: list[str], timeout: int, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})


def checked(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: {done.stderr.strip()[-400:]}")
    return done


def environment(sizes: Sizes) -> dict:
    commit = run(["git", "rev-parse", "--short", "HEAD"], 10).stdout.strip() or "unknown"
    cuda = torch.cuda.is_available()
    return {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name(0) if cuda else "cpu", "gpus": torch.cuda.device_count(),
            "cores": len(os.sched_getaffinity(0)), "commit": commit, "dry_run": sizes.device == "cpu"}


def installed() -> dict:
    """The versions of the packages the GPU image may lack (None: absent), read without importing them."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("lightly", "segmentation-models-pytorch", "hydra-core", "omegaconf",
                 "antlr4-python3-runtime", "numba", "flwr", "ray"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return {"packages": found}


def pytest_gpu(sizes: Sizes) -> dict:
    # only the files that hold gpu tests: collecting the whole suite costs ~10 s more on 2 cores
    files = sorted(str(f.relative_to(REPO)) for f in (REPO / "tests").rglob("test_*.py")
                   if "mark.gpu" in f.read_text())
    done = run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *files],
               sizes.timeout * 2)
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", done.stdout)}
    failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    if done.returncode not in (0, 5) or failed:  # 5: nothing collected
        raise RuntimeError(f"exit {done.returncode}, {counts}: {'; '.join(failed)[:400]}")
    return {"files": files, "counts": counts, "all_skipped": counts.get("passed", 0) == 0}


def pretrain_rows(sizes: Sizes, tmp: Path) -> dict:
    """pairs/s of every (size, amp, workers), the model's consumption and the renderer's feed."""
    from fractals.ifs import bank_or_sample
    from fractals.throughput import measure
    from pretrain.recipe import PretrainConfig, RunOptions
    from pretrain.train import train

    heads = {"proj_dim": 32, "pred_dim": 8} if sizes.device == "cpu" else {}  # tiny heads on the dry run
    bank, rows, feeds = bank_or_sample(None, 0), [], {}
    for size, arch, width, batch, steps in sizes.pretrain:
        for workers in sizes.workers:
            n = sizes.feed_pairs[size] * max(workers, 1)
            feeds[size, workers] = measure(bank, size, n, max(workers, 1), progress=False)["pairs_per_s"]
            for amp in (False, True):
                cfg = PretrainConfig(arch=arch, width=width, size=size, epochs=2, batch_size=batch,
                                     pairs_per_epoch=batch * steps, amp=amp, method_args=heads)
                name = f"p{size}-w{workers}-{'amp' if amp else 'fp32'}"
                opts = RunOptions(out=tmp / f"{name}.ckpt", device=sizes.device, workers=workers,
                                  progress=False, profile=True, run_dir=tmp / f"{name}.run")
                last = train(cfg, opts)  # epoch 2: the first pays cuDNN's autotuning and the workers' start
                busy = max(1.0 - last["data_wait"], 1e-9)
                rows.append({"size": size, "arch": arch, "batch": batch, "amp": amp, "workers": workers,
                             "pairs_per_s": round(last["pairs_per_s"], 1),
                             "data_wait": round(last["data_wait"], 3),
                             "model_pairs_per_s": round(last["pairs_per_s"] / busy, 1),
                             "renderer_feed_pairs_per_s": round(feeds[size, workers], 1),
                             "bound_by": "renderer" if last["data_wait"] > 0.1 else "model"})
    return {"rows": rows, "note": "pairs_per_s of epoch 2; model_pairs_per_s = pairs_per_s / "
                                  "(1 - data_wait); renderer feed: fractals bench with max(workers, 1) "
                                  "worker processes"}


def federate_rows(sizes: Sizes, tmp: Path) -> dict:
    """Seconds a round at --client-batch 1 and auto, FedAvg and SCAFFOLD, on CIFAR-10-shaped data."""
    from federate_round import cifar_shaped  # bench/, beside this file

    from federated.experiment import FederateConfig, RunOptions
    from federated.runner import run as federate

    data, rows = cifar_shaped(sizes.fed_scale), []
    width = 0.25 if sizes.device == "cpu" else 1.0
    for algo in ("fedavg", "scaffold"):
        for k in (1, None):
            cfg = FederateConfig(dataset="cifar10", clients=sizes.fed_clients, rounds=sizes.fed_rounds,
                                 local_epochs=1, lr=0.01, batch_size=32, client_batch=k, algo=algo,
                                 width=width)
            out = tmp / f"fed-{algo}-{k or 'auto'}"
            records = federate(cfg, RunOptions(out=out, device=sizes.device, progress=False), data)
            rows.append({"algo": algo, "client_batch": k or "auto",
                         "seconds_per_round": [round(r["seconds"], 2) for r in records],
                         "test_acc": round(records[-1]["test_acc"], 4)})
    return {"rows": rows, "setting": f"cifar10-shaped x{sizes.fed_scale}, resnet20 x{width}, "
                                     f"{sizes.fed_clients} clients, Dir(0.3), E=1, B=32; auto = every "
                                     f"client of the round on a GPU, 1 on a CPU"}


def torchrun_check(sizes: Sizes, tmp: Path) -> dict:
    """A 1-process torchrun pre-training, then one all-reduce in the backend a multi-GPU run would use."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    _, arch, width, batch, steps = sizes.pretrain[0]
    done = checked(run([*torchrun, "-m", "pretrain.cli", "fps", "--device", sizes.device, "--arch", arch,
                        "--width", str(width), "--size", "32", "--epochs", "1", "--batch-size", str(batch),
                        "--pairs-per-epoch", str(batch * steps), "--workers", "0", "--profile", "--quiet",
                        "--out", str(tmp / "torchrun.ckpt")], sizes.timeout))
    profile = json.loads(done.stdout.splitlines()[0])["profile"]
    backend = "nccl" if sizes.device == "cuda" else "gloo"
    reduced = checked(run([*torchrun, str(Path(__file__).resolve()), "--collective", backend], sizes.timeout))
    return {"pretrain_pairs_per_s": round(profile["pairs_per_s"], 1),
            "collective": json.loads(reduced.stdout.splitlines()[-1])}


def collective(backend: str) -> None:
    """Under torchrun: one all-reduce and one object broadcast; prints the result as JSON."""
    import torch.distributed as dist

    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    x = torch.ones(4, device=device)
    dist.all_reduce(x)
    box = [{"hello": dist.get_rank()}]
    dist.broadcast_object_list(box, src=0)
    ok = bool((x == dist.get_world_size()).all()) and box[0] == {"hello": 0}
    dist.destroy_process_group()
    print(json.dumps({"backend": backend, "world": int(os.environ["WORLD_SIZE"]), "ok": ok}))


def flower_check(sizes: Sizes, tmp: Path) -> dict:
    """``federate --engine flower`` with the clients' resources (Ray), on digits."""
    if run([sys.executable, "-c", "import flwr, ray"], 60).returncode:
        raise Skip("flwr[simulation] is not installed (carry its wheels, or pip install -e '.[flower]')")
    clients, rounds, resources = sizes.flower
    out = tmp / "flower"
    checked(run([sys.executable, "-m", "federated.cli", "--engine", "flower", "--dataset", "digits",
                 "--clients", str(clients), "--rounds", str(rounds), "--local-epochs", "1", "--no-eval-local",
                 "--device", sizes.device, "--flower-resources", resources, "--quiet", "--out", str(out)],
                sizes.timeout))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"resources": resources, "seconds_per_round": [round(r["seconds"], 2) for r in records],
            "test_acc": records[-1]["test_acc"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="the same steps on the CPU at tiny sizes")
    p.add_argument("--out", type=Path, default=Path("gpu.json"), help="the JSON file (default: gpu.json)")
    p.add_argument("--budget", type=float, default=None, help="seconds after which the remaining sections "
                   "are skipped (default: 540)")
    p.add_argument("--only", default="", help="comma-separated sections to run (default: all); e.g. "
                   "federate,flower to re-measure two after a fix, beside environment and install")
    p.add_argument("--collective", choices=("nccl", "gloo"), help=argparse.SUPPRESS)  # torchrun's worker
    args = p.parse_args()
    if args.collective:
        return collective(args.collective)
    sizes = DRY if args.dry_run else GPU
    if sizes.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu.sh: no CUDA device; run on a GPU or pass --dry-run")
    report = Report(args.out, args.budget or 540)  # the dry run took 340 s under load: same budget
    only = {s for s in args.only.split(",") if s}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sections = {"environment": lambda: environment(sizes), "install": installed,
                    "pytest_gpu": lambda: pytest_gpu(sizes), "pretrain": lambda: pretrain_rows(sizes, work),
                    "federate": lambda: federate_rows(sizes, work),
                    "torchrun": lambda: torchrun_check(sizes, work),
                    "flower": lambda: flower_check(sizes, work)}
        unknown = only - set(sections)
        if unknown:
            sys.exit(f"gpu.sh: unknown section(s) {', '.join(sorted(unknown))}; "
                     f"choose from {', '.join(sections)}")
        for name, fn in sections.items():
            if not only or name in only or name in ("environment", "install"):
                report.section(name, fn)
    print(f"[gpu.sh] wrote {args.out}")


if __name__ == "__main__":
    main()
