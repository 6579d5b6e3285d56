"""Steady-state GPU throughput in one call of at most 8 minutes (issue 40): ``bash bench/gpu.sh`` runs this.

One JSON line per measurement, each with the device's name, appended as it finishes (a run cut short keeps
what it measured), into ``--out DIR`` (default ``bench/gpu-results/``) as ``<device>-<commit>-<time>.jsonl``.
Each line has ``bench`` and ``status`` (ok | failed | skipped, with the reason). In order, each started only
while the time budget (``--budget``, default 440 s) leaves room for it:

- ``pretrain``: pairs/s of ``pretrain``'s own step loop (:func:`pretrain.train.run_epoch`: augmentation on
  the device, forward, loss, backward, SGD, its finiteness check every 16 steps) on one fixed batch of uint8
  pairs already on the device, so the model's consumption without the renderer (whose feed the H100 run of
  2026-11-25 measured). A warm-up epoch (cuDNN's autotuning, compilation: its seconds are ``warmup_s``), then
  an epoch of 200 steps, timed as ``pretrain`` times an epoch (no profiling syncs). SimSiam, ResNet20 at
  32 px, batch 256, bf16 autocast (the recipes' ``--amp``), eager (``pretrain``'s default, cuDNN benchmark
  off) and ``--compile`` (:func:`pretrain.compiled.compile_step`, inductor; on a GPU the views too,
  :func:`pretrain.compiled.compile_augment`).
- ``federate``: local-training image-steps/s on CIFAR-10-shaped random data (half of CIFAR-10's 50,000 train
  images, 10 clients, Dir(0.3), 1 local epoch, batch 32, ResNet20, FedAvg), one client at a time
  (``--client-batch 1``) and the round's clients vectorised (``--client-batch 10``, what ``auto`` gives on a
  GPU); the second round is timed (the first pays the warm-up), training only (a sync before and after).
- ``table2``: Table 2's FedAvg setting (``recipes/table2_cifar10.sh``: full-size CIFAR-10-shaped data,
  10 clients, Dir(0.3) without balancing, 100 rounds x 5 local epochs, batch 32, lr 0.01, local accuracies
  on, ``--client-batch auto``) for as many rounds as the budget allows while keeping room for the rows after
  it (at least 2 when they fit), extrapolated: first round + 99 x the mean of the later ones.
- ``pretrain`` at 224 px (ResNet18, batch 64, eager and compiled), then MoCo-v2 at 32 px, if time allows.
- ``federate`` one client at a time with ``--compile`` (:func:`federated.local.compile_model`), if time
  allows: the same setting as the eager row, whose first round holds the compilation.

``--dry-run`` runs every measurement on the CPU at tiny sizes (compiled rows with the ``aot_eager`` backend,
vectorised clients allowed on the CPU) in about 20 s, and ``--check FILE`` verifies a file's lines.
``--checks`` runs the GPU checks of issue 26 instead (``bench/gpu_checks.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: gpu_checks, federate_round
from gpu_checks import CHECKS, REPO, Skip, run  # noqa: E402


@dataclass(frozen=True)
class Row:
    """One ``pretrain`` measurement."""

    method: str = "simsiam"
    arch: str = "resnet20"
    width: float = 1.0
    size: int = 32
    batch: int = 256
    amp: bool = True
    compiled: bool = False
    graphed: bool = False  # --cuda-graph: the whole step replayed as one CUDA graph
    need_s: float = 25.0  # seconds it must have left to start

    @property
    def name(self) -> str:
        mode = "compiled" if self.compiled else "eager"
        return f"{self.method}-{self.arch}-{self.size}px-b{self.batch}-{mode}{'-graphed' * self.graphed}"


def _pair(row: Row, compile_need: float) -> tuple[Row, Row]:
    return row, replace(row, compiled=True, need_s=compile_need)


@dataclass(frozen=True)
class Sizes:
    device: str
    first: tuple[Row, ...]  # before federate
    later: tuple[Row, ...]  # after table2, if time allows
    warm_steps: int
    steps: int  # the measured epoch
    heads: dict = field(default_factory=dict)  # method_args by method
    fed: dict = field(default_factory=dict)  # FederateConfig overrides
    fed_scale: float = 0.5
    fed_need_s: float = 60.0  # seconds a federate row must have left to start (2 rounds, ~20 s on an H100)
    t2_scale: float = 1.0
    t2_max_rounds: int = 100
    t2_keep_s: float = 155.0  # left for the later rows while table2 runs beyond its second round
    budget: float = 440.0


# compiled rows need 130 s to start (ResNet20 took 50-70 s to compile with inductor on 2 CPU cores), table2
# keeps the 224 px pair's 25 + 130 s beyond its second round
# graphed rows right after the eager one (their capture takes seconds), the graphed MoCo-v2 row too: the
# default recipe's method
GPU = Sizes("cuda", (Row(), replace(Row(), graphed=True), Row(method="mocov2", graphed=True),
                     replace(Row(), compiled=True, need_s=130)),
            (*_pair(Row(arch="resnet18", size=224, batch=64), 130), *_pair(Row(method="mocov2"), 130),
             Row(arch="resnet18", size=224, batch=64, graphed=True)),
            warm_steps=30, steps=200)
_TINY = Row(width=0.25, size=16, batch=8, need_s=5)
DRY = Sizes("cpu", (_TINY, replace(_TINY, graphed=True), replace(_TINY, method="mocov2", graphed=True),
                    replace(_TINY, compiled=True)),
            (*_pair(replace(_TINY, size=32), 5), *_pair(replace(_TINY, method="mocov2"), 5),
             replace(_TINY, size=32, graphed=True)),
            warm_steps=2, steps=3, heads={"simsiam": {"proj_dim": 32, "pred_dim": 8},
                                          "mocov2": {"hidden_dim": 32, "bank_size": 64}},
            fed={"clients": 2, "width": 0.25}, fed_scale=0.004, fed_need_s=2, t2_scale=0.004, t2_max_rounds=2,
            t2_keep_s=5, budget=120)


def one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")[:500]


class Lines:
    """The JSON-lines file: every record gets the run's common fields and is appended at once."""

    def __init__(self, path: Path, common: dict, budget_s: float, skip: frozenset[str] = frozenset()):
        self.path, self.common, self.start, self.budget = path, common, time.perf_counter(), budget_s
        self.skip = skip  # names measured in an earlier call of the same lease, left out of this one
        path.parent.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.start)

    def write(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({**self.common, **record}) + "\n")
        detail = record.get("reason") or record.get("error") or ""
        print(f"[gpu.sh] {record['bench']} {record.get('name', '')}: {record['status']} {detail}".rstrip(),
              flush=True)

    def measure(self, bench: str, name: str, fn: Callable[[], dict], need_s: float = 0.0) -> dict:
        """``fn()``'s record, or the reason it did not run (budget, Skip) or its error; written either way."""
        t = time.perf_counter()
        if name in self.skip:
            result = {"status": "skipped", "reason": "--skip"}
        elif self.left() < need_s:
            result = {"status": "skipped",
                      "reason": f"time budget: {self.left():.0f} s left, {need_s:.0f} s needed"}
        else:
            try:
                result = {"status": "ok", **fn()}
            except Skip as why:
                result = {"status": "skipped", "reason": str(why)}
            except Exception as exc:  # a failed measurement is a result; the next still run
                result = {"status": "failed", "error": one_line(exc),
                          "where": traceback.format_exc().splitlines()[-3:]}
        record = {"bench": bench, "name": name, **result, "wall_s": round(time.perf_counter() - t, 1)}
        self.write(record)
        return record


