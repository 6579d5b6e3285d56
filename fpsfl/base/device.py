"""Which torch device a ``--device`` flag means, its name for benchmark records, and the backend of
``--compile``.

Shared by every console script with ``--device`` (``pretrain``, ``federate``, ``analyze``, the benches);
kept apart from :mod:`pretrain.train` so that importing it does not load the renderer and numba.
"""

from __future__ import annotations

import os
import platform

import torch

# Tests only: the torch.compile backend of pretrain's and federate's --compile (default inductor); "aot_eager"
# traces and splits a step as inductor does but runs eager kernels, and compiles in seconds
COMPILE_BACKEND_ENV = "FPSFL_TEST_COMPILE_BACKEND"


def compile_backend(device: torch.device | None = None) -> str:
    """The torch.compile backend ``--compile`` uses: inductor, unless a test names another. Given the
    device, also lets cuDNN time each convolution's algorithms once per shape and keep the fastest on CUDA
    (``cudnn.benchmark``, process-wide, as the MoCo and SimSiam references): compiled shapes are fixed."""
    if device is not None and device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    return os.environ.get(COMPILE_BACKEND_ENV, "inductor")


def resolve_device(name: str) -> torch.device:
    """The torch device of ``--device``; ValueError (one line) for a name torch does not know or a CUDA
    device this machine does not have."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {name!r}") from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {name!r}")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError("--device mps was asked for but MPS is not available on this machine")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA device is available")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def device_name(name: str) -> str:
    """The accelerator's or CPU's name, for benchmark records."""
    device = resolve_device(name)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu: {cpu_record()['model']}, {torch.get_num_threads()} threads"


def cpu_record() -> dict:
    """The CPU a run's sums came from: its model and family as ``/proc/cpuinfo`` names them, and the vector
    extensions (``AVX2``, ``AVX512``, ...) torch chose kernels for. Same-seed CPU runs on two hosts of one
    model name differed (docs/pretraining.md): this lets the next such pair be told apart."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "cpu family", "model") and key not in info:
                    info[key] = value.strip()
                if not line.strip() and info:
                    break  # the first processor's block is enough
    except OSError:
        pass
    return {"model": info.get("model name", platform.processor() or platform.machine()),
            "family": info.get("cpu family", ""), "model_number": info.get("model", ""),
            "capability": torch.backends.cpu.get_cpu_capability()}


def software_and_host() -> dict:
    """What a run's ``config.json`` records of where it ran: torch and Python versions, and the thread count
    and CPU, on both of which a CPU step's sums depend (docs/pretraining.md, "Four times the budget")."""
    return {"torch": torch.__version__, "python": platform.python_version(),
            "threads": torch.get_num_threads(), "cpu": cpu_record()}
