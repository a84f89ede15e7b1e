#!/bin/sh
# SPDX-License-Identifier: MIT
#
# The recall task's learning curve for the embedded default job, the one
# `dtctl run --local` runs (its spec from `dtctl run --local --print-spec`):
# a 2-layer LLaMA-3 shape (dim 128, 4 heads, 2 kv heads), 1024 tokens in the
# zigzag layout over 4 ranks, 2 sequences a step, 16 keys and 16 values, 4
# pairs planted 40% into each sequence and 4 queries at its end. Under
# zigzag (chunks r and 2R-1-r on rank r) the pairs lie in chunk 3 of 8, on
# rank 3, and the answers at the end, on rank 0, so an
# answer is right only through attention across rank boundaries. Here the
# job runs under mpirun (the same ranks and arithmetic as under the agents,
# which recovery.sh checks bit for bit). Every DT_BENCH_EVERY steps the
# table gives the loss and recall accuracy averaged over the last
# DT_BENCH_WINDOW steps (8 answers a step). The baseline row is chance:
# recall 1/16, loss ln 16 over the answers. Asserts nothing. About 2 minutes
# on 2 cores.
set -eu
top=${DT_BUILDDIR:-$(cd "$(dirname "$0")/.." && pwd)}
MPIRUN=${MPIRUN:-mpirun}
R=${DT_BENCH_RANKS:-4}
EVERY=${DT_BENCH_EVERY:-50}
WINDOW=${DT_BENCH_WINDOW:-50}
if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM

"$top/cli/dtctl" run --local --print-spec >"$tmp/job.spec"
printf 'recall accuracy of the embedded default job on %s ranks (dtctl run --local --print-spec):\n' "$R"
sed 's/^/    /' "$tmp/job.spec"
printf 'mean over the last %s steps (%s answers); chance = 1/16\n\n' "$WINDOW" $((8 * WINDOW))
"$MPIRUN" --oversubscribe --mca pml ob1 --mca btl self,vader -np "$R" \
    "$top/engine/dtengine" train --spec "$tmp/job.spec" >"$tmp/out"
printf '| %6s | %8s | %8s |\n' step loss recall
printf '|---:|---:|---:|\n'
printf '| %6s | %8.3f | %8.4f |\n' chance "$(awk 'BEGIN { print log(16) }')" \
    "$(awk 'BEGIN { print 1 / 16 }')"
awk -v E="$EVERY" -v W="$WINDOW" '$1 == "step" {
    s = $2; l[s % W] = $4; a[s % W] = $8
    if ((s + 1) % E == 0 && s + 1 >= W) {
        L = 0; A = 0
        for (i = 0; i < W; i++) { L += l[i]; A += a[i] }
        printf "| %6d | %8.3f | %8.4f |\n", s + 1, L / W, A / W
    }
}' "$tmp/out"
grep '^result:' "$tmp/out"