class FixedPairs:
    """A ``pretrain`` source of ``steps`` batches, all one batch of uint8 pairs already on the device."""

    def __init__(self, pairs: torch.Tensor, steps: int):
        self.pairs, self.steps = pairs, steps

    def __len__(self) -> int:
        return self.steps

    def batches(self, epoch: int):
        for _ in range(self.steps):
            yield {"images": self.pairs}


def pretrain_rate(row: Row, sizes: Sizes, device: torch.device) -> dict:
    from pretrain.graphed import make_step
    from pretrain.recipe import PretrainConfig, RunOptions
    from pretrain.train import build_method, compile_augment, compile_step, make_optimizer, run_epoch, set_lr

    torch.backends.cudnn.benchmark = False  # pretrain's eager default; compile_step turns it on
    cfg = PretrainConfig(method=row.method, arch=row.arch, width=row.width, size=row.size,
                         batch_size=row.batch, epochs=2, amp=row.amp and device.type == "cuda",
                         method_args=sizes.heads.get(row.method, {}))
    method = build_method(cfg, None, device).to(memory_format=torch.channels_last)
    optimizer, base_lr = make_optimizer(method, cfg)
    model = compile_step(method, device) if row.compiled else method
    applier = compile_augment(device) if row.compiled else None  # the views too, on a GPU (not on a CPU)
    step = make_step(method, model, optimizer, device, cfg.amp, row.graphed, applier)  # dry run: stand-in
    g = torch.Generator().manual_seed(0)
    shape = (2, row.batch, row.size, row.size, 3)
    pairs = torch.randint(0, 256, shape, dtype=torch.uint8, generator=g).to(device)
    opts = RunOptions(device=str(device), progress=False, run_dir=Path("gpu-bench"))  # named in errors only
    t = time.perf_counter()
    for epoch, steps in enumerate((sizes.warm_steps, sizes.steps)):
        if epoch == 1:
            warmup = time.perf_counter() - t
        set_lr(optimizer, base_lr, 0, cfg.epochs)  # one lr: a graph captured in the warm-up is replayed
        record = run_epoch(method, FixedPairs(pairs, steps), optimizer, cfg, epoch, device, opts, model,
                           step=step)  # the step holds the model and the applier
    captures = getattr(step, "captures", None)
    del model, method, optimizer, step
    if device.type == "cuda":
        torch.cuda.empty_cache()
    backend = os.environ.get("FPSFL_TEST_COMPILE_BACKEND", "inductor") if row.compiled else None
    return {**asdict(row), "amp": cfg.amp, "backend": backend, "pairs_per_s": round(record["pairs_per_s"], 1),
            "steps": record["steps"], "epoch_s": round(record["seconds"], 2), "warmup_s": round(warmup, 1),
            "warmup_steps": sizes.warm_steps, "loss": round(record["loss"], 4), "captures": captures,
            "capture": ("cuda" if device.type == "cuda" else "cpu stand-in") if row.graphed else None}


