"""Multi-process pre-training: DistributedDataParallel started by ``torchrun``, one process per GPU or CPU.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE; without them (a plain ``pretrain`` run) the
world size is 1, no process group exists and every helper here is a no-op, so single-process runs are
unchanged. The group runs NCCL on CUDA (rank r on cuda:LOCAL_RANK) and gloo on CPU.

What the rest of ``pretrain`` needs, and nothing more: the rank and world (:class:`Dist`), an all-reduce
mean (the logged loss), rank 0's outcome broadcast to every rank (run-directory set-up, the ``--resume``
state), the DDP wrapper, and a SyncBatchNorm that also runs on CPU for SimSiam (Chen & He 2021, §4.1 and
Appendix A: BN statistics over the whole batch of all devices); torch's own SyncBatchNorm runs on GPUs only.
MoCo-v2's key gathering and shuffled BN use lightly's ports of the MoCo reference (:mod:`.methods.mocov2`).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parallel import DistributedDataParallel

from fpsfl.base.device import resolve_device

T = TypeVar("T")


@dataclass(frozen=True)
class Dist:
    """Where this process stands in the run: torchrun's environment, or (0, 1, 0, 1) without torchrun."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1

    @property
    def main(self) -> bool:
        """Rank 0: the only process that writes the run directory and the checkpoint, and prints."""
        return self.rank == 0


def from_env() -> Dist:
    """The process's place from torchrun's variables (read without starting anything)."""
    env = os.environ
    try:
        return Dist(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0)),
                    int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", 1))))
    except ValueError:
        raise ValueError("RANK, WORLD_SIZE, LOCAL_RANK must be integers (start with torchrun)") from None


def under_torchrun() -> bool:
    """Whether torchrun started this process (or restarted it): ``--resume`` then defaults to auto."""
    return "TORCHELASTIC_RESTART_COUNT" in os.environ or "WORLD_SIZE" in os.environ


def device_for(flag: str, d: Dist) -> torch.device:
    """The device of ``--device`` for this process: under torchrun with CUDA, cuda:LOCAL_RANK."""
    device = resolve_device(flag)
    if d.world == 1:
        return device
    if device.type == "cuda":
        if flag not in ("auto", "cuda"):
            raise ValueError(f"--device {flag} names one GPU; under torchrun pass --device cuda (or auto): "
                             f"each process takes cuda:LOCAL_RANK")
        have = torch.cuda.device_count()
        if have < d.local_world:
            raise ValueError(f"--device cuda: {d.local_world} processes on this node but {have} CUDA "
                             f"device(s); start at most {have} with --nproc-per-node")
        return torch.device("cuda", d.local_rank)
    if device.type != "cpu":
        raise ValueError(f"--device {flag}: multi-process runs use cuda (NCCL) or cpu (gloo)")
    return device


def init(d: Dist, device: torch.device, timeout_min: float = 30.0) -> None:
    """Join the process group (NCCL on CUDA, gloo on CPU); nothing with one process.

    ``timeout_min``: how long a collective waits for a rank that died before the others fail (torch's NCCL
    default is 10 min, its gloo default 30). The group's keys are prefixed with torchrun's restart count:
    torch 2.14's agent keeps one store for all restarts, so a restarted rank would otherwise read the dead
    ranks' gloo addresses and fail to connect (or hang), as 2 of 3 restarts did in the elastic test."""
    if d.world == 1 or dist.is_initialized():
        return
    timeout = timedelta(minutes=timeout_min)
    store, _, _ = next(dist.rendezvous("env://", d.rank, d.world, timeout=timeout))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"fpsfl/attempt_{attempt}", store)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", store=store, rank=d.rank, world_size=d.world, timeout=timeout,
                                device_id=device)
    else:
        dist.init_process_group("gloo", store=store, rank=d.rank, world_size=d.world, timeout=timeout)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


@torch.no_grad()
def mean(x: Tensor) -> Tensor:
    """The mean over processes of x (a copy): with equal shares, a mean of per-process means is the mean."""
    if world_size() == 1:
        return x
    x = x.detach().clone()
    dist.all_reduce(x)
    return x / world_size()


