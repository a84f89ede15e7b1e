#!/bin/sh
# SPDX-License-Identifier: MIT
#
# coverage.sh: which lines of dt's GPU host code the simulated-device tests
# reach. Run in a build configured with coverage, after the tests:
#
#     ./configure CFLAGS="-O0 -g --coverage" LDFLAGS="--coverage"
#     make tests/gpu/dtengine-sim engine/dtengine cli/dtctl agent/dtagentd \
#          coordinator/dtcoordd tests/tools/npytool
#     make check TESTS="tests/integration/gpu_sim.sh tests/gpu/test_ring_sched"
#     sh tests/gpu/sim/coverage.sh .
#
# Prints, per source file of the GPU path that the simulated build compiles
# (the ring, NCCL wire-up, the GPU model, the engine's GPU commands), the
# lines gcov counts as executable and executed, from the objects of
# tests/gpu/dtengine-sim and tests/gpu/test_ring_sched. The CUDA kernels
# (.cu) are not among them: the simulator stands in for them
# (tests/gpu/sim/sim_*.c); their own tests need a GPU (tests/gpu/device.sh).
#
# usage: sh tests/gpu/sim/coverage.sh BUILDDIR
set -u
[ $# -eq 1 ] || {
    echo "usage: sh tests/gpu/sim/coverage.sh BUILDDIR" >&2
    exit 2
}
cd "$1" || exit 1
command -v gcov >/dev/null 2>&1 || {
    echo "coverage.sh: gcov is not on PATH" >&2
    exit 1
}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dt-cov.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
printf '| file | lines | executed | %% |\n|---|---:|---:|---:|\n'
tl=0 te=0
for src in engine/attn/ring_cuda.c engine/attn/dilated_cuda.c engine/attn/ring_call.c \
    engine/comm/comm_nccl.c engine/comm/ring_pmix.c engine/attn/attn_gpu.c \
    engine/model/model_cuda.c engine/model/train_cuda.c engine/cmd/attn.c engine/cmd/prefill.c \
    engine/cmd/train.c engine/cmd/train_gpu.c engine/cmd/devices.c kernels/cuda/util.c; do
    base=$(basename "$src" .c)
    dir=$(dirname "$src")
    best_l=0 best_e=0
    # the object with the most executed lines (the engine's, or the ring
    # test's for the ring and NCCL files)
    for obj in "$dir"/tests_gpu_dtengine_sim-"$base".gcda "$dir"/tests_gpu_test_ring_sched-"$base".gcda; do
        [ -f "$obj" ] || continue
        (cd "$tmp" && gcov -n -o "$OLDPWD/$dir" "$OLDPWD/${obj%.gcda}.o" 2>/dev/null) >"$tmp/out"
        # the block for this source file: "File '...src'" then "Lines executed:P% of N"
        set -- $(awk -v f="$base.c" '
            /^File / { cur = ($2 ~ f "\x27$") }
            cur && /^Lines executed:/ { sub(/Lines executed:/, ""); sub(/%/, ""); print $1, $3; exit }' \
            "$tmp/out")
        [ $# -eq 2 ] || continue
        e=$(awk -v p="$1" -v n="$2" 'BEGIN { printf "%d", p * n / 100 + 0.5 }')
        if [ "$e" -gt "$best_e" ]; then best_l=$2 best_e=$e; fi
    done
    [ "$best_l" -gt 0 ] || { printf '| %s | - | - | not built or not run |\n' "$src"; continue; }
    tl=$((tl + best_l)) te=$((te + best_e))
    awk -v s="$src" -v l="$best_l" -v e="$best_e" 'BEGIN { printf "| %s | %d | %d | %.1f |\n", s, l, e, 100 * e / l }'
done
awk -v l="$tl" -v e="$te" 'BEGIN { if (l) printf "| all | %d | %d | %.1f |\n", l, e, 100 * e / l }'