def federate_rate(sizes: Sizes, device: torch.device, k: int, tmp: Path, compiled: bool = False,
                  graphed: bool = False) -> dict:
    from federate_round import cifar_shaped, timed_training, vectorised_on_cpu

    from federated.experiment import FederateConfig, RunOptions
    from federated.runner import run as federate

    cfg = FederateConfig(dataset="cifar10", rounds=2, local_epochs=1, lr=0.01, batch_size=32, client_batch=k,
                         eval_local=False, **sizes.fed)
    log: list[tuple[float, int]] = []
    with timed_training(device, log), vectorised_on_cpu(device.type == "cpu" and k > 1):
        out = tmp / f"fed-k{k}{'-compiled' * compiled}{'-graphed' * graphed}"
        rows = federate(cfg, RunOptions(out=out, device=str(device), progress=False, compile=compiled,
                                        cuda_graph=graphed), cifar_shaped(sizes.fed_scale))
    seconds, images = log[-1]
    return {"client_batch": k, "compiled": compiled, "graphed": graphed, "clients": cfg.clients,
            "scale": sizes.fed_scale,
            "local_epochs": 1, "batch": 32, "image_steps_per_s": round(images / seconds, 1),
            "train_s": round(seconds, 2),
            "images": images, "round_s": [round(r["seconds"], 2) for r in rows],
            "first_round_train_s": round(log[0][0], 2)}


COMPILED_CLIENT = "one client at a time, compiled"
GRAPHED_CLIENTS = "vectorised, --cuda-graph"


