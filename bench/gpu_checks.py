"""The GPU checks of issue 26, apart from the measurements: ``bash bench/gpu.sh --checks`` runs them.

- ``pytest_gpu``: ``pytest -m gpu`` (passed / failed / skipped counts).
- ``torchrun``: a 1-process torchrun pre-training on the GPU, and an NCCL all-reduce (a world of one process
  creates no process group in ``pretrain``, so the collective is checked on its own).
- ``flower``: ``federate --engine flower`` with ``num_gpus`` client resources (skipped without Ray).

Passed once on one H100 (2026-11-25, ``bench/gpu-results/h100-852bd01.json``; Flower skipped). With
``--dry-run`` the same steps run on the CPU at tiny sizes (gloo instead of NCCL).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


class Skip(Exception):
    """A measurement or check that cannot run here (e.g. Flower not installed), recorded as skipped."""


def run(cmd: list[str], timeout: float, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})


def checked(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: {done.stderr.strip()[-400:]}")
    return done


def pytest_gpu(dry: bool, tmp: Path) -> dict:
    # only the files that hold gpu tests: collecting the whole suite costs ~10 s more on 2 cores
    files = sorted(str(f.relative_to(REPO)) for f in (REPO / "tests").rglob("test_*.py")
                   if "mark.gpu" in f.read_text())
    done = run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *files], 480)
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", done.stdout)}
    failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    if done.returncode not in (0, 5) or failed:  # 5: nothing collected
        raise RuntimeError(f"exit {done.returncode}, {counts}: {'; '.join(failed)[:400]}")
    return {"files": files, "counts": counts, "all_skipped": counts.get("passed", 0) == 0}


def torchrun_check(dry: bool, tmp: Path) -> dict:
    """A 1-process torchrun pre-training, then one all-reduce in the backend a multi-GPU run would use."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    device, width, batch, steps = ("cpu", "0.25", 8, 1) if dry else ("cuda", "1.0", 256, 24)
    done = checked(run([*torchrun, "-m", "pretrain.cli", "fps", "--device", device, "--arch", "resnet20",
                        "--width", width, "--size", "32", "--epochs", "1", "--batch-size", str(batch),
                        "--pairs-per-epoch", str(batch * steps), "--workers", "0", "--profile", "--quiet",
                        "--out", str(tmp / "torchrun.ckpt")], 240))
    profile = json.loads(done.stdout.splitlines()[0])["profile"]
    backend = "gloo" if dry else "nccl"
    reduced = checked(run([*torchrun, str(Path(__file__).resolve()), "--collective", backend], 240))
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


def flower_check(dry: bool, tmp: Path) -> dict:
    """``federate --engine flower`` with the clients' resources (Ray), on digits."""
    if run([sys.executable, "-c", "import flwr, ray"], 60).returncode:
        raise Skip("flwr[simulation] is not installed (carry its wheels, or pip install -e '.[flower]')")
    clients, rounds, gpus = (2, 1, 0) if dry else (4, 2, 0.25)
    resources = f"num_cpus=1,num_gpus={gpus}"
    out = tmp / "flower"
    checked(run([sys.executable, "-m", "federated.cli", "--engine", "flower", "--dataset", "digits",
                 "--clients", str(clients), "--rounds", str(rounds), "--local-epochs", "1", "--no-eval-local",
                 "--device", "cpu" if dry else "cuda", "--flower-resources", resources, "--quiet",
                 "--out", str(out)], 240))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"resources": resources, "seconds_per_round": [round(r["seconds"], 2) for r in records],
            "test_acc": records[-1]["test_acc"]}


CHECKS = {"pytest_gpu": pytest_gpu, "torchrun": torchrun_check, "flower": flower_check}

if __name__ == "__main__" and sys.argv[1:2] == ["--collective"]:  # torchrun's worker
    collective(sys.argv[2])
