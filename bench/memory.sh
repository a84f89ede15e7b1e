#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Peak memory per rank of `dtengine attn` (max RSS over ranks, as the
# engine's summary line reports it) as the rank count R grows:
#   1. tokens per rank c fixed (T = c R): should stay flat;
#   2. sequence T fixed (c = T / R): the tensor part should fall as 1 / R.
# The baseline in the same run is a job of the same R with 16 tokens per
# rank: the process's fixed cost (MPI, BLAS, code), subtracted to show the
# part that scales with the data. Causal zigzag, H=8, Hkv=2, D=64.
# Prints tables; asserts nothing.
set -eu
top=${DT_BUILDDIR:-$(cd "$(dirname "$0")/.." && pwd)}
MPIRUN=${MPIRUN:-mpirun}
C=${DT_BENCH_C:-4096}
T=${DT_BENCH_T:-16384}
RANKS=${DT_BENCH_RANKS:-1 2 4 8}
if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

rss() { # R T -> max RSS MiB over ranks
    "$MPIRUN" --oversubscribe --mca pml ob1 --mca btl self,vader -np "$1" \
        "$top/engine/dtengine" attn --generate "$2,8,2,64" --seed 1 --causal \
        --layout zigzag |
        sed -n 's/.*maxrss_mib=\([0-9.]*\).*/\1/p'
}

# The tensors of one rank: q, o (c H D), k, v (c Hkv D), lse (H c), two ring
# buffers of k and v: (2 c H D + 2 c Hkv D + H c + 4 c Hkv D) * 4 bytes.
model() { # c -> MiB
    awk -v c="$1" 'BEGIN { printf "%.1f", (2*c*8*64 + 2*c*2*64 + 8*c + 4*c*2*64) * 4 / 1048576 }'
}

printf 'peak memory per rank, tokens per rank fixed (c=%s)\n' "$C"
printf '%3s %8s %7s | %10s %12s %12s | %10s\n' R T c "maxrss MiB" "baseline MiB" "data MiB" "model MiB"
for r in $RANKS; do
    t=$((C * r))
    m=$(rss "$r" "$t"); b=$(rss "$r" $((16 * r)))
    printf '%3s %8s %7s | %10s %12s %12.1f | %10s\n' "$r" "$t" "$C" "$m" "$b" \
        "$(awk -v m="$m" -v b="$b" 'BEGIN { print m - b }')" "$(model "$C")"
done
echo
printf 'peak memory per rank, sequence fixed (T=%s)\n' "$T"
printf '%3s %8s %7s | %10s %12s %12s | %10s\n' R T c "maxrss MiB" "baseline MiB" "data MiB" "model MiB"
for r in $RANKS; do
    c=$((T / r))
    m=$(rss "$r" "$T"); b=$(rss "$r" $((16 * r)))
    printf '%3s %8s %7s | %10s %12s %12.1f | %10s\n' "$r" "$T" "$c" "$m" "$b" \
        "$(awk -v m="$m" -v b="$b" 'BEGIN { print m - b }')" "$(model "$c")"
done
