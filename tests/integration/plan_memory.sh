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
# Then training on the CPU path: `dtctl plan --kind train --gpu cpu
# --recompute none|layer` against `dtengine train --steps 1 --recompute
# none|layer` under mpirun -np R, its max RSS over ranks from GNU time's %M
# (dtengine train prints none), for tiny and a model twice as wide (dim
# 512, ffn 1536), T = 4096, R = 1, 2, 4, within 15%; and at every (model,
# R) recompute = layer must measure less than none.
#
# Then sharded training state: `--shard optimizer|gradients|parameters`
# in both, the wide model at R = 4 (where the state counts: 12.3 M
# parameters), within 15%, optimizer measuring less than none and
# gradients and parameters less than optimizer, and two cases with
# recompute = layer (bench/train_memory.sh runs the
# whole matrix, R up to 8).
#
# DT_PLAN_MEMORY_CASES overrides the attn list ("T:R T:R ..."),
# DT_PLAN_MEMORY_TRAIN_CASES the train list ("MODEL:T:R ...", MODEL tiny
# or wide; each runs with recompute none and layer),
# DT_PLAN_MEMORY_SHARD_CASES the sharded list ("MODEL:T:R:SHARD:RECOMPUTE ...").

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
TRAIN_TOL=15
TRAIN_CASES=${DT_PLAN_MEMORY_TRAIN_CASES:-"tiny:4096:1 tiny:4096:2 tiny:4096:4 wide:4096:1 wide:4096:2 wide:4096:4"}
SHARD_CASES=${DT_PLAN_MEMORY_SHARD_CASES:-"wide:4096:4:optimizer:none wide:4096:4:gradients:none wide:4096:4:parameters:none wide:4096:2:parameters:layer tiny:4096:2:gradients:layer"}

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

# agree PRED_MIB MEAS_MIB [TOL]: within TOL percent of the measurement
agree() {
    awk -v p="$1" -v m="$2" -v tol="${3:-$TOL}" 'BEGIN {
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

# ---- training, with and without recompute ------------------------------------

# model flags of MODEL (tiny, or wide: tiny's heads at twice its width)
model_flags() {
    case $1 in
    tiny) echo "--model tiny" ;;
    wide) echo "--model custom --dim 512 --layers 4 --heads 8 --kv-heads 2 --ffn 1536 --vocab 512" ;;
    *) return 1 ;;
    esac
}

# predicted_train MODEL T R RECOMPUTE [SHARD] -> bytes
predicted_train() {
    # shellcheck disable=SC2046 # the model's flags are words
    "$DTCTL" plan --json --kind train --gpu cpu $(model_flags "$1") --tokens "$2" --ranks "$3" \
        --recompute "$4" --shard "${5:-none}" >"$TMPD/plan.json" || return 1
    sed -n 's/^ *"memory_per_rank_bytes": *\([0-9][0-9]*\).*/\1/p' "$TMPD/plan.json"
}

# measured_train MODEL T R RECOMPUTE [SHARD] -> MiB, the max RSS over ranks
measured_train() {
    rm -f "$TMPD/rss"
    # shellcheck disable=SC2046
    mpirun_np "$3" "$GNU_TIME" -a -o "$TMPD/rss" -f 'maxrss_kib=%M' "$DTENGINE" train $(model_flags "$1") \
        --data recall --seq-len "$2" --steps 1 --seed 1 --recompute "$4" --shard "${5:-none}" \
        >"$TMPD/engine.out" 2>&1 || return 1
    # each rank's GNU time appends its line to one file (not the output,
    # where ranks' lines can interleave)
    sed -n 's/^maxrss_kib=\([0-9][0-9]*\)$/\1/p' "$TMPD/rss" |
        awk '$1 > m { m = $1 } END { if (m > 0) printf "%.1f", m / 1024 }'
}

# less_than A_MIB B_MIB: A (recompute = layer, or more sharding) measured
# below B
less_than() {
    awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f MiB, against %.1f MiB\n", a, b; exit !(a < b) }'
}

GNU_TIME=/usr/bin/time
if ! "$GNU_TIME" -f 'maxrss_kib=%M' true 2>&1 | grep -q '^maxrss_kib=[0-9]'; then
    echo "SKIP the train cases: no GNU time at $GNU_TIME (dtengine train reports no RSS)"
    finish
