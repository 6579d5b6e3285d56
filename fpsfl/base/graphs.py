"""Capturing a training step as a CUDA graph (issue 40), shared by ``pretrain --cuda-graph``
(:mod:`pretrain.graphed`) and ``federate --cuda-graph`` (:mod:`federated.batched`).

A capture records a function's kernels without running them; the replay runs them all with one launch,
at the addresses they were captured with. :class:`PinnedCapture` is the CPU stand-in the tests and the GPU
bench's dry run use: it records the function and replays it by calling it, so the code around a graph
(static buffers, in-place updates) runs as on a GPU, and it fails where a real graph would go wrong
silently: a tensor the step touches that moved to new storage after the capture.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

Capture = Callable[[Callable[[], None]], Callable[[], None]]
# Tests and the GPU bench's dry run only: set, --cuda-graph on a CPU captures with PinnedCapture
STANDIN_ENV = "FPSFL_TEST_GRAPH_STANDIN"


def capture_for(device: torch.device) -> Capture:
    """How ``--cuda-graph`` captures on ``device``: a CUDA graph; a ValueError (a one-line error for the
    CLIs) elsewhere, unless a test asks for the CPU stand-in (:data:`STANDIN_ENV`)."""
    if device.type == "cuda":
        return cuda_capture
    if os.environ.get(STANDIN_ENV):
        return PinnedCapture()
    raise ValueError(f"--cuda-graph needs a CUDA device, not {device.type}")


def eager_capture(fn: Callable[[], None]) -> Callable[[], None]:
    """The CPU stand-in of :func:`cuda_capture` (tests, ``bench/gpu.sh --dry-run``): records ``fn`` without
    running it and replays it by calling it, so the static buffers' plumbing runs as on a GPU."""
    return fn


class PinnedCapture:
    """The checking CPU stand-in of :func:`cuda_capture`. ``fn`` is a bound method whose owner lists
    every tensor the captured step reads or writes (``owner.tensors()``); each replay calls ``fn``, then
    raises RuntimeError if one of them now lives elsewhere: a real graph would have gone on reading and
    writing the old storage. ``on_replay(owner)``, if given, runs after each replay (tests record it)."""

    def __init__(self, on_replay: Callable[[object], None] | None = None):
        self.on_replay = on_replay

    def __call__(self, fn: Callable[[], None]) -> Callable[[], None]:
        owner = fn.__self__
        pinned = [t.data_ptr() for t in owner.tensors()]

        def replay() -> None:
            fn()
            if [t.data_ptr() for t in owner.tensors()] != pinned:
                raise RuntimeError(f"a tensor of the captured {type(owner).__name__} moved to new storage "
                                   "after the capture: a CUDA graph would read and write the old one")
            if self.on_replay is not None:
                self.on_replay(owner)
        return replay


def cuda_capture(fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` captured as a CUDA graph (not run); returns its replay."""
    torch.cuda.synchronize()  # the warm-up's side stream and the copy of the batch have finished
    graph = torch.cuda.CUDAGraph()
    # thread_local: the DataLoader's pin-memory thread may call CUDA while this thread captures
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        fn()
    return graph.replay


@contextmanager
def cuda_side_stream() -> Iterator[None]:
    """Eager warm-up work on a side stream, joined to the current one after (capture happens on a side
    stream; handles made lazily by the warm-up must belong to one)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream().wait_stream(stream)
