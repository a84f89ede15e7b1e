#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Ring communication hidden behind compute: runs bench/bench_ring under
# mpirun with 2 ranks (one per core on a 2-core machine; more ranks than
# cores would measure the scheduler, not the overlap), non-causal and causal
# zigzag. Each table compares against the same transfers with no compute,
# measured in the same run. Prints tables; asserts nothing.
set -eu
top=${DT_BUILDDIR:-$(cd "$(dirname "$0")/.." && pwd)}
MPIRUN=${MPIRUN:-mpirun}
R=${DT_BENCH_RANKS:-2}
if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
run() {
    "$MPIRUN" --oversubscribe --mca pml ob1 --mca btl self,vader -np "$R" \
        "$top/bench/bench_ring" "$@"
}
run
echo
run --causal
