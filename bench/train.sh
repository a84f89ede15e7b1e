#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Training throughput of `dtengine train` for the tiny model (dim 256, 4
# layers, 8 heads / 2 kv heads, D = 32, ffn 768, vocab 512, tied head) at
# T = 4096 tokens, context parallel over R = 1, 2, 4 ranks, one BLAS thread
# per rank. Each job trains DT_BENCH_STEPS steps on the recall task; step 0
# is warm-up and dropped, tokens/s is the median of the other steps (the
# engine's per-step line, whole sequence over rank 0's wall time). The
# baseline, measured in the same run on the same machine, is OpenBLAS
# sgemm at 2048^3 on one thread (bench/bench_attn --quick); the table gives
# the model FLOP/s each rank reaches as a fraction of it. With more ranks
# than cores, ranks share cores: the "per core" columns divide by the cores
# actually busy, min(R, cores). Prints a table; asserts nothing.
#
# FLOPs per token (matrix products only; norms, RoPE, SwiGLU's product,
# softmax and the loss are left out):
#   6 N            N = matrix parameters = L (2 d^2 + 2 d Hkv D + 3 d f) + V d
#                  (the tied head counts once, as the LM head; the
#                  embedding lookup is not a product) = 3,145,728 for tiny
# + 3.5 * 4 D H (T + 1) / 2 * L
#                  attention: 4 D FLOPs per visible (query, key) pair per
#                  head forward (Q K^T and P V), 2.5 times that backward (the
#                  kernel recomputes P: 5 products), (T + 1) / 2 keys visible
#                  per query on average under the causal mask; the same count
#                  as bench_attn. 29,367,296 for tiny at T = 4096.
set -eu
top=${DT_BUILDDIR:-$(cd "$(dirname "$0")/.." && pwd)}
MPIRUN=${MPIRUN:-mpirun}
T=${DT_BENCH_T:-4096}
K=${DT_BENCH_STEPS:-5}
RANKS=${DT_BENCH_RANKS:-1 2 4}
if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM
cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)

# the tiny shape, as engine/cmd/train.c's preset
d=256 L=4 H=8 Hkv=2 D=32 f=768 V=512
flops=$(awk -v d=$d -v L=$L -v H=$H -v k=$Hkv -v D=$D -v f=$f -v V=$V -v T="$T" 'BEGIN {
    n = L * (2 * d * d + 2 * d * k * D + 3 * d * f) + V * d
    printf "%.0f", 6 * n + 3.5 * 4 * D * H * (T + 1) / 2 * L }')

"$top/bench/bench_attn" --quick >"$tmp/attn"
sgemm=$(sed -n 's/^ *2048 x 2048 x 2048 *\([0-9.]*\) GFLOP\/s.*/\1/p' "$tmp/attn")
[ -n "$sgemm" ] || { echo "bench/train.sh: no sgemm line from bench_attn" >&2; exit 1; }

printf 'training throughput, tiny model, T=%s, %s steps (step 0 dropped), %s cores\n' \
    "$T" "$K" "$cores"
printf 'model FLOPs per token: %s (6 N + causal attention, matrix products only)\n' "$flops"
sed -n 's/^machine: /machine: /p' "$tmp/attn"
printf 'baseline: OpenBLAS sgemm 2048^3, 1 thread, same run: %s GFLOP/s\n' "$sgemm"
printf 'R > %s cores: ranks share cores, compare the per-core columns\n\n' "$cores"
printf '%3s %5s | %9s | %14s %8s | %14s %8s\n' R cores tokens/s "GFLOP/s/rank" "% sgemm" \
    "GFLOP/s/core" "% sgemm"
for r in $RANKS; do
    "$MPIRUN" --oversubscribe --mca pml ob1 --mca btl self,vader -np "$r" \
        "$top/engine/dtengine" train --model tiny --data recall --seq-len "$T" --steps "$K" \
        >"$tmp/out"
    # median tokens/s over steps 1..K-1
    tps=$(awk '$1 == "step" && $2 > 0 { print $6 }' "$tmp/out" | sort -n |
        awk '{ v[NR] = $1 } END { if (NR == 0) exit 1
              printf "%.0f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
    busy=$((r < cores ? r : cores))
    awk -v r="$r" -v b="$busy" -v t="$tps" -v F="$flops" -v s="$sgemm" 'BEGIN {
        g = t * F / 1e9
        printf "%3d %5d | %9d | %14.1f %7.0f%% | %14.1f %7.0f%%\n", r, b, t,
            g / r, 100 * g / r / s, g / b, 100 * g / b / s }'
done