class OutOfBudget(Exception):
    pass


def first_round_s(sizes: Sizes, vectorised: dict) -> float:
    """What Table 2's first round needs: 5 local epochs of full-size data at the vectorised rate, and as much
    again for warm-up and the local and global evaluations (10 s when that rate is unknown)."""
    rate = vectorised.get("image_steps_per_s")
    return 2 * 5 * 49_000 * sizes.t2_scale / rate if rate else 10.0


def table2_run(sizes: Sizes, device: torch.device, lines: Lines, tmp: Path) -> dict:
    from federate_round import cifar_shaped, timed_training

    from federated.experiment import FederateConfig, RunOptions
    from federated.runner import run as federate

    cfg = FederateConfig(dataset="cifar10", rounds=100, local_epochs=5, lr=0.01, batch_size=32, alpha=0.3,
                         balance="none", algo="fedavg", **sizes.fed)
    starts: list[float] = []

    def before(rnd: int) -> None:  # from the third round on, go on while the later rows keep their time
        starts.append(time.perf_counter())
        last = starts[-1] - starts[-2] if len(starts) > 1 else 0.0
        need = 1.2 * last + (sizes.t2_keep_s if rnd >= 2 else 0.0)
        if rnd >= sizes.t2_max_rounds or (rnd >= 1 and lines.left() < need):
            raise OutOfBudget

    log: list[tuple[float, int]] = []
    out = tmp / "table2"
    with timed_training(device, log, before):
        try:
            federate(cfg, RunOptions(out=out, device=str(device), progress=False),
                     cifar_shaped(sizes.t2_scale))
        except OutOfBudget:
            pass
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    seconds = [r["seconds"] for r in rows]
    if not seconds:
        raise RuntimeError("no round finished")
    steady = sum(seconds[1:]) / len(seconds[1:]) if len(seconds) > 1 else seconds[0]
    total = seconds[0] + (cfg.rounds - 1) * steady
    return {"setting": f"cifar10-shaped x{sizes.t2_scale}, {cfg.clients} clients, Dir(0.3) unbalanced, "
                       f"100 rounds x 5 local epochs, B=32, lr 0.01, FedAvg, local accuracies on, "
                       f"client-batch auto",
            "rounds_run": len(rows), "round_s": [round(x, 2) for x in seconds],
            "steady_round_s": round(steady, 2),
            "train_s": [round(t, 2) for t, _ in log], "extrapolated_100_rounds_s": round(total, 1),
            "extrapolated_100_rounds_h": round(total / 3600, 2), "test_acc": rows[-1]["test_acc"]}


def environment(sizes: Sizes, budget: float) -> dict:
    commit = run(["git", "rev-parse", "--short", "HEAD"], 10).stdout.strip() or "unknown"
    cuda = torch.cuda.is_available() and sizes.device == "cuda"
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    return {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda, "commit": commit,
            "cores": len(os.sched_getaffinity(0)), "dry_run": sizes.device == "cpu", "budget_s": budget}


def measure_all(sizes: Sizes, out_dir: Path, budget: float, skip: frozenset[str] = frozenset()) -> Path:
    common = environment(sizes, budget)
    slug = re.sub(r"[^a-z0-9]+", "-", common["device"].lower()).strip("-")
    path = out_dir / f"{slug}-{common['commit']}-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    lines = Lines(path, {"device": common["device"], "dry_run": common["dry_run"]}, budget, skip)
    lines.write({"bench": "environment", "status": "ok", **common, "python": sys.version.split()[0]})
    device = torch.device(sizes.device)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for row in sizes.first:
            lines.measure("pretrain", row.name, lambda r=row: pretrain_rate(r, sizes, device), row.need_s)
        rates = {}
        every = sizes.fed.get("clients", 10)
        for k, name, graphed in ((1, "one client at a time", False), (every, "vectorised", False),
                                 (every, GRAPHED_CLIENTS, True)):
            fn = lambda k=k, g=graphed: federate_rate(sizes, device, k, work, graphed=g)  # noqa: E731
            rates[name] = lines.measure("federate", name, fn, sizes.fed_need_s)
        # the Table 2 run uses the vectorised engine: its rate sizes the run's first round
        lines.measure("table2", "fedavg-cifar10", lambda: table2_run(sizes, device, lines, work),
                      first_round_s(sizes, rates["vectorised"]))
        for row in sizes.later:
            lines.measure("pretrain", row.name, lambda r=row: pretrain_rate(r, sizes, device), row.need_s)
        # federate --compile (its first round holds the compilation; the rate is the second round's)
        lines.measure("federate", COMPILED_CLIENT, lambda: federate_rate(sizes, device, 1, work, True),
                      2 * sizes.fed_need_s)
    return path


