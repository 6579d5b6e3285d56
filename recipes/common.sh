# Shared by every recipe: scale, paths, seeds, and the steps that make a run only once.
#
# SCALE=paper (default): the paper's settings (Chen et al., ICLR 2023, §4.2, Table 9, App. A.2 and B) on the
#   datasets under DATA (see recipes/README.md for the layout), on DEVICE (auto: a GPU when there is one).
# SCALE=smoke: every command of the recipe on the CPU in minutes, on tiny datasets in each dataset's real
#   on-disk format that recipes/smoke_data.py writes into $OUT/smoke-data: 2 rounds x 1 local epoch,
#   pre-training 2 epochs x 128 pairs, one seed, 64 px where the paper uses 224 px, and --min-size 1
#   --no-verify (the tiny CIFAR files cannot match the published md5 sums). It checks the commands, not
#   the numbers.
# OUT (default runs) holds the runs; SEEDS (default 0 1 2) the repetitions `analyze report` pools.
# "Finished means finished, and by these settings" (issue 42): a run that started is always called again
# with --resume, which compares the settings (and federate the --init file's sha256) with the run's record,
# refuses one made otherwise, continues one that stopped part-way and only re-reads one that finished (no
# training). A pre-training checkpoint without its run directory is reused only when it holds the
# recipe's last epoch (as federated/initialisation.py's shipped_ready checks shipped weights).
set -euo pipefail
shopt -s inherit_errexit  # a failing step inside $(...) stops the recipe too (fps=$(fps_ckpt ...))
RECIPES=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SCALE=${SCALE:-paper}
OUT=${OUT:-runs}
DEVICE=${DEVICE:-auto}
mkdir -p "$OUT"
# Dir(alpha) as Chen et al. §4.2 describe it, each class cut at its own draw (--balance none); federate's
# default is NIID-Bench's code, which stops feeding a client once it holds N/M samples (docs/recipes.md)
SPLIT=(--balance none)
case $SCALE in
    paper)
        DATA=${DATA:-$HOME/data}
        SEEDS=${SEEDS:-0 1 2}
        ROUNDS=100 LOCAL_EPOCHS=5              # §4.2: 100 rounds x 5 local epochs
        PT_EPOCHS=100 PT_PAIRS=1000000 PT_BATCH=256  # App. A.2: 100 epochs x 1M pairs, batch 256
        IN32_EPOCHS=40                         # ImageNet32 (not given by the paper; Chrabaszcz et al.'s budget)
        FOLDER_EPOCHS=100                      # StyleGAN images, 1.3M of them: "the same setup" as FPS (App. A.2)
        BIG=224                                # px: ResNet18 / MobileNetV2 inputs (§4.2)
        PT_FLAGS=(--amp)
        FL_FLAGS=("${SPLIT[@]}")
        CIFAR_DL=(--download)                  # torchvision fetches CIFAR when it is not under DATA
        CITYSCAPES_FLAGS=()                    # 768 px crops, 1024 x 2048 test (App. B.1)
        ;;
    smoke)
        DATA=$OUT/smoke-data
        python "$RECIPES/smoke_data.py" "$DATA" >&2
        export TORCH_HOME=$DATA/torch-home     # --init imagenet finds smoke_data's stand-in weight files
        DEVICE=cpu
        SEEDS=${SEEDS:-0}
        ROUNDS=2 LOCAL_EPOCHS=1
        PT_EPOCHS=2 PT_PAIRS=128 PT_BATCH=64 IN32_EPOCHS=1 FOLDER_EPOCHS=1
        BIG=64
        PT_FLAGS=(--quiet)
        FL_FLAGS=("${SPLIT[@]}" --no-verify --min-size 1 --quiet)
        CIFAR_DL=()
        CITYSCAPES_FLAGS=(--store-size 64 --crop-size 64 --eval-size 64x128 --batch-size 2)
        ;;
    *) echo "SCALE must be paper or smoke, got $SCALE" >&2; exit 2 ;;
esac
PT_FRACTAL=(--pairs-per-epoch "$PT_PAIRS" --batch-size "$PT_BATCH")  # with --epochs "$PT_EPOCHS"
# the self-supervised pre-trainings run as the official FPS code does (He init); PT_RECIPE=short gives
# pretrain's default for short budgets (init x0.1; docs/pretraining.md, "Does it learn?")
PT_RECIPE=${PT_RECIPE:-official}
# where each dataset lies under DATA (recipes/README.md); override any of them
INAT_IMAGES=${INAT_IMAGES:-$DATA/inat/images}  # train_val_images/ with train2017.json and val2017.json
INAT_GEO10K=${INAT_GEO10K:-$DATA/inat/inaturalist-geo/federated_train_geo_10k.csv}
INAT_GEO3K=${INAT_GEO3K:-$DATA/inat/inaturalist-geo/federated_train_geo_3k.csv}
INAT_TEST=${INAT_TEST:-$DATA/inat/inaturalist-geo/test.csv}
CITYSCAPES=${CITYSCAPES:-$DATA/cityscapes}
IMAGENET32=${IMAGENET32:-$DATA/imagenet32}      # train_data_batch_1..10 (Imagenet32_train.zip)
PLACES365=${PLACES365:-$DATA/resnet18_places365.pth.tar}
CHEST_XRAY=${CHEST_XRAY:-$DATA/chest_xray}      # train/{NORMAL,PNEUMONIA}/, test/... (Kermany et al. 2018)
STYLEGAN=${STYLEGAN:-$DATA/stylegan}            # Baradad et al.'s StyleGAN images

