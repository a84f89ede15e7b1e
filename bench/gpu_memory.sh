#!/bin/sh
# SPDX-License-Identifier: MIT
#
# GPU training memory per rank, the planner against the engine: for each
# mode (ranks per ring, dp, recompute, shard, offload, ckpt_dtype) and
# sequence length, the
# device and page-locked host bytes `dtctl plan --json` plans for a cuda
# train job (its device total less the fixed allowance for the CUDA
# context and libraries) beside the peaks that `dtengine train --device
# cuda` reaches on the simulated GPU (tests/gpu/dtengine-sim, which counts
# every cudaMalloc and cudaHostAlloc; DT_SIM_MEMSTAT), one step each, in
# the same run. The model is a small LLaMA (dim 256, 2 layers, 4/2 heads,
# ffn 512, vocab 512, untied) so that a row takes seconds; the planner's
# account is the engine's own (spec/model.h), so the error does not grow
# with the shape. ratio = planned / measured (the planner should never be
# below 1; CI holds it within 1.1 for a few of these, gpu_sim.sh).
#
# DT_BENCH_T: the sequence lengths (default "2048 4096 8192"). Needs a
# build with the simulator (`make tests/gpu/dtengine-sim`; CUDA toolkit at
# configure time) and mpirun. Prints a table; asserts nothing. Exit 0, 77
# without the simulator, 1 when a run fails (its output is shown).
set -eu
top=${DT_BUILDDIR:-$(cd "$(dirname "$0")/.." && pwd)}
SIM=$top/tests/gpu/dtengine-sim
DTCTL=$top/cli/dtctl
MPIRUN=${MPIRUN:-mpirun}
TS=${DT_BENCH_T:-2048 4096 8192}
[ -x "$SIM" ] || { echo "SKIP: bench/gpu_memory.sh needs $SIM (make tests/gpu/dtengine-sim)"; exit 77; }
[ -x "$DTCTL" ] || { echo "bench/gpu_memory.sh: no $DTCTL (make first)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM
root=
[ "$(id -u)" = 0 ] && root=--allow-run-as-root

model="--model custom --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --vocab 512"
# R recompute shard offload ckpt_dtype
modes="1 1 none none none fp32
1 1 layer none none fp32
2 1 none optimizer none fp32
1 1 none none optimizer fp32
2 1 layer optimizer activations,optimizer fp32
1 1 layer none activations,optimizer bf16
2 1 none gradients none fp32
2 1 none parameters none fp32
2 1 layer parameters activations,optimizer bf16
1 1 layer gradients activations,optimizer bf16
2 1 layer gradients activations,optimizer bf16
1 2 none parameters optimizer fp32
2 2 layer gradients activations,optimizer bf16
2 2 none optimizer none fp32"

printf 'GPU training memory per rank: the planner (dtctl plan) against dtengine train on the simulated GPU\n'
printf 'model: dim 256, 2 layers, heads 4/2, ffn 512, vocab 512, untied, bf16; one step\n'
printf 'ratio = planned / measured (peak); MiB = 2^20 bytes\n\n'
printf '| T | R | dp | recompute | shard | offload | ckpt | device planned | device peak | ratio | host planned | host peak | ratio |\n'
printf '|--:|--:|--:|--|--|--|--|--:|--:|--:|--:|--:|--:|\n'
for T in $TS; do
    printf '%s\n' "$modes" | while read -r R dp rc sh of ck; do
        # shellcheck disable=SC2086
        "$DTCTL" plan --tokens "$T" --kind train $model --tied no --device cuda --causal \
            --json --ranks "$R" --dp "$dp" --recompute "$rc" --shard "$sh" --offload "$of" \
            --ckpt-dtype "$ck" </dev/null >"$tmp/plan" 2>&1 || { cat "$tmp/plan" >&2; exit 1; }
        total=$(sed -n 's/.*"memory_per_rank_bytes": *\([0-9]*\).*/\1/p' "$tmp/plan")
        fixed=$(sed -n 's/.*"fixed": *\([0-9]*\).*/\1/p' "$tmp/plan" | head -n 1)
        host=$(sed -n 's/.*"host_memory_per_rank_bytes": *\([0-9]*\).*/\1/p' "$tmp/plan")
        # shellcheck disable=SC2086
        "$MPIRUN" $root --oversubscribe -np "$((R * dp))" env DT_SIM_GPUS=1 DT_SIM_MEMSTAT=1 "$SIM" \
            train --device cuda $model --tied no --seq-len "$T" --steps 1 --dp "$dp" \
            --recompute "$rc" \
            --shard "$sh" --offload "$of" --ckpt-dtype "$ck" </dev/null >"$tmp/run" 2>&1 ||
            { cat "$tmp/run" >&2; exit 1; }
        dev=$(sed -n 's/^sim: device memory peak \([0-9]*\) bytes$/\1/p' "$tmp/run" | sort -n | tail -n 1)
        hp=$(sed -n 's/^sim: host memory peak \([0-9]*\) bytes$/\1/p' "$tmp/run" | sort -n | tail -n 1)
        awk -v T="$T" -v R="$R" -v dp="$dp" -v rc="$rc" -v sh="$sh" -v of="$of" -v ck="$ck" \
            -v p="$((total - fixed))" -v e="$dev" -v h="$host" -v hp="${hp:-0}" 'BEGIN {
            M = 1048576
            printf "| %d | %d | %d | %s | %s | %s | %s | %.1f | %.1f | %.3f | %.1f | %.1f | %s |\n",
                T, R, dp, rc, sh, of, ck, p / M, e / M, p / e, h / M, hp / M,
                (hp > 0 ? sprintf("%.3f", h / hp) : "-") }'
    done
done