def check(path: Path, sizes: Sizes) -> list[str]:
    """What is wrong with a results file: unreadable lines, or a measurement missing or not ok."""
    try:
        records = [json.loads(line) for line in path.read_text().splitlines()]
    except (OSError, ValueError) as exc:
        return [one_line(exc)]
    problems = [f"{r['bench']} {r.get('name', '')}: {r['status']} {r.get('error', r.get('reason', ''))}"
                for r in records if r.get("status") != "ok"]
    want = {("pretrain", r.name) for r in (*sizes.first, *sizes.later)} | {("table2", "fedavg-cifar10")}
    want |= {("federate", "one client at a time"), ("federate", "vectorised"), ("federate", COMPILED_CLIENT),
             ("federate", GRAPHED_CLIENTS),
             ("environment", None)}
    found = {(r["bench"], r.get("name")) for r in records}
    problems += [f"missing: {b} {n or ''}" for b, n in sorted(want - found, key=str)]
    if any("device" not in r for r in records):
        problems.append("a line without the device's name")
    return problems


def checks(dry: bool, out_dir: Path, budget: float) -> Path:
    sizes = DRY if dry else GPU
    common = environment(sizes, budget)
    path = out_dir / f"checks-{common['commit']}-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    lines = Lines(path, {"device": common["device"], "dry_run": dry}, budget)
    lines.write({"bench": "environment", "status": "ok", **common})
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in CHECKS.items():
            lines.measure("check", name, lambda fn=fn: fn(dry, Path(tmp)))
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="every measurement on the CPU at tiny sizes")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "gpu-results",
                   help="folder of the .jsonl file (default: bench/gpu-results)")
    p.add_argument("--budget", type=float, default=None, help="seconds after which no measurement starts "
                   "(default: 450 on a GPU, 120 on the dry run)")
    p.add_argument("--checks", action="store_true", help="the GPU checks of issue 26 instead (gpu_checks.py)")
    p.add_argument("--skip", default="", metavar="NAMES",
                   help="comma-separated measurement names to leave out (recorded as skipped), e.g. the rows "
                        "an earlier call of the same lease measured: 'one client at a time,vectorised'")
    p.add_argument("--check", type=Path, metavar="FILE",
                   help="only verify FILE's lines (exit 1 unless every measurement is there and ok)")
    args = p.parse_args()
    sizes = DRY if args.dry_run else GPU
    if args.check:
        problems = check(args.check, sizes)
        print("\n".join(f"[gpu.sh] check: {x}" for x in problems) or f"[gpu.sh] {args.check}: every line ok")
        sys.exit(1 if problems else 0)
    if sizes.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu.sh: no CUDA device; run on a GPU or pass --dry-run")
    if args.dry_run:
        # inductor on 2 cores: about a minute a graph
        os.environ.setdefault("FPSFL_TEST_COMPILE_BACKEND", "aot_eager")
        os.environ.setdefault("FPSFL_TEST_GRAPH_STANDIN", "1")  # --cuda-graph rows: the capture's stand-in
    budget = args.budget or sizes.budget
    path = checks(args.dry_run, args.out, budget) if args.checks else \
        measure_all(sizes, args.out, budget, frozenset(filter(None, args.skip.split(","))))
    print(f"[gpu.sh] wrote {path}")


if __name__ == "__main__":
    main()
