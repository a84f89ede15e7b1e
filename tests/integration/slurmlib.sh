#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Helpers for the integration scripts that need a real Slurm cluster;
# sourced after lib.sh (and after coordlib.sh when a script uses both),
# never run. `slurm_up NODES PORT [dt-cluster flags]` starts a private
# cluster with contrib/slurm/dt-cluster in $TMPD/cluster (slurmctld on
# PORT, slurmd on PORT+1..PORT+NODES), points this shell at it (SLURM_CONF,
# DT_MUNGE_SOCKET) and makes sure it is taken down at exit, before lib.sh
# removes $TMPD. The script is skipped (exit 77, saying what is missing)
# without root, munge or Slurm. Waits poll with a bound. Not here: the
# checks themselves, or anything dt-specific.

DT_CLUSTER=$DT_SRCDIR/contrib/slurm/dt-cluster
SLURM_DIR=

[ "$(id -u)" = 0 ] ||
    skip "needs root: slurmd runs jobs as their owners, and dt-cluster starts it (run as root)"
for _sl_bin in munged munge unmunge slurmctld slurmd sbatch srun squeue scontrol sinfo scancel; do
    command -v "$_sl_bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$_sl_bin" ] ||
        skip "$_sl_bin is not installed (apt-get install slurm-wlm munge)"
done
[ -x "$DT_CLUSTER" ] || die "$DT_CLUSTER is missing or not executable"
PATH=$PATH:/usr/sbin:/sbin
export PATH

# The exit trap of lib.sh (and coordlib.sh) removes $TMPD; the cluster's
# daemons must be stopped first, while their pid files are still there.
if command -v dt_exit_cleanup >/dev/null 2>&1; then
    trap 'slurm_down; dt_exit_cleanup; rm -rf "$TMPD"' EXIT
else
    trap 'slurm_down; rm -rf "$TMPD"' EXIT
fi

# slurm_up NODES PORT [FLAGS...]: a cluster of NODES nodes in $TMPD/cluster;
# FLAGS go to `dt-cluster up` (--cpus C, --prolog, --epilog, ...). When
# the ports are taken, the next bases (PORT+20, PORT+40) are tried.
# Dies (exit 99) with dt-cluster's message when it does not come up.
slurm_up() {
    _su_nodes=$1 _su_port=$2
    shift 2
    # a test run inside a Slurm job must not talk about that job here
    for _su_v in $(env | sed -n 's/^\(SLURM_[A-Za-z0-9_]*\)=.*/\1/p'); do
        unset "$_su_v"
    done
    # munged wants the directories above its socket searchable by all
    chmod 0755 "$TMPD" || die "cannot chmod $TMPD"
    SLURM_DIR=$TMPD/cluster
    for _su_try in 1 2 3; do
        if "$DT_CLUSTER" up "$SLURM_DIR" --nodes "$_su_nodes" --port "$_su_port" "$@" \
            >"$TMPD/slurm-up.out" 2>&1; then
            break
        fi
        if [ "$_su_try" -lt 3 ] && grep -q 'is in use' "$TMPD/slurm-up.out"; then
            _su_port=$((_su_port + 20))
            continue
        fi
        sed 's/^/    /' "$TMPD/slurm-up.out"
        die "dt-cluster up failed (output above)"
    done
    # shellcheck disable=SC2034 # for the scripts: the controller's port
    SLURM_PORT=$_su_port
    # shellcheck disable=SC1091
    . "$SLURM_DIR/env"
}

# slurm_down: take the cluster down (every job cancelled, every daemon
# gone); safe to call again, and when slurm_up never ran
slurm_down() {
    [ -n "$SLURM_DIR" ] && [ -f "$SLURM_DIR/slurm.conf" ] || return 0
    "$DT_CLUSTER" down "$SLURM_DIR" >"$TMPD/slurm-down.out" 2>&1 ||
        sed 's/^/    slurm_down: /' "$TMPD/slurm-down.out"
    return 0
}

# job_field JOBID FIELD: one field of `scontrol show job` (JobState,
# NodeList, Restarts, ExitCode, Reason, ...); empty when the job is unknown
job_field() {
    scontrol -o show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

# node_state NODE: its state as sinfo prints it (idle, alloc, drain, ...)
node_state() {
    sinfo -h -N -n "$1" -o '%t' 2>/dev/null | head -n 1
}

# node_reason NODE: why it is drained or down ("" when it is not)
node_reason() {
    sinfo -h -R -n "$1" -o '%E' 2>/dev/null | head -n 1
}

# slurm_wait_state JOBID STATE TIMEOUT_S: poll until the job's state
# matches the ERE STATE (anchored: "COMPLETED", "PENDING|RUNNING"); 1 on
# timeout, saying what the state was
slurm_wait_state() {
    _sw_n=$(($3 * 5))
    while [ "$_sw_n" -gt 0 ]; do
        _sw_st=$(job_field "$1" JobState)
        echo "$_sw_st" | grep -q -x -E "$2" && return 0
        sleep 0.2
        _sw_n=$((_sw_n - 1))
    done
    echo "job $1 is ${_sw_st:-unknown to slurmctld}, not $2, after $3 s" \
        "(reason: $(job_field "$1" Reason))"
    return 1
}

# slurm_wait_node NODE STATE TIMEOUT_S: the same for a node's sinfo state
slurm_wait_node() {
    _sn_n=$(($3 * 5))
    while [ "$_sn_n" -gt 0 ]; do
        _sn_st=$(node_state "$1")
        echo "$_sn_st" | grep -q -x -E "$2" && return 0
        sleep 0.2
        _sn_n=$((_sn_n - 1))
    done
    echo "node $1 is ${_sn_st:-unknown}, not $2, after $3 s (reason: $(node_reason "$1"))"
    return 1
}

# slurm_submit ARGS...: sbatch --parsable ARGS; JOBID is set, or the test
# dies
slurm_submit() {
    if ! JOBID=$(sbatch --parsable "$@" 2>"$TMPD/sbatch.err") || [ -z "$JOBID" ]; then
        sed 's/^/    /' "$TMPD/sbatch.err"
        die "sbatch $* failed (output above)"
    fi
    JOBID=${JOBID%%;*}
}
