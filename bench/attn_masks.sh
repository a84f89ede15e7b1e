#!/bin/sh
# SPDX-License-Identifier: MIT
#
# The work masks skip, on the CPU: `dtengine attn` (forward and backward,
# one thread per rank) with a mask beside the same attention dense and
# causal, in the same run, the baseline each row names:
#   - 16 documents of 1024 tokens against one causal sequence of 16384,
#     on one rank (ideal: 16x, the pairs' ratio);
#   - a causal sliding window of 1024 at T = 65536 on 4 ranks against
#     dense causal (ideal: the pairs' ratio, about 32x), with each rank's
#     ring traffic: the window reaches only the next rank;
#   - uneven documents (12000, 2400, 616, 9600 and 8152 tokens, T = 32768)
#     on 4 ranks in each layout against zigzag, the default: the busiest
#     rank's work over the mean (--stats' imbalance) and the time.
# Heads H = 2 (1 kv head), D = 64. DT_BENCH_MASK_T2 changes the second
# row's T (default 65536). Prints a table; asserts nothing.
set -eu
top=${DT_BUILDDIR:-$(cd "$(dirname "$0")/.." && pwd)}
MPIRUN=${MPIRUN:-mpirun}
ENGINE=$top/engine/dtengine
T2=${DT_BENCH_MASK_T2:-65536}
[ -x "$ENGINE" ] || { echo "bench/attn_masks.sh: no $ENGINE (make first)" >&2; exit 1; }
root=
[ "$(id -u)" = 0 ] && root=--allow-run-as-root
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM

# run R T NAME ARGS...: one run, its output in $tmp/NAME
run() {
    _r=$1 _t=$2 _n=$3
    shift 3
    "$MPIRUN" $root --oversubscribe -np "$_r" "$ENGINE" attn --generate "$_t,2,1,64" --seed 1 \
        --layout contiguous --causal --backward --threads 1 --stats "$@" >"$tmp/$_n" 2>&1 ||
        { cat "$tmp/$_n" >&2; exit 1; }
}
field() { sed -n "s/^dtengine attn: .* $2=\([0-9.]*\).*/\1/p" "$tmp/$1"; }
sent() { # NAME: the forward bytes each rank sent, as "r0/r1/..." in KiB
    sed -n 's/^stats: fwd rank=[0-9]* .* bytes_sent=\([0-9]*\).*/\1/p' "$tmp/$1" |
        awk '{ printf "%s%.0f", (NR > 1 ? "/" : ""), $1 / 1024 }'
}

docs=1024
i=1
while [ $i -lt 16 ]; do
    docs="$docs,1024"
    i=$((i + 1))
done
run 1 16384 dense1
run 1 16384 docs --doc-lengths "$docs"
run 4 "$T2" dense4
run 4 "$T2" window --sliding-window 1024

printf 'Masked attention against dense causal on the CPU (dtengine attn, forward + backward, 1 thread per rank)\n'
printf 'H = 2, Hkv = 1, D = 64, contiguous layout; ideal = dense pairs / masked pairs; KiB sent = forward ring traffic per rank\n\n'
printf '| case | T | ranks | baseline | fwd s | bwd s | baseline fwd s | baseline bwd s | speedup fwd+bwd | ideal | KiB sent (masked) | KiB sent (baseline) |\n'
printf '|--|--:|--:|--|--:|--:|--:|--:|--:|--:|--|--|\n'
row() { # CASE T R NAME BASE IDEAL
    awk -v c="$1" -v T="$2" -v R="$3" -v f="$(field "$4" seconds)" -v b="$(field "$4" bwd_seconds)" \
        -v bf="$(field "$5" seconds)" -v bb="$(field "$5" bwd_seconds)" -v id="$6" \
        -v s="$(sent "$4")" -v bs="$(sent "$5")" 'BEGIN {
        printf "| %s | %d | %d | dense causal | %.3f | %.3f | %.3f | %.3f | %.1fx | %.1fx | %s | %s |\n",
            c, T, R, f, b, bf, bb, (bf + bb) / (f + b), id, s, bs }'
}
ideal() { # T W-or-docs-len: causal pairs over the masked pairs
    awk -v T="$1" -v w="$2" -v kind="$3" 'BEGIN {
        dense = T * (T + 1) / 2
        if (kind == "docs") m = (T / w) * w * (w + 1) / 2
        else m = w * (w + 1) / 2 + (T - w) * w
        printf "%.1f", dense / m }'
}
row "16 documents of 1024" 16384 1 docs dense1 "$(ideal 16384 1024 docs)"
row "sliding window 1024" "$T2" 4 window dense4 "$(ideal "$T2" 1024 window)"

# the layouts for uneven documents, zigzag (the default) the baseline
udocs=12000,2400,616,9600,8152
for l in zigzag contiguous balanced; do
    run 4 32768 "lay-$l" --doc-lengths "$udocs" --layout "$l"
done
imb() { sed -n 's/^stats: work .* imbalance=\([0-9.]*\)$/\1/p' "$tmp/$1"; }
printf '\nLayouts for uneven documents (%s, T = 32768, 4 ranks; forward + backward, 1 thread per rank)\n\n' "$udocs"
printf '| layout | imbalance (max/mean pairs) | fwd s | bwd s | baseline | baseline fwd+bwd s | speedup |\n'
printf '|--|--:|--:|--:|--|--:|--:|\n'
for l in zigzag contiguous balanced; do
    awk -v l="$l" -v i="$(imb "lay-$l")" -v f="$(field "lay-$l" seconds)" \
        -v b="$(field "lay-$l" bwd_seconds)" -v zf="$(field lay-zigzag seconds)" \
        -v zb="$(field lay-zigzag bwd_seconds)" 'BEGIN {
        printf "| %s | %.3f | %.3f | %.3f | zigzag | %.3f | %.2fx |\n", l, i, f, b, zf + zb,
            (zf + zb) / (f + b) }'
done
