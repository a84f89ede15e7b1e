#!/bin/sh
# SPDX-License-Identifier: MIT
#
# dt's node health checks (contrib/slurm/prolog.sh and epilog.sh) as the
# Prolog and Epilog of a real two-node Slurm cluster on this host
# (dt-cluster --prolog --epilog, ports from 17500):
#   - healthy: a job on both nodes runs and completes; nothing is logged;
#   - a failing check (too little free space, then a failing site command)
#     keeps a job off the node: the node is drained with a "dt-prolog: ..."
#     reason that sinfo -R and scontrol show; a job pinned to it waits, and
#     runs there once health.conf is fixed and the node resumed; a job that
#     may go elsewhere is requeued (not held) and completes on the other;
#   - the epilog kills a dtengine the job left running (and not one of
#     another cluster's job with the same id), removes the agent's state
#     directory of the dt job and stale Open MPI segments (not fresh ones),
#     and drains the node with "dt-epilog: ..." when a check fails after
#     the job.
# Not here: dt's own jobs under Slurm (dtcoordd), timings.

. "$(dirname "$0")/lib.sh"
. "$DT_TESTDIR/slurmlib.sh"

slurm_up 2 17500 --cpus 2 --prolog --epilog
HCONF=$SLURM_DIR/health.conf
HLOG=$SLURM_DIR/log/health.log
cp "$HCONF" "$TMPD/health.base" || die "dt-cluster wrote no $HCONF"
mkdir -p "$TMPD/shm" "$TMPD/agents" "$TMPD/out" || die "cannot create directories"
chmod 0777 "$TMPD/out"

# health LINES...: health.conf = what dt-cluster wrote, this test's
# private directories, and LINES
health() {
    {
        cat "$TMPD/health.base"
        echo "DT_HEALTH_SHM_DIR=$TMPD/shm"
        echo "DT_HEALTH_AGENT_ROOT=$TMPD/agents"
        for _h_l in "$@"; do
            echo "$_h_l"
        done
    } >"$HCONF"
}
health

cat >"$TMPD/hello.sh" <<'EOF'
#!/bin/sh
echo "ran on $SLURMD_NODENAME"
EOF

# ran_on JOBID NODE: the job's output says it ran on NODE
ran_on() {
    grep -q "^ran on $2\$" "$TMPD/out/$1.out" && return 0
    echo "job $1 output:"
    sed 's/^/  | /' "$TMPD/out/$1.out" 2>/dev/null
    return 1
}
field_is() { # JOBID FIELD VALUE
    _fi=$(job_field "$1" "$2")
    [ "$_fi" = "$3" ] && return 0
    echo "job $1: $2=$_fi, expected $3"
    return 1
}
reason_is() { # NODE ERE
    _ri=$(node_reason "$1")
    echo "$_ri" | grep -q -E -e "$2" && { echo "$_ri"; return 0; }
    echo "node $1 reason '$_ri', expected /$2/"
    return 1
}
never_ran() {
    [ ! -s "$TMPD/out/$1.out" ] || ! grep -q '^ran on' "$TMPD/out/$1.out" && return 0
    echo "job $1 ran: $(cat "$TMPD/out/$1.out")"
    return 1
}

# ---- healthy ----------------------------------------------------------------

slurm_submit -N2 -o "$TMPD/out/%j.out" "$TMPD/hello.sh"
check "healthy: a job on both nodes completes" slurm_wait_state "$JOBID" COMPLETED 30
check "healthy: its exit code is 0:0" field_is "$JOBID" ExitCode 0:0
check "healthy: n1 stays idle" slurm_wait_node n1 idle 5
check "healthy: n2 stays idle" slurm_wait_node n2 idle 5
check "healthy: nothing logged by the checks" test ! -s "$HLOG"

# ---- a failing check keeps jobs off the node ------------------------------------

# the free space check, on n1 only (health.conf is shell: it may look at
# the node's name)
# shellcheck disable=SC2016
health '[ "$SLURMD_NODENAME" = n1 ] && DT_HEALTH_MIN_TMP_MB=99999999'
slurm_submit -N1 -w n1 -o "$TMPD/out/%j.out" "$TMPD/hello.sh"
pinned=$JOBID
check "too little space: n1 is drained" slurm_wait_node n1 'drain|drng' 30
check "too little space: sinfo -R gives the dt-prolog reason" \
    reason_is n1 '^dt-prolog: /tmp has [0-9]+ MiB free, less than 99999999 MiB$'
node_has() { # NODE ERE: a line of `scontrol show node NODE` matches
    scontrol show node "$1" >"$TMPD/node.out" 2>&1
    grep -q -E -e "$2" "$TMPD/node.out" && return 0
    echo "scontrol show node $1 lacks /$2/:"
    sed 's/^/  | /' "$TMPD/node.out"
    return 1
}
check "too little space: scontrol show node gives it too" \
    node_has n1 'Reason=dt-prolog: /tmp has [0-9]+ MiB free'
check "too little space: the job pinned to n1 is requeued and waits (not held)" \
    slurm_wait_state "$pinned" PENDING 10
check "too little space: it was requeued once" field_is "$pinned" Restarts 1
check "too little space: the epilog after the failed prolog kept the reason" \
    grep -q "node=n1 job=$pinned dt-epilog: already drained, reason kept: dt-prolog: /tmp has" \
    "$HLOG"
check "too little space: and did not run" never_ran "$pinned"
check "too little space: the failure is in the health log" \
    grep -q "node=n1 job=$pinned dt-prolog: /tmp has" "$HLOG"
check "too little space: n2 is not drained" slurm_wait_node n2 idle 1

