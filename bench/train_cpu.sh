#!/bin/sh
# SPDX-License-Identifier: MIT
#
# CPU training against PyTorch: `dtengine train --model tiny --seq-len T`
# against Hugging Face transformers' LlamaForCausalLM of the same shape
# with torch.optim.AdamW (bench/train_cpu_torch.py, the named baseline:
# fp32, SDPA attention, the same optimizer recipe, torch.set_num_threads(N)),
# side by side, run alternately: dt, PyTorch, dt, PyTorch, ... DT_BENCH_REPS
# times (default 3). N threads: PyTorch with N threads, dt as N context-
# parallel ranks of one BLAS thread each (how dtengine uses N cores;
# `mpirun -np N` for N > 1). Each run trains DT_BENCH_STEPS steps (default
# 4); step 0 is warm-up and dropped; a run's figure is the median of its
# other steps' seconds, a cell the median over the runs.
# ratio = PyTorch s / dt s per step: above 1 dt is faster.
#
# Needs python3 with torch and transformers; without them it says so and
# exits 77. DT_BENCH_PYTHON picks the interpreter, DT_BENCH_THREADS the
# thread counts (default "1 2"), DT_BENCH_T the sequence lengths (default
# 4096), MPIRUN the launcher. Prints a table; asserts nothing. Exit 0, 77
# without torch, 2 for a malformed setting, 1 when a run fails.
set -eu
top=${DT_BUILDDIR:-$(cd "$(dirname "$0")/.." && pwd)}
src=$(cd "$(dirname "$0")" && pwd)
PY=${DT_BENCH_PYTHON:-python3}
MPIRUN=${MPIRUN:-mpirun}
REPS=${DT_BENCH_REPS:-3}
K=${DT_BENCH_STEPS:-4}
THREADS=${DT_BENCH_THREADS:-1 2}
TS=${DT_BENCH_T:-4096}
if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM

if ! command -v "$PY" >/dev/null 2>&1 || ! "$PY" -c 'import torch, transformers' >/dev/null 2>&1; then
    echo "SKIP: bench/train_cpu.sh needs $PY with torch and transformers (pip install torch transformers; DT_BENCH_PYTHON names another python)"
    exit 77
fi
[ -x "$top/engine/dtengine" ] || { echo "bench/train_cpu.sh: no $top/engine/dtengine (make first)" >&2; exit 1; }
for v in $THREADS $TS $REPS $K; do
    printf '%s\n' "$v" | grep -Eq '^[1-9][0-9]*$' ||
        { echo "bench/train_cpu.sh: '$v' (DT_BENCH_THREADS, DT_BENCH_T, DT_BENCH_REPS or DT_BENCH_STEPS) is not a positive number" >&2; exit 2; }
done
[ "$K" -ge 2 ] || { echo "bench/train_cpu.sh: DT_BENCH_STEPS must be at least 2 (step 0 is warm-up)" >&2; exit 2; }

# median of the numbers on stdin
median() {
    sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print 0; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

for n in $THREADS; do
    for T in $TS; do
        rep=1
        while [ "$rep" -le "$REPS" ]; do
            if [ "$n" -eq 1 ]; then
                set -- "$top/engine/dtengine"
            else
                set -- "$MPIRUN" -np "$n" --oversubscribe --mca pml ob1 --mca btl self,vader \
                    "$top/engine/dtengine"
            fi
            "$@" train --model tiny --seq-len "$T" --steps "$K" >"$tmp/dt.out" 2>&1 ||
                { cat "$tmp/dt.out" >&2; exit 1; }
            grep -m 1 'info: cpu attn_kernel=' "$tmp/dt.out" >"$tmp/cpu" || true
            # step seconds = tokens / (tokens/s) (the step line's 6th field), steps 1..K-1
            awk -v T="$T" '$1 == "step" && $2 > 0 && $6 > 0 { printf "%.6f\n", T / $6 }' "$tmp/dt.out" |
                median | sed "s/^/dt $n $T /" >>"$tmp/times"
            "$PY" "$src/train_cpu_torch.py" --threads "$n" --seq-len "$T" --steps "$K" \
                >"$tmp/pt.out" 2>&1 || { cat "$tmp/pt.out" >&2; exit 1; }
            if grep -q '^ROW torch [0-9]* [0-9]* error' "$tmp/pt.out"; then
                cat "$tmp/pt.out" >&2
                exit 1
            fi
            sed -n 's/^ROW torch [0-9]* [0-9]* //p' "$tmp/pt.out" | tr ' ' '\n' | sed 1d |
                median | sed "s/^/pt $n $T /" >>"$tmp/times"
            rep=$((rep + 1))
        done
    done
done
torchver=$("$PY" -c 'import torch, transformers; print("torch %s, transformers %s, CPU capability %s" % (torch.__version__, transformers.__version__, torch.backends.cpu.get_cpu_capability()))')

printf 'training on the CPU, fp32, tiny model (3.1 M parameters): dtengine train against transformers LlamaForCausalLM + torch.optim.AdamW\n'
printf 'machine: %s\n' "$(sed 's/^.*info: cpu //' "$tmp/cpu")"
printf 'baseline: %s; median of %s alternating runs each (steps 1..%s of each run)\n' \
    "$torchver" "$REPS" "$((K - 1))"
printf 'ratio = PyTorch s / dt s per step (above 1: dt faster); dt at N threads = N ranks\n\n'
printf '| threads | T | PyTorch s/step | dt s/step | dt tokens/s | PyTorch / dt |\n'
printf '|--:|--:|--:|--:|--:|--:|\n'
for n in $THREADS; do
    for T in $TS; do
        pt=$(awk -v n="$n" -v T="$T" '$1 == "pt" && $2 == n && $3 == T { print $4 }' "$tmp/times" | median)
        dt=$(awk -v n="$n" -v T="$T" '$1 == "dt" && $2 == n && $3 == T { print $4 }' "$tmp/times" | median)
        awk -v n="$n" -v T="$T" -v pt="$pt" -v dt="$dt" 'BEGIN {
            tps = dt > 0 ? T / dt : 0; r = dt > 0 ? pt / dt : 0
            printf "| %d | %d | %.4f | %.4f | %.0f | %.2f |\n", n, T, pt, dt, tps, r }'
    done
done
