"""``pretrain --compile`` (issue 40): the training step's forward, loss and backward, and on an accelerator
the augmentation's views made from their draws, as torch.compile graphs. Eager stays the reference
(docs/performance.md, Compiled steps)."""

from __future__ import annotations

from functools import partial

import torch

from fpsfl.base.device import COMPILE_BACKEND_ENV, compile_backend  # noqa: F401 (re-exported)
from fractals.stream import apply_views


def compile_step(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``--compile``: ``model`` (the method, or its DDP wrapper) with its forward and loss compiled by
    torch.compile; AOTAutograd compiles the backward with them, and the optimiser step stays eager (foreach
    on a GPU: a learning rate that changes every epoch would recompile a compiled step). Static shapes: a
    short last batch compiles a second graph. On CUDA cuDNN then times each convolution's algorithms once per
    shape and keeps the fastest (:func:`compile_backend`)."""
    return torch.compile(model, backend=compile_backend(device), dynamic=False)


def compile_augment(device: torch.device):
    """``--compile`` on an accelerator: the views made from their draws (:func:`fractals.stream.apply_views`,
    sync-free) as one compiled graph, for :func:`fractals.stream.augment_views`'s ``applier``; the draws
    stay eager (torch.compile takes no explicit generators). Eager, the sync-free form is about 540 small ops
    a view, 18% of a profiled SimSiam step at 32 px on an H200 (bench/gpu-results, 8793e4f). On a CPU None:
    the eager host form is faster there (2 cores, 2 views of 256 at 32 px: 35 ms, against 143 ms compiled
    with inductor and 74 ms for the eager sync-free form; 2026-11-28)."""
    if device.type == "cpu":
        return None
    return compiled_views(compile_backend())


def compiled_views(backend: str):
    """:func:`fractals.stream.apply_views` in its sync-free form, compiled whole (static shapes). Its first
    call on a device also runs it eagerly, once, so the device constants (jitter strengths, hue offsets,
    normalisation) exist before the graph is traced: they become its inputs, where a constant made while
    tracing would be copied from the host at every call (a sync on a GPU)."""
    compiled = torch.compile(partial(apply_views, sync_free=True), backend=backend, fullgraph=True,
                             dynamic=False)
    primed: set[tuple] = set()

    def applier(images: torch.Tensor, draws: list, cfg) -> torch.Tensor:
        if (images.device, cfg) not in primed:
            apply_views(images, draws, cfg, sync_free=True)
            primed.add((images.device, cfg))
        return compiled(images, draws, cfg)
    return applier
