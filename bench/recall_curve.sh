#!/bin/sh
# SPDX-License-Identifier: MIT
#
# The recall task's learning curve: `dtengine train --data recall` under
# mpirun with 4 ranks (DT_BENCH_RANKS), contiguous layout, so the planted
# pairs lie on rank 0 and every answer slot on the last rank: an answer is
# right only through attention that crosses rank boundaries. The model is a
# 2-layer shape smaller than `tiny` (dim 64, 2 heads of D = 32, ffn 256,
# vocab 512, tied head) and T = 256 (8 pairs, 8 queries per sequence, one
# sequence per step): `tiny` itself stayed at chance over 1500 steps, and
# this shape runs about 5 times faster per step. Every DT_BENCH_EVERY steps
# the table gives the loss and recall accuracy averaged over the last
# DT_BENCH_WINDOW steps (8 answers a step). The baseline row is
# chance: recall 1/128 (uniform over the 128 values) and its loss, ln 128.
# Prints a table; asserts nothing. About 2 to 3 minutes on 2 cores.
set -eu
top=${DT_BUILDDIR:-$(cd "$(dirname "$0")/.." && pwd)}
MPIRUN=${MPIRUN:-mpirun}
R=${DT_BENCH_RANKS:-4}
STEPS=${DT_BENCH_STEPS:-12000}
EVERY=${DT_BENCH_EVERY:-1000}
WINDOW=${DT_BENCH_WINDOW:-500}
if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM

set -- train --model custom --dim 64 --layers 2 --heads 2 --kv-heads 2 --ffn 256 --vocab 512 \
    --data recall --seq-len 256 --steps "$STEPS" --lr 1e-2 --min-lr 1e-3 --weight-decay 0 \
    --layout contiguous --seed 1
printf 'recall accuracy, %s ranks: dtengine %s\n' "$R" "$*"
printf 'mean over the last %s steps (%s answers); chance = 1/128\n\n' "$WINDOW" $((8 * WINDOW))
"$MPIRUN" --oversubscribe --mca pml ob1 --mca btl self,vader -np "$R" \
    "$top/engine/dtengine" "$@" >"$tmp/out"
printf '%8s | %8s | %8s\n' step loss recall
printf '%8s | %8.3f | %8.4f\n' chance "$(awk 'BEGIN { print log(128) }')" \
    "$(awk 'BEGIN { print 1 / 128 }')"
awk -v E="$EVERY" -v W="$WINDOW" '$1 == "step" {
    s = $2; l[s % W] = $4; a[s % W] = $8
    if ((s + 1) % E == 0 && s + 1 >= W) {
        L = 0; A = 0
        for (i = 0; i < W; i++) { L += l[i]; A += a[i] }
        printf "%8d | %8.3f | %8.4f\n", s + 1, L / W, A / W
    }
}' "$tmp/out"
