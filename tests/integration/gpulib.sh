#!/bin/sh
# SPDX-License-Identifier: MIT
#
# What the scripts on simulated GPUs share (gpu_sim.sh: attn, prefill and
# jobs through the agents; gpu_train.sh: training), sourced after lib.sh:
# tests/gpu/dtengine-sim (dtengine built against the host simulator of the
# CUDA runtime, NCCL and the kernels, tests/gpu/sim; a script skips where
# it is not built), dtctl and dtagentd, an environment without the
# caller's DT_* and CUDA_VISIBLE_DEVICES, and the helpers below.
need_mpirun

SIM=$DT_BUILDDIR/tests/gpu/dtengine-sim
DTCTL=$DT_BUILDDIR/cli/dtctl
DTAGENTD=$DT_BUILDDIR/agent/dtagentd
[ -x "$SIM" ] || skip "$SIM is not built (configure found no CUDA toolkit)"
[ -x "$DTAGENTD" ] && [ -x "$DTCTL" ] || die "dtagentd and dtctl are not built"
unset DT_COORDD DT_AGENTD DT_ENGINE DT_SOCKET DT_COORD CUDA_VISIBLE_DEVICES DT_SIM_GPUS

# on cpu|gpu R LOG COMMAND ARGS...: dtengine COMMAND ARGS on R ranks, on the
# CPU or on simulated GPUs (--device cuda), its output in LOG
on() {
    _dev=$1 _r=$2 _log=$3 _cmd=$4
    shift 4
    if [ "$_dev" = gpu ]; then
        set -- env DT_SIM_GPUS=1 "$SIM" "$_cmd" --device cuda "$@"
    else
        set -- "$DTENGINE" "$_cmd" "$@"
    fi
    mpirun_np "$_r" "$@" >"$_log" 2>&1 || { cat "$_log"; return 1; }
}

# job_local SPEC REF DIR ARGS...: the job of SPEC through agents on
# simulated GPUs (2 per agent), state in DIR; completes with checksum REF
# (the direct run's)
job_local() {
    _js=$1 _jr=$2 _jd=$3
    shift 3
    run_rc 0 env DT_ENGINE="$SIM" DT_SIM_GPUS=2 "$DTCTL" run --local "$_js" \
        --state-dir "$_jd" --interval 250ms "$@" || return 1
    [ -n "$_jr" ] && out_has "^result: job=1 state=completed loss=[0-9.]+ checksum=$_jr\$" ||
        { echo "direct run: '$_jr'"; return 1; }
}

# a run's parameters digest, and its largest simulated device or host
# memory peak over the ranks (DT_SIM_MEMSTAT), from its log
result_sha() { sed -n 's/^result: .*params_sha256=\([0-9a-f]*\) .*/\1/p' "$1"; }
peak_of() { sed -n "s/^sim: $1 memory peak \([0-9]*\) bytes\$/\1/p" "$2" | sort -n | tail -n 1; }

# same_less LABEL A.log B.log: B trained to A's parameters to the bit in
# a smaller simulated device peak (what offload and recompute promise)
same_less() {
    _sa=$(result_sha "$2")
    _sb=$(result_sha "$3")
    _pa=$(peak_of device "$2")
    _pb=$(peak_of device "$3")
    echo "$1: $_sb (reference $_sa), device peak $_pb bytes (reference $_pa)"
    [ -n "$_sa" ] && [ "$_sa" = "$_sb" ] && [ "$_pb" -lt "$_pa" ]
}

# oom_local SPEC DIR BYTES: the job of SPEC through agents on simulated
# GPUs of BYTES each fails as deterministic (exit 7), the event naming the
# node, the GPU and CUDA's words
oom_local() {
    run_rc 7 env DT_ENGINE="$SIM" DT_SIM_GPUS=2 DT_SIM_GPU_MEMORY="$3" "$DTCTL" run --local \
        "$1" --state-dir "$2" --interval 250ms || return 1
    out_has "^job 1 [a-z-]+ failed\$" || return 1
    sqlite3 "$2/dt.db" "SELECT detail FROM events WHERE kind = 'deterministic_failure'" |
        grep -E "on local[12] \(GPU-d7510000-[0-9a-f-]+\) exited with status 1 .*cudaMalloc.*out of memory" ||
        { sqlite3 "$2/dt.db" "SELECT kind, detail FROM events"; return 1; }
}