def from_main(d: Dist, fn: Callable[[], T]) -> T:
    """fn() run on rank 0, its result given to every rank. If it raises, rank 0 re-raises and the others exit
    quietly (SystemExit 2), so the one-line error is printed once and no process waits for a peer."""
    if d.world == 1:
        return fn()
    result, error = None, None
    if d.main:
        try:
            result = fn()
        except Exception as exc:  # re-raised below, once every rank knows
            error = exc
    box = [(result, error is not None)]
    dist.broadcast_object_list(box, src=0)
    if error is not None:
        raise error
    result, failed = box[0]
    if failed:
        raise SystemExit(2)
    return result


def gather(d: Dist, obj: T) -> list[T]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank."""
    if d.world == 1:
        return [obj]
    out: list = [None] * d.world
    dist.all_gather_object(out, obj)
    return out


def fail(d: Dist, error: Exception, code: int) -> BaseException:
    """The exception to raise for an error every rank found at once (e.g. a non-finite all-reduced loss):
    rank 0 reports it, the others exit quietly with ``code``."""
    return error if d.main else SystemExit(code)


class _SumOverProcesses(torch.autograd.Function):
    """The sum of x over processes; the gradient of each process's input is the sum of the gradients."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class CpuSyncBatchNorm(_BatchNorm):
    """SyncBatchNorm for CPU processes (gloo): the per-channel sums of all processes are all-reduced with a
    differentiable all-reduce, so the forward pass and the gradients equal BatchNorm over the global batch
    (two passes, mean then centred squares, as BatchNorm's own). In eval mode, or alone, it is BatchNorm.
    Not a torch SyncBatchNorm subclass: DDP refuses those on CPU."""

    def _check_input_dim(self, x: Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {x.dim()}D input)")

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or world_size() == 1:
            return super().forward(x)
        self._check_input_dim(x)
        dims, shape = [0, *range(2, x.dim())], [1, -1] + [1] * (x.dim() - 2)
        count = x.numel() // x.shape[1] * world_size()
        mu = _SumOverProcesses.apply(x.sum(dims)) / count
        centred = x - mu.view(shape)
        var = _SumOverProcesses.apply(centred.square().sum(dims)) / count
        if self.track_running_stats:
            self._update_running(mu.detach(), var.detach() * count / max(count - 1, 1))
        y = centred * torch.rsqrt(var + self.eps).view(shape)
        return y * self.weight.view(shape) + self.bias.view(shape) if self.affine else y

    @torch.no_grad()
    def _update_running(self, mu: Tensor, unbiased_var: Tensor) -> None:
        self.num_batches_tracked.add_(1)
        factor = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
        self.running_mean.lerp_(mu, factor)
        self.running_var.lerp_(unbiased_var, factor)


def sync_batchnorm(module: nn.Module, device: torch.device) -> nn.Module:
    """Every BatchNorm of ``module`` synchronised over the processes: torch's SyncBatchNorm on CUDA,
    :class:`CpuSyncBatchNorm` on CPU. The state_dict keys do not change, so checkpoints and states load as
    those of plain BatchNorm."""
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    for m in module.modules():
        if isinstance(m, _BatchNorm):
            m.__class__ = CpuSyncBatchNorm  # the same attributes and state; only forward changes
    return module


def wrap(module: nn.Module, device: torch.device) -> nn.Module:
    """``module`` in DistributedDataParallel (alone: itself). Buffers are not broadcast at every forward:
    SyncBatchNorm's running statistics agree anyway, and MoCo's 65,536-key bank is kept equal by gathering;
    MoCo's per-process BN statistics stay per process, and rank 0's are saved."""
    if world_size() == 1:
        return module
    no_sync = ({"forward_sync_buffers": False}  # torch >= 2.12 names it so (broadcast_buffers: deprecated)
               if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
               else {"broadcast_buffers": False})
    return DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None,
                                   **no_sync)
