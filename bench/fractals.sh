#!/usr/bin/env bash
# The renderer figures of docs/performance.md: one JSON line per row, one core each.
# FPS_OFFICIAL=/path/to/a/checkout of andytu28/FPS_Pre-training adds the official generator side by side
# (bench/official_fractals.py: needs opencv importable, e.g. pip install --target DIR
# opencv-python-headless and PYTHONPATH=DIR; `git -C MIRROR worktree add DIR` or `git archive` gives a checkout).
set -euo pipefail
fractals bench --size 32 --pairs "${PAIRS_32:-100000}" --json
fractals bench --size 32 --augs --pairs "${PAIRS_32_AUGS:-50000}" --json
fractals bench --size 224 --pairs "${PAIRS_224:-1000}" --json
# each view rendering its own instances (--instances independent), as before issue 23
fractals bench --size 32 --instances independent --pairs "${PAIRS_32:-100000}" --json
# the first renderer's look (--look sparse), which the rows above were first measured with
fractals bench --size 32 --look sparse --pairs "${PAIRS_32:-100000}" --json
fractals bench --size 224 --look sparse --pairs "${PAIRS_224:-1000}" --json
if [[ -n "${FPS_OFFICIAL:-}" ]]; then
    "${PYTHON:-python}" "$(dirname "$0")/official_fractals.py" "$FPS_OFFICIAL" --pairs "${PAIRS_OFFICIAL:-5000}"
fi