fi

printf '%s\n' "model T R recompute predicted_MiB measured_MiB error_%" >"$TMPD/ttable"
for mtr in $TRAIN_CASES; do
    M=${mtr%%:*}
    T=${mtr#*:}
    T=${T%%:*}
    R=${mtr##*:}
    none_mib=
    for RC in none layer; do
        if ! bytes=$(predicted_train "$M" "$T" "$R" "$RC") || [ -z "$bytes" ]; then
            check "plan train $M T=$T R=$R recompute=$RC" sh -c 'cat "$1"; exit 1' sh "$TMPD/plan.json"
            continue
        fi
        if ! mib=$(measured_train "$M" "$T" "$R" "$RC") || [ -z "$mib" ]; then
            check "dtengine train $M T=$T R=$R recompute=$RC" sh -c 'cat "$1"; exit 1' sh \
                "$TMPD/engine.out"
            continue
        fi
        pred=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
        check "train memory $M T=$T R=$R recompute=$RC" agree "$pred" "$mib" "$TRAIN_TOL"
        awk -v mo="$M" -v t="$T" -v r="$R" -v rc="$RC" -v p="$pred" -v m="$mib" 'BEGIN {
            printf "%s %d %d %s %.1f %.1f %+.1f\n", mo, t, r, rc, p, m, (p - m) / m * 100 }' \
            >>"$TMPD/ttable"
        if [ "$RC" = none ]; then
            none_mib=$mib
        elif [ -n "$none_mib" ]; then
            check "recompute = layer uses less: $M T=$T R=$R" less_than "$mib" "$none_mib"
        fi
    done
done

# sharded: MODEL:T:R:SHARD:RECOMPUTE; at wide R=4 recompute none each mode
# must measure less than the one before it (none: the table above)
prev_mib=$(awk '$1 == "wide" && $2 == 4096 && $3 == 4 && $4 == "none" { print $6 }' "$TMPD/ttable")
for c in $SHARD_CASES; do
    M=$(echo "$c" | cut -d: -f1)
    T=$(echo "$c" | cut -d: -f2)
    R=$(echo "$c" | cut -d: -f3)
    S=$(echo "$c" | cut -d: -f4)
    RC=$(echo "$c" | cut -d: -f5)
    if ! bytes=$(predicted_train "$M" "$T" "$R" "$RC" "$S") || [ -z "$bytes" ]; then
        check "plan train $M T=$T R=$R shard=$S recompute=$RC" sh -c 'cat "$1"; exit 1' sh "$TMPD/plan.json"
        continue
    fi
    if ! mib=$(measured_train "$M" "$T" "$R" "$RC" "$S") || [ -z "$mib" ]; then
        check "dtengine train $M T=$T R=$R shard=$S recompute=$RC" sh -c 'cat "$1"; exit 1' sh \
            "$TMPD/engine.out"
        continue
    fi
    pred=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
    check "train memory $M T=$T R=$R shard=$S recompute=$RC" agree "$pred" "$mib" "$TRAIN_TOL"
    awk -v mo="$M" -v t="$T" -v r="$R" -v rc="$RC/$S" -v p="$pred" -v m="$mib" 'BEGIN {
        printf "%s %d %d %s %.1f %.1f %+.1f\n", mo, t, r, rc, p, m, (p - m) / m * 100 }' \
        >>"$TMPD/ttable"
    # optimizer under none, gradients under optimizer, parameters under
    # optimizer too: at this shape a layer is a quarter of the model, so
    # parameters' two units in flight cost at R = 4 what sharding the
    # weights saves, and it only pulls ahead of gradients at more ranks
    # (bench/train_memory.sh)
    if [ "$M:$T:$R:$RC" = "wide:4096:4:none" ] && [ -n "$prev_mib" ]; then
        check "shard = $S measures less than the mode it is checked against: wide R=4" \
            less_than "$mib" "$prev_mib"
        [ "$S" = gradients ] || prev_mib=$mib
    fi
done

echo
echo "memory per rank, dtctl plan vs dtengine train (one step, recall task)"
awk '{ printf "%6s %6s %3s %9s %14s %13s %8s\n", $1, $2, $3, $4, $5, $6, $7 }' "$TMPD/ttable"
echo
finish
