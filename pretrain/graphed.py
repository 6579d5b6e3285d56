"""The training step of ``pretrain`` as one object, eager or (``--cuda-graph``, issue 40) captured whole as a
CUDA graph: the views made from their random draws, forward, loss, backward, SGD, the method's after-step
update (MoCo's momentum encoder and key bank) and the epoch's sums on the device.

Why a graph: ResNet20 at 32 px on an H200 runs its step at about 8,000-9,000 pairs/s eager or compiled
(docs/performance.md), where the step's arithmetic would allow several times that: each of the step's
hundreds of small kernels costs its launch from the host. A graph replays all of them with one launch. It
needs a step that never reads the device from the host (issue 40's sync-free step) and keeps every tensor
it reads or writes at a fixed address: the batch (uint8 renders) and its augmentation draws (made eagerly:
torch.compile and graphs take no explicit generator) are copied into static buffers, the gradients stay where
the capture put them, the sums are updated in place, and the key bank writes at a position held on the
device (:class:`pretrain.methods.mocov2.KeyBank`). The captured SGD (:func:`sgd_update`) reads each
group's learning rate from a device tensor that the step refreshes before a replay, so one graph serves
every rate (the cosine's epochs, every step of a ``warmup_epochs`` warm-up): torch's SGD would read a tensor
rate back to the host, and a number would be baked into the graph. A batch of another shape (an epoch's short
last batch) runs eagerly. Results equal the eager step's up to float
rounding (tests run the same code with a stand-in for the capture on the CPU; the GPU check compares the two
on a device).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from functools import partial

import torch
from torch import Tensor

from fpsfl.base.graphs import (  # noqa: F401 (re-exported)
    Capture,
    PinnedCapture,
    capture_for,
    cuda_capture,
    cuda_side_stream,
    eager_capture,
)
from fpsfl.base.images import Draws
from fractals.stream import apply_views

WARM_STEPS = 3  # eager steps before the first capture: optimiser state, cuDNN/cuBLAS handles, compilation


@torch.no_grad()
def sgd_update(params: list[Tensor], grads: list[Tensor], buffers: list[Tensor | None], lr: Tensor, *,
               weight_decay: float, momentum: float, dampening: float, nesterov: bool,
               foreach: bool = False) -> None:
    """One step of ``torch.optim.SGD`` (``maximize`` off, every momentum buffer made by an earlier step)
    with the rate a 0-dim tensor ``lr`` on the parameters' device, so that a captured graph can be replayed
    under a new rate without a host sync. The loop is torch's single-tensor form, its kernels and arguments
    but the rate's, which ``addcmul_`` takes from a tensor and rounds as ``add_``'s alpha: equal bit for bit
    (tested). ``foreach`` (a GPU's: a few kernels over all the tensors, where the loop launches several per
    parameter) is torch's multi-tensor form with the product by the rate made separately, so it may differ
    from torch's in the last bit."""
    if foreach:
        if weight_decay != 0:
            grads = torch._foreach_add(grads, params, alpha=weight_decay)
        if momentum != 0:
            torch._foreach_mul_(buffers, momentum)
            torch._foreach_add_(buffers, grads, alpha=1 - dampening)
            grads = torch._foreach_add(grads, buffers, alpha=momentum) if nesterov else buffers
        torch._foreach_add_(params, torch._foreach_mul(grads, lr), alpha=-1)
        return
    for param, grad, buf in zip(params, grads, buffers, strict=True):
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        if momentum != 0:
            buf.mul_(momentum).add_(grad, alpha=1 - dampening)
            grad = grad.add(buf, alpha=momentum) if nesterov else buf
        param.addcmul_(grad, lr, value=-1)


