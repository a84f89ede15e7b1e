#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Peak memory per rank of `dtengine train` against the planner, for every
# shard mode (none, optimizer, gradients, parameters) x recompute (none,
# layer) x R ranks (1, 2, 4, 8), on two shapes: tiny (dim 256, 4 layers,
# ffn 768, vocab 512: activations dominate) and wide (dim 512, 4 layers,
# ffn 1536, vocab 512, 12.3 M parameters: the training state counts).
# Measured: the max RSS over the ranks (GNU time's %M) of one step on the
# recall task, T tokens, under mpirun -np R. Predicted: `dtctl plan --kind
# train --gpu cpu --json` with the same model, tokens, ranks, shard and
# recompute (memory_per_rank_bytes). The baseline is the planner, run side
# by side; the table prints both and the error. Asserts nothing (the CI
# check is tests/integration/plan_memory.sh, a subset of these cases at
# 15%); the last line counts the cases within 15%.
#
# DT_BENCH_T (default 4096), DT_BENCH_RANKS ("1 2 4 8"), DT_BENCH_MODELS
# ("tiny wide"), DT_BENCH_SHARDS ("none optimizer gradients parameters"),
# DT_BENCH_RECOMPUTE ("none layer"), DT_BENCH_DP (1; with 2 the job runs
# 2 R ranks as 2 rings).
set -eu
top=${DT_BUILDDIR:-$(cd "$(dirname "$0")/.." && pwd)}
MPIRUN=${MPIRUN:-mpirun}
T=${DT_BENCH_T:-4096}
RANKS=${DT_BENCH_RANKS:-1 2 4 8}
MODELS=${DT_BENCH_MODELS:-tiny wide}
SHARDS=${DT_BENCH_SHARDS:-none optimizer gradients parameters}
RECOMPUTE=${DT_BENCH_RECOMPUTE:-none layer}
DP=${DT_BENCH_DP:-1}
DPFLAG=
[ "$DP" = 1 ] || DPFLAG="--dp $DP"
GNU_TIME=/usr/bin/time
if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

model_flags() {
    case $1 in
    tiny) echo "--model tiny" ;;
    wide) echo "--model custom --dim 512 --layers 4 --heads 8 --kv-heads 2 --ffn 1536 --vocab 512" ;;
    esac
}

predicted() { # MODEL R SHARD RECOMPUTE -> MiB
    # shellcheck disable=SC2046 # the model's flags are words
    "$top/cli/dtctl" plan --json --kind train --gpu cpu $(model_flags "$1") --tokens "$T" \
        --ranks "$2" --shard "$3" --recompute "$4" $DPFLAG >"$tmp/plan.json" 2>&1 ||
        { echo "?"; return 0; }
    sed -n 's/^ *"memory_per_rank_bytes": *\([0-9.e+]*\).*/\1/p' "$tmp/plan.json" |
        awk '{ printf "%.1f", $1 / 1048576 }'
}

measured() { # MODEL R SHARD RECOMPUTE -> MiB, the max over ranks
    rm -f "$tmp/rss"
    # shellcheck disable=SC2046
    "$MPIRUN" --oversubscribe --mca pml ob1 --mca btl self,vader -np $(($2 * DP)) \
        "$GNU_TIME" -a -o "$tmp/rss" -f 'maxrss_kib=%M' "$top/engine/dtengine" train $(model_flags "$1") \
        --data recall --seq-len "$T" --steps 1 --seed 1 --shard "$3" --recompute "$4" \
        --dp "$DP" >"$tmp/engine.out" 2>&1 || {
        # the reason, below the table
        { printf '%s R=%s shard=%s recompute=%s failed:\n' "$1" "$2" "$3" "$4"
          tail -n 5 "$tmp/engine.out"; } >>"$tmp/failures"
        echo "?"
        return 0
    }
    # each rank's GNU time appends its line to one file (not the output,
    # where ranks' lines can interleave)
    sed -n 's/^maxrss_kib=\([0-9][0-9]*\)$/\1/p' "$tmp/rss" |
        awk '$1 > m { m = $1 } END { if (m > 0) printf "%.1f", m / 1024; else print "?" }'
}

printf 'peak memory per rank: dtengine train (one step, T=%s, dp=%s) against dtctl plan\n' "$T" "$DP"
printf '%-5s %2s %-10s %-9s | %13s %12s %8s\n' model R shard recompute "planned MiB" \
    "measured MiB" "error"
n=0
ok=0
for m in $MODELS; do
    for r in $RANKS; do
        for s in $SHARDS; do
            for rc in $RECOMPUTE; do
                p=$(predicted "$m" "$r" "$s" "$rc")
                x=$(measured "$m" "$r" "$s" "$rc")
                e=$(awk -v p="$p" -v x="$x" 'BEGIN {
                    if (p == "?" || x == "?") print "?"; else printf "%+.1f%%", (p - x) / x * 100 }')
                n=$((n + 1))
                case $e in
                \?) ;;
                *) awk -v e="${e%\%}" 'BEGIN { exit !(e >= -15 && e <= 15) }' && ok=$((ok + 1)) ;;
                esac
                printf '%-5s %2s %-10s %-9s | %13s %12s %8s\n' "$m" "$r" "$s" "$rc" "$p" "$x" "$e"
            done
        done
    done
done
printf '%d of %d cases within 15%% of the plan\n' "$ok" "$n"
[ ! -s "$tmp/failures" ] || cat "$tmp/failures"
