#!/bin/sh
# SPDX-License-Identifier: MIT
#
# The planner's memory per rank against what the engine measures. For
# several (T, R), `dtctl plan --kind attn --gpu cpu --json` predicts
# memory_per_rank_bytes for a model of H=8, Hkv=2, D=64 (custom: dim 512,
# 8 heads, 2 kv heads), and `dtengine attn --generate T,8,2,64` runs the
# same job under mpirun -np R and reports its max RSS over ranks
# (maxrss_mib on its summary line). Each pair must agree within 20%; the
# table of both is printed. Causal, zigzag, forward only: what the planner's
# kind attn describes. Not a benchmark: the timings are not looked at.
#
# DT_PLAN_MEMORY_CASES overrides the list ("T:R T:R ...").

. "$(dirname "$0")/lib.sh"

DTCTL=$DT_BUILDDIR/cli/dtctl
[ -x "$DTCTL" ] || skip "$DTCTL is not built (make cli/dtctl)"
[ -z "${DT_SANITIZERS:-}" ] ||
    skip "a sanitizer build: AddressSanitizer's shadow and quarantine are in every RSS"
need_mpirun

H=8
HKV=2
D=64
TOL=20
CASES=${DT_PLAN_MEMORY_CASES:-"8192:1 16384:2 16384:4 32768:4"}

# predicted T R -> bytes, from the plan's JSON (one key per line)
predicted() {
    "$DTCTL" plan --json --kind attn --gpu cpu --model custom --dim $((H * D)) --layers 1 \
        --heads "$H" --kv-heads "$HKV" --ffn 1 --vocab 1 --tokens "$1" --ranks "$2" \
        --causal --layout zigzag >"$TMPD/plan.json" || return 1
    sed -n 's/^ *"memory_per_rank_bytes": *\([0-9][0-9]*\).*/\1/p' "$TMPD/plan.json"
}

# measured T R -> MiB, the max RSS over ranks
measured() {
    mpirun_np "$2" "$DTENGINE" attn --generate "$1,$H,$HKV,$D" --seed 1 --causal \
        --layout zigzag >"$TMPD/engine.out" 2>&1 || return 1
    sed -n 's/^dtengine attn:.*maxrss_mib=\([0-9.][0-9.]*\).*/\1/p' "$TMPD/engine.out"
}

# agree PRED_MIB MEAS_MIB: within TOL percent of the measurement
agree() {
    awk -v p="$1" -v m="$2" -v tol="$TOL" 'BEGIN {
        e = (p - m) / m * 100
        printf "predicted %.1f MiB, measured %.1f MiB, error %+.1f%%\n", p, m, e
        exit !(e >= -tol && e <= tol)
    }'
}

printf '%s\n' "T R c predicted_MiB measured_MiB error_%" >"$TMPD/table"
for tr in $CASES; do
    T=${tr%%:*}
    R=${tr##*:}
    if ! bytes=$(predicted "$T" "$R") || [ -z "$bytes" ]; then
        check "plan T=$T R=$R" sh -c 'cat "$1"; exit 1' sh "$TMPD/plan.json"
        continue
    fi
    if ! mib=$(measured "$T" "$R") || [ -z "$mib" ]; then
        check "dtengine T=$T R=$R" sh -c 'cat "$1"; exit 1' sh "$TMPD/engine.out"
        continue
    fi
    pred=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
    check "memory T=$T R=$R" agree "$pred" "$mib"
    awk -v t="$T" -v r="$R" -v p="$pred" -v m="$mib" 'BEGIN {
        printf "%d %d %d %.1f %.1f %+.1f\n", t, r, t / r, p, m, (p - m) / m * 100 }' \
        >>"$TMPD/table"
done

echo
echo "memory per rank, dtctl plan vs dtengine attn (H=$H Hkv=$HKV D=$D, causal zigzag)"
awk '{ printf "%8s %3s %7s %14s %13s %8s\n", $1, $2, $3, $4, $5, $6 }' "$TMPD/table"
echo
finish