class Step:
    """The eager step: ``step(images, draws, labels)`` makes the views of one batch of uint8 renders from
    their draws (:func:`fractals.stream.draw_views`) and trains on them; ``loss_sum``/``stat_sums`` are the
    epoch's sums (device tensors, read once an epoch or every few steps by the caller)."""

    drop_grads = True  # zero_grad's set_to_none: torch's default for an eager step

    def __init__(self, method: torch.nn.Module, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 autocast=None, applier=None):
        self.method, self.model, self.optimizer = method, model, optimizer
        self.autocast = autocast if autocast is not None else nullcontext()
        self.applier = applier or apply_views  # None: eager, the device's form (host form on a CPU)
        self.loss_sum: Tensor | None = None
        self.stat_sums: dict[str, Tensor] = {}

    def begin_epoch(self) -> None:
        """Zero the sums in place (a captured graph keeps adding to the same tensors)."""
        for t in (self.loss_sum, *self.stat_sums.values()):
            if t is not None:
                t.zero_()

    def __call__(self, images: Tensor, draws: list[Draws], labels: Tensor | None, lap=None) -> None:
        """``lap(phase)``: the profile's clock, told when the views are made (eager steps only)."""
        views = self._views(images, draws)
        if lap is not None:
            lap("augment")
        self.optimizer.zero_grad(set_to_none=self.drop_grads)
        self._train(views, labels)

    def _views(self, images: Tensor, draws: list[Draws]) -> Tensor:
        dtype = next(self.method.parameters()).dtype  # float32 (float64 under the test hook)
        return self.applier(images, draws, self.method.augment).to(dtype)

    def _train(self, views: Tensor, labels: Tensor | None,
               update: Callable[[], object] | None = None) -> None:
        with self.autocast:
            loss, stats = self.model(views, labels)
        loss.backward()  # DDP averages the gradients over processes: the global batch's gradient
        (update or self.optimizer.step)()
        self.method.after_step()
        self._add(loss.detach().float(), {k: v.float() for k, v in stats.items()})

    def _add(self, loss: Tensor, stats: dict[str, Tensor]) -> None:
        if self.loss_sum is None:
            self.loss_sum = torch.zeros_like(loss)
        self.loss_sum.add_(loss)
        for key, value in stats.items():
            if key not in self.stat_sums:
                self.stat_sums[key] = torch.zeros_like(value)
            self.stat_sums[key].add_(value)


