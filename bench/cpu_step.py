"""How close a ResNet20 training step runs to the CPU's FLOP peak, and what changes it (issue 34).

One step of federate's local training (Chen et al., ICLR 2023, Appendix B.1): ResNet20 + linear head at
32 px, cross-entropy, backward, SGD with momentum 0.9 and weight decay 1e-4, on a fixed batch (the data
path is timed elsewhere). The step's FLOPs are counted by torch's own ``FlopCounterMode`` (2 per
multiply-add, convolutions and matmuls of forward and backward); the peak is given (``--peak-gflops``, per
thread) or computed from the clock and the FP32 FLOPs per cycle of one core (``--flops-per-cycle``: 32 for
two 256-bit FMA pipes, as on AVX2 and on Zen 4's double-pumped AVX-512). Variants:

- ``eager``: the model as federate builds it (channels-last, ``federated/setup.py``);
- ``contiguous``: the same in the default (NCHW) memory format;
- ``compile``: ``torch.compile`` (inductor on CPU), which fuses BatchNorm, ReLU and the residual adds;
- ``fused-bn``: eager with each BatchNorm+ReLU pair as one autograd function (``--variants fused-bn``).

``--pretrain simsiam|mocov2`` times a pre-training step instead (issue 40): the two views' augmentation
from uint8 pairs, the method's forward and loss, backward, SGD and the method's after-step (MoCo's momentum
update), as ``pretrain``'s loop runs it, at ``--size`` px (default 32) with the method's default heads;
variants ``eager`` and ``compile`` (``pretrain --compile``: :func:`pretrain.compiled.compile_step`).

Each variant runs ``--steps`` steps twice from the same weights: ``repeatable`` says whether the two runs end
with bit-identical weights (what a variant must keep at a given thread count). Wall time per step and the
process's CPU time per step are both reported: on a shared machine the wall time measures the load, the
CPU time (``of_peak_per_cpu_second``) stays close to the step's own cost. One JSON line per variant.

    OMP_NUM_THREADS=1 python bench/cpu_step.py --batch 8 --threads 1
    python bench/cpu_step.py --pretrain simsiam --batch 64 --threads 2 --variants eager,compile
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
import types
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from federated.tasks.classification import Classifier
from fractals.stream import augment_views
from pretrain.backbones import create_backbone
from pretrain.backbones.cifar_resnet import BasicBlock
from pretrain.recipe import PretrainConfig
from pretrain.train import build_method, compile_step, make_optimizer


def build(memory_format: torch.memory_format, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return Classifier(create_backbone("resnet20"), 10).to(memory_format=memory_format)


def step_fn(model: nn.Module, optimizer: torch.optim.Optimizer):
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()
    return step


def step_flops(batch: int, task: Task | None = None) -> int:
    """FLOPs of one training step (forward + backward) as torch counts them."""
    if task is not None:
        step, data = task.step(copy.deepcopy(task.base), False), task.data
        with FlopCounterMode(display=False) as counter:
            step(*data[0])
        return counter.get_total_flops()
    model = build(torch.channels_last)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), y).backward()
    return counter.get_total_flops()


@dataclass
class Task:
    """A pre-training method's step (``--pretrain``): its initial weights, inputs and step factory."""

    cfg: PretrainConfig
    base: nn.Module
    data: list[tuple[torch.Tensor]]

    def step(self, method: nn.Module, compiled: bool):
        """One pre-training step of ``method`` as ``pretrain``'s loop runs it (without its loss sums)."""
        optimizer, _ = make_optimizer(method, self.cfg)
        model = compile_step(method, torch.device("cpu")) if compiled else method
        gen = torch.Generator().manual_seed(2)

        def step(pairs: torch.Tensor) -> torch.Tensor:
            loss, _ = model(augment_views(pairs, method.n_views, method.augment, gen), None)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            method.after_step()
            return loss.detach()
        return step


def pretrain_task(method: str, batch: int, size: int) -> Task:
    cfg = PretrainConfig(method=method, batch_size=batch, size=size)
    base = build_method(cfg, None, torch.device("cpu")).to(memory_format=torch.channels_last).train()
    g = torch.Generator().manual_seed(1)
    data = [(torch.randint(0, 256, (2, batch, size, size, 3), dtype=torch.uint8, generator=g),)
            for _ in range(4)]
    return Task(cfg, base, data)


