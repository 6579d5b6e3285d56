# Shared by every recipe: paths, seeds, and the FPS pre-training that the recipes start from.
# Chen et al., ICLR 2023, Appendix A.2: SimSiam on FPS pairs, 100 epochs x 1M pairs, batch 256.
set -euo pipefail
DATA=${DATA:-~/data}
OUT=${OUT:-runs}
SEEDS=${SEEDS:-0 1 2}
DEVICE=${DEVICE:-auto}
mkdir -p "$OUT"
# GPU time (estimate): 100M pairs at the target 14,000 pairs/s of one H100 = about 2 h per checkpoint.
fps_ckpt() {  # fps_ckpt ARCH SIZE -> path of the FPS checkpoint for that backbone, pre-training it once
    local arch=$1 size=$2 out="$OUT/fps-$1-$2.ckpt"
    [ -f "$out" ] || pretrain fps --arch "$arch" --size "$size" --epochs 100 --pairs-per-epoch 1000000 \
        --batch-size 256 --amp --device "$DEVICE" --out "$out" >&2
    echo "$out"
}