C10=(--dataset cifar10 --data-root "$DATA" "${CIFAR_DL[@]}")
C100=(--dataset cifar100 --data-root "$DATA" "${CIFAR_DL[@]}")
TINY=(--dataset tinyimagenet --data-root "$DATA" --input-size 64)  # Tables 1, 8: 64 px (ResNet18)

label() {  # the init label analyze report shows for an --init (random, places365, a checkpoint's stem)
    case $1 in places365:*) echo places365 ;; *) basename "$1" .ckpt ;; esac
}

finished() {  # finished CKPT EPOCHS: CKPT holds its run's last epoch, and that is EPOCHS
    [ -f "$1" ] || return 1
    python - "$1" "$2" <<'PY'
import sys
from federated.initialisation import shipped_progress
try:
    done, total = shipped_progress(sys.argv[1])
except Exception as exc:  # an unreadable checkpoint is not a finished one
    print(f"recipes: {sys.argv[1]} is not a usable checkpoint ({exc}); pre-training it again", file=sys.stderr)
    sys.exit(1)
sys.exit(0 if done == total == int(sys.argv[2]) else 1)
PY
}

started() {  # started RUNDIR: a run began there (its config.json, or a state): --resume continues it
    [ -f "$1/state.pt" ] || [ -f "$1/config.json" ]
}

pretrained() {  # pretrained CKPT EPOCHS PRETRAIN-ARGS... -> prints CKPT, made (or finished) if needed
    local ckpt=$1 epochs=$2 resume=()
    shift 2
    if started "${ckpt%.ckpt}.run" || ! finished "$ckpt" "$epochs"; then
        started "${ckpt%.ckpt}.run" && resume=(--resume)  # checked against its record; continued if cut
        local said=/dev/stderr
        finished "$ckpt" "$epochs" && said=/dev/null  # finished: checked only; its result line not repeated
        pretrain "$@" --epochs "$epochs" "${PT_FLAGS[@]}" "${resume[@]}" --device "$DEVICE" --out "$ckpt" \
            > "$said" || return 1
    fi
    echo "$ckpt"
}

fps_ckpt() {  # fps_ckpt ARCH SIZE [METHOD [WIDTH]] -> FPS checkpoint of that backbone (App. A.2)
    local arch=$1 size=$2 method=${3:-simsiam} width=${4:-1}
    pretrained "$OUT/pretrain/fps-$method-$arch-w$width-$size.ckpt" "$PT_EPOCHS" fps --arch "$arch" \
        --width "$width" --size "$size" --method "$method" --recipe "$PT_RECIPE" "${PT_FRACTAL[@]}"
}

imagenet32_ckpt() {  # imagenet32_ckpt [ARCH [WIDTH]] -> ResNet20 pre-trained on 32 px ImageNet (§4.2, "ImageNet")
    local arch=${1:-resnet20} width=${2:-1}
    pretrained "$OUT/pretrain/imagenet32-$arch-w$width.ckpt" "$IN32_EPOCHS" supervised --format imagenet32 \
        --root "$IMAGENET32" --arch "$arch" --width "$width" --size 32 --batch-size "$PT_BATCH"
}

fl() {  # fl OUTDIR FEDERATE-ARGS...: a federate run with the scale's rounds and epochs (later flags win),
    # continued with --resume once started. A finished run is not skipped on its final.pt alone (issue 42):
    # federate --resume compares the settings and the --init file's sha256 with the run's record, refuses
    # (exit 2) a run made otherwise, and on a finished run only prints its result again
    local out=$1 resume=() quiet=/dev/stdout
    shift
    started "$out" && resume=(--resume)
    [ -f "$out/final.pt" ] && quiet=/dev/null  # finished: checked, not retrained; its result line not repeated
    federate --rounds "$ROUNDS" --local-epochs "$LOCAL_EPOCHS" "$@" "${FL_FLAGS[@]}" "${resume[@]}" \
        --device "$DEVICE" --out "$out" > "$quiet"
}

report() {  # report NAME ANALYZE-REPORT-ARGS...: the table in $OUT/NAME (report.md, report.json)
    local name=$1
    shift
    analyze report "$@" --out "$OUT/$name" --force  # the recipe owns its report: rewritten from the runs
}