class FusedBNReLU(torch.autograd.Function):
    """relu(batch_norm(x)) in training mode with one saved output: the backward recomputes nothing."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
        out = F.relu(F.batch_norm(x, running_mean, running_var, weight, bias, True, momentum, eps))
        ctx.save_for_backward(x, weight, bias, out)
        ctx.eps = eps
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, bias, out = ctx.saved_tensors
        grad = grad * (out > 0)
        dims = (0, 2, 3)
        mean = x.mean(dims, keepdim=True)
        inv = torch.rsqrt(x.var(dims, unbiased=False, keepdim=True) + ctx.eps)
        xhat = (x - mean) * inv
        g_bias, g_weight = grad.sum(dims), (grad * xhat).sum(dims)
        n = x.numel() / x.shape[1]
        w = weight.view(1, -1, 1, 1)
        gx = w * inv / n * (n * grad - g_bias.view(1, -1, 1, 1) - xhat * g_weight.view(1, -1, 1, 1))
        return gx, g_weight, g_bias, None, None, None, None


def fuse_bn_relu(model: nn.Module) -> nn.Module:
    """Every residual block's first BatchNorm + ReLU as one FusedBNReLU call (the ReLU the block applies
    after it is then a no-op on non-negative values, as ``relu(relu(x)) = relu(x)``)."""
    for block in model.modules():
        if isinstance(block, BasicBlock):
            block.forward = types.MethodType(_fused_forward, block)
    return model


def _fused_forward(block: BasicBlock, x: torch.Tensor) -> torch.Tensor:
    bn = block.bn1
    bn.num_batches_tracked += 1
    out = FusedBNReLU.apply(block.conv1(x), bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.momentum,
                            bn.eps)
    out = block.bn2(block.conv2(out))
    return F.relu(out + block.shortcut(x))


def variant_model(name: str) -> nn.Module:
    if name == "contiguous":
        return build(torch.contiguous_format)
    model = build(torch.channels_last)
    return fuse_bn_relu(model) if name == "fused-bn" else model


def time_variant(name: str, batch: int, steps: int, warmup: int, task: Task | None = None) -> dict:
    if task is not None:
        if name not in ("eager", "compile"):
            raise SystemExit(f"--pretrain: variants eager and compile only, got {name}")
        base, data = task.base, task.data
    else:
        base = variant_model(name)
        g = torch.Generator().manual_seed(1)
        data = [(torch.randn(batch, 3, 32, 32, generator=g).contiguous(memory_format=torch.channels_last),
                 torch.randint(0, 10, (batch,), generator=g)) for _ in range(8)]
    finals, seconds = [], []
    for _ in range(2):  # the same steps twice from the same weights: bit-identical?
        model = copy.deepcopy(base)
        if task is not None:
            step = task.step(model, name == "compile")
        else:
            optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9, weight_decay=1e-4)
            step = step_fn(model, optimizer)
            if name == "compile":
                step = torch.compile(step)
        w0, ww = time.process_time(), time.perf_counter()
        for i in range(warmup):
            step(*data[i % len(data)])
        # compile's one-off cost lands here (inductor's compile workers are other processes: wall time)
        warmup_cpu, warmup_wall = time.process_time() - w0, time.perf_counter() - ww
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(steps):
            step(*data[i % len(data)])
        seconds.append(((time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps, warmup_cpu,
                        warmup_wall))
        finals.append({k: v.clone() for k, v in model.state_dict().items()})
    repeatable = all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])
    wall, cpu = min(s[0] for s in seconds), min(s[1] for s in seconds)
    return {"variant": name, "ms_per_step": round(1000 * wall, 2), "cpu_ms_per_step": round(1000 * cpu, 2),
            "first_warmup_cpu_s": round(seconds[0][2], 1), "first_warmup_s": round(seconds[0][3], 1),
            "repeatable": repeatable}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8, help="images a step (8: the digits preset; 32: CIFAR's)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--variants", default="eager,contiguous,compile,fused-bn")
    p.add_argument("--pretrain", choices=("simsiam", "mocov2"), default=None,
                   help="time a pre-training step of this method instead (variants eager, compile)")
    p.add_argument("--size", type=int, default=32, help="px of --pretrain's pairs (default 32)")
    p.add_argument("--ghz", type=float, default=None, help="core clock (default: /proc/cpuinfo's MHz)")
    p.add_argument("--flops-per-cycle", type=int, default=32, help="FP32 FLOPs per cycle of one core")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ghz = args.ghz or _cpuinfo_ghz()
    peak = ghz * args.flops_per_cycle * args.threads  # GFLOP/s
    task = pretrain_task(args.pretrain, args.batch, args.size) if args.pretrain else None
    flops = step_flops(args.batch, task)
    load = os.getloadavg()[0]
    for name in args.variants.split(","):
        record = time_variant(name, args.batch, args.steps, args.warmup, task)
        if task is not None:
            record.update(step=f"pretrain {args.pretrain} resnet20 {args.size} px",
                          pairs_per_s=round(args.batch * 1000 / record["ms_per_step"], 1))
        gflops = flops / record["ms_per_step"] / 1e6
        cpu_gflops = flops / record["cpu_ms_per_step"] / 1e6 * args.threads  # per CPU-second, x threads
        print(json.dumps({**record, "batch": args.batch, "threads": args.threads,
                          "step_gflop": round(flops / 1e9, 3), "gflop_per_s": round(gflops, 1),
                          "peak_gflop_per_s": round(peak, 1), "of_peak": round(gflops / peak, 3),
                          "of_peak_per_cpu_second": round(cpu_gflops / peak, 3),
                          "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                          "load_1min": load, "torch": torch.__version__}), flush=True)


def _cpuinfo_ghz() -> float:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("cpu MHz"):
                return float(line.split(":")[1]) / 1000
    raise SystemExit("no clock in /proc/cpuinfo; pass --ghz")


if __name__ == "__main__":
    main()
