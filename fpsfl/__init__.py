"""fpsfl: fractal pre-training for federated learning (Chen et al., ICLR 2023).

Two layers of the project live here, at either end of the one-way house (see docs/architecture.md):
:mod:`fpsfl.base` is the plumbing every package may import (CLI, typed settings, registries, device, run
directories, checkpoint I/O, image tensors); :mod:`fpsfl.demo` is the main job, which may import every
package. This file imports neither.
"""
