#!/usr/bin/env bash
# The renderer figures of README's Performance section: one JSON line per row, one core each.
set -euo pipefail
fractals bench --size 32 --pairs "${PAIRS_32:-100000}" --json
fractals bench --size 32 --augs --pairs "${PAIRS_32_AUGS:-50000}" --json
fractals bench --size 224 --pairs "${PAIRS_224:-1000}" --json
# the first renderer's look (--look sparse), which the rows above were first measured with
fractals bench --size 32 --look sparse --pairs "${PAIRS_32:-100000}" --json
fractals bench --size 224 --look sparse --pairs "${PAIRS_224:-1000}" --json