# fixed and resumed: the job runs where it asked to
health
scontrol update nodename=n1 state=resume || die "scontrol update state=resume failed"
check "fixed and resumed: n1 is idle or running the job" slurm_wait_node n1 'idle|mix|alloc' 10
check "fixed and resumed: the waiting job completes" slurm_wait_state "$pinned" COMPLETED 60
check "fixed and resumed: on n1" ran_on "$pinned" n1

# a site command failing on n1: a job that may run anywhere is requeued
# and runs on n2 (slurmctld tries n1, the first node, first)
# shellcheck disable=SC2016
health '[ "$SLURMD_NODENAME" = n1 ] && DT_HEALTH_CMD="echo gpu0 fell off the bus; exit 1"'
slurm_submit -N1 -o "$TMPD/out/%j.out" "$TMPD/hello.sh"
free=$JOBID
check "site command fails: n1 is drained" slurm_wait_node n1 'drain|drng' 30
check "site command fails: with its output as the reason" \
    reason_is n1 '^dt-prolog: DT_HEALTH_CMD failed \(exit 1\): gpu0 fell off the bus$'
check "site command fails: the job is requeued and completes" slurm_wait_state "$free" COMPLETED 60
check "site command fails: on n2" ran_on "$free" n2
health
scontrol update nodename=n1 state=resume || die "scontrol update state=resume failed"
check "resumed: n1 is idle" slurm_wait_node n1 idle 10

# ---- the epilog cleans up -----------------------------------------------------

cp /bin/sleep "$TMPD/dtengine" || die "cannot copy /bin/sleep"
# what a dt job (dt job 42 as dtcoordd names it) may leave: its agent's
# state directory and Open MPI segments of dead ranks
mkdir -p "$TMPD/agents/dtagentd-0/42-n1/gen.x" "$TMPD/agents/dtagentd-0/43-n1"
: >"$TMPD/shm/vader_segment.n1.1a2b.0"
touch -d '1 minute ago' "$TMPD/shm/vader_segment.n1.1a2b.0"
: >"$TMPD/shm/vader_segment.n1.fresh.0"
cat >"$TMPD/leave.sh" <<EOF
#!/bin/sh
# a dtengine that outlives the job, and one that claims another cluster
setsid sh -c 'echo \$\$ >"$TMPD/left.pid"; exec "$TMPD/dtengine" 300' </dev/null >/dev/null 2>&1 &
SLURM_CLUSTER_NAME=elsewhere \
    setsid sh -c 'echo \$\$ >"$TMPD/decoy.pid"; exec "$TMPD/dtengine" 300' </dev/null >/dev/null 2>&1 &
n=0
while { [ ! -s "$TMPD/left.pid" ] || [ ! -s "$TMPD/decoy.pid" ]; } && [ \$n -lt 100 ]; do
    sleep 0.1
    n=\$((n + 1))
done
echo "ran on \$SLURMD_NODENAME"
EOF
touch "$TMPD/shm/vader_segment.n1.fresh.0"
# named as dtcoordd names the Slurm job of dt job 42: dt-JOB.TAG-NAME
slurm_submit -N1 -w n1 -J dt-42.miezlbp7-demo -o "$TMPD/out/%j.out" "$TMPD/leave.sh"
check "epilog: the job completes" slurm_wait_state "$JOBID" COMPLETED 30
left=$(cat "$TMPD/left.pid" 2>/dev/null)
decoy=$(cat "$TMPD/decoy.pid" 2>/dev/null)
if [ -z "$left" ] || [ -z "$decoy" ]; then
    die "the job did not start its leftovers"
fi
gone() { ! kill -0 "$1" 2>/dev/null; }
wait_gone() {
    _wg=50
    while [ "$_wg" -gt 0 ]; do
        gone "$1" && return 0
        sleep 0.2
        _wg=$((_wg - 1))
    done
    echo "pid $1 still there: $(tr '\0' ' ' <"/proc/$1/cmdline")"
    return 1
}
check "epilog: the leftover dtengine is gone" wait_gone "$left"
# the epilog has finished once n1 is idle again
slurm_wait_node n1 idle 20 >/dev/null
check "epilog: the kill is logged" \
    grep -q "node=n1 job=$JOBID dt-epilog: killing leftover dtengine pid=$left" "$HLOG"
check "epilog: another cluster's dtengine with the same job id is left alone" \
    sh -c "kill -0 '$decoy' && [ \"\$(cat /proc/$decoy/comm)\" = dtengine ]"
kill "$decoy" 2>/dev/null
check "epilog: the agent state directory of dt job 42 on n1 is removed" \
    test ! -e "$TMPD/agents/dtagentd-0/42-n1"
check "epilog: dt job 43's is kept" test -d "$TMPD/agents/dtagentd-0/43-n1"
check "epilog: a stale Open MPI segment is removed" test ! -e "$TMPD/shm/vader_segment.n1.1a2b.0"
check "epilog: a fresh one is kept" test -e "$TMPD/shm/vader_segment.n1.fresh.0"

# a check that fails only after the job: the epilog drains the node
# shellcheck disable=SC2016
health '[ "$SLURM_SCRIPT_CONTEXT" = epilog_slurmd ] && DT_HEALTH_CMD="echo ecc errors; exit 1"'
slurm_submit -N1 -w n2 -o "$TMPD/out/%j.out" "$TMPD/hello.sh"
check "epilog check fails: the job itself completes" slurm_wait_state "$JOBID" COMPLETED 30
check "epilog check fails: on n2" ran_on "$JOBID" n2
check "epilog check fails: n2 is drained" slurm_wait_node n2 'drain|drng' 10
check "epilog check fails: with the dt-epilog reason" \
    reason_is n2 '^dt-epilog: DT_HEALTH_CMD failed \(exit 1\): ecc errors$'
health

finish