class GraphedStep(Step):
    """The step captured once and replayed for every batch of the captured shape, at any learning rate.

    ``capture(fn)`` records ``fn`` without running it and returns the replay (:func:`cuda_capture` on a
    GPU; on the CPU, tests pass :class:`~fpsfl.base.graphs.PinnedCapture`, which replays by calling
    ``fn``). The views are made inside the graph by the sync-free form of the augmentation (``applier``:
    that form compiled, under ``--compile``). The first :data:`WARM_STEPS` batches of the run train
    eagerly (on a side stream on CUDA, as capture requires) with the same form, so that nothing (cuDNN
    handles, the optimiser's state, the augmentation's device constants, compiled graphs) is created
    while capturing. A batch of another shape trains eagerly in the graph's own gradients, zeroed in place
    (``drop_grads`` off), so the graph stays valid across an epoch's short last batch."""

    drop_grads = False

    def __init__(self, method, model, optimizer, capture: Capture, autocast=None, applier=None,
                 warm_steps: int = WARM_STEPS, side_stream: Callable[[], object] | None = None):
        if warm_steps < 1:  # the sums must exist before the capture, or the graph would zero them each replay
            raise ValueError("a captured step needs at least one eager warm-up step")
        if type(optimizer) is not torch.optim.SGD:  # the captured update is SGD's (sgd_update)
            raise TypeError(f"a captured step trains with torch.optim.SGD, not {type(optimizer).__name__}")
        super().__init__(method, model, optimizer, autocast, applier or partial(apply_views, sync_free=True))
        self.capture, self.warm_left = capture, warm_steps
        self.side_stream = side_stream or nullcontext
        self.images: Tensor | None = None
        self.draws: list[Draws] | None = None
        self.labels: Tensor | None = None
        self.replay: Callable[[], None] | None = None
        self.lrs: list[Tensor] = []  # each group's rate on the device, read by the graph
        self.set_lrs: tuple = ()  # the rates they hold
        self.captures = 0

    def tensors(self) -> list[Tensor]:
        """Every tensor the captured step reads or writes: they must keep their storage between replays
        (the CPU stand-in :class:`~fpsfl.base.graphs.PinnedCapture` checks it)."""
        found = [*self.method.parameters(), *self.method.buffers(), self.loss_sum, *self.stat_sums.values()]
        found += [p.grad for p in self.method.parameters()]
        found += [t for state in self.optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
        found += self.lrs
        found += [self.images, *(t for d in self.draws or () for t in d), self.labels]
        return [t for t in found if t is not None]

    def _refresh_lrs(self) -> None:
        """The groups' rates into the device tensors the graph reads (made once, written in place: a kernel
        launch each, no sync), when they changed."""
        now = tuple(g["lr"] for g in self.optimizer.param_groups)
        if not self.lrs:
            params = [g["params"][0] for g in self.optimizer.param_groups]
            self.lrs = [torch.zeros((), dtype=p.dtype, device=p.device) for p in params]
        if now != self.set_lrs:
            for tensor, lr in zip(self.lrs, now, strict=True):
                tensor.fill_(lr)
            self.set_lrs = now

    def _sgd(self) -> None:
        """The optimiser's step as :func:`sgd_update` over each group's parameters that have a gradient (as
        torch's SGD skips the others), with the group's device rate; multi-tensor on a GPU, as torch's."""
        for group, lr in zip(self.optimizer.param_groups, self.lrs, strict=True):
            if group["maximize"]:
                raise ValueError("a captured step does not maximise")
            params = [p for p in group["params"] if p.grad is not None]
            buffers = [self.optimizer.state[p].get("momentum_buffer") for p in params]
            sgd_update(params, [p.grad for p in params], buffers, lr, weight_decay=group["weight_decay"],
                       momentum=group["momentum"], dampening=group["dampening"], nesterov=group["nesterov"],
                       foreach=lr.is_cuda)

    def __call__(self, images: Tensor, draws: list[Draws], labels: Tensor | None, lap=None) -> None:
        if self.images is None:
            self.images = torch.empty_like(images)
            self.draws = [Draws(*map(torch.empty_like, d)) for d in draws]
            self.labels = None if labels is None else torch.empty_like(labels)
        if images.shape != self.images.shape or (labels is None) != (self.labels is None) or (
                labels is not None and labels.shape != self.labels.shape):
            super().__call__(images, draws, labels, lap)  # eager, in the graph's gradients (drop_grads)
            return
        self.images.copy_(images)
        for static, d in zip(self.draws, draws, strict=True):
            for a, b in zip(static, d, strict=True):
                a.copy_(b)
        if labels is not None:
            self.labels.copy_(labels)
        if self.warm_left > 0:
            self.warm_left -= 1
            with self.side_stream():
                super().__call__(self.images, self.draws, self.labels)
            return
        self._refresh_lrs()
        if self.replay is None:
            self.replay = self.capture(self._captured)
            self.captures += 1
        self.replay()

    def _captured(self) -> None:
        views = self._views(self.images, self.draws)
        # the warm-up made the gradients; zeroing them in place keeps their addresses, where setting them
        # to None would make the graph's backward allocate new ones that the eager code never sees
        self.optimizer.zero_grad(set_to_none=False)
        self._train(views, self.labels, update=self._sgd)


def make_step(method, model, optimizer, device: torch.device, amp: bool, graph: bool, applier=None) -> Step:
    """The run's step: eager, or captured when ``graph`` (CUDA only; autocast without its weight cache,
    whose cast copies a graph would not see refreshed). ``applier``: the views' maker (None: eager;
    :func:`pretrain.compiled.compile_augment`'s under ``--compile``)."""
    if not graph:
        autocast = torch.autocast(device.type, dtype=torch.bfloat16) if amp else None
        return Step(method, model, optimizer, autocast, applier)
    capture = capture_for(device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False) if amp else None
    return GraphedStep(method, model, optimizer, capture, autocast, applier,
                       side_stream=cuda_side_stream if device.type == "cuda" else None)
