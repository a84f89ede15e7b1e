#!/bin/sh
# SPDX-License-Identifier: MIT
#
# A job of an unprivileged user under a root coordinator, end to end, and
# the ways that user could try to turn the coordinator against the system
# (issue 14). dtcoordd runs as root; the user nobody submits a training job
# and runs its two agents (as a Slurm batch job of nobody would). Checked:
# the job runs and commits its checkpoints; its directory and files belong
# to nobody with modes that give others nothing, and the coordinator's own
# files give others nothing either; the commit markers are written by
# nobody's agents, so a symbolic link nobody plants where a marker or its
# temporary file goes never lets root write through it; a ckpt_dir inside a
# root-only directory is not created by root; root's agents may not run
# nobody's job. Needs root (it runs commands as nobody).

. "$(dirname "$0")/lib.sh"
. "$DT_TESTDIR/coordlib.sh"

[ "$(id -u)" = 0 ] || skip "needs root (it runs a coordinator as root and jobs as nobody)"
need_nobody

DTAGENTD=$DT_BUILDDIR/agent/dtagentd
[ -x "$DTAGENTD" ] || die "$DTAGENTD is not built"

umask 022
chmod 0755 "$TMPD" || die "cannot chmod $TMPD"
munge_start
COORD_CONF_EXTRA="log_file = $TMPD/coord/state/dtcoordd.log"
coord_setup
coord_start || die "dtcoordd did not start"

# nctl ARGS...: dtctl as nobody on the Unix socket
nctl() {
    as_nobody "$DTCTL" --socket "$COORD_SOCK" "$@"
}

# nagent NAME SLOTS JOB: one of nobody's agents, in the background
mkdir -p "$TMPD/nagents" && chown nobody "$TMPD/nagents" || die "cannot make the agents' dir"
AGENT_PIDS=
nagent() {
    as_nobody "$DTAGENTD" --coord "unix:$COORD_SOCK" --job "$3" --node "$1" --slots "$2" \
        --state-dir "$TMPD/nagents/$3-$1" --hang-timeout 5s --grace 1s \
        >"$TMPD/agent-$3-$1.log" 2>&1 &
    track $!
    AGENT_PIDS="$AGENT_PIDS $!"
}

# mode_owner PATH: "MODE USER"
mode_owner() {
    stat -c '%a %U' "$1"
}
expect_mode() { # PATH MODE USER
    _mo=$(mode_owner "$1") || return 1
    [ "$_mo" = "$2 $3" ] || { echo "$1: $_mo, want $2 $3"; return 1; }
    echo "$1: $_mo"
}

{
    small_job_spec
    echo "nodes = 2"
    echo "gpus_per_node = 2"
} >"$TMPD/job.spec"

# ---- the coordinator's own files ---------------------------------------------------
t_coord_files() {
    expect_mode "$COORD_STATE" 711 root &&
        expect_mode "$COORD_STATE/dt.db" 600 root &&
        expect_mode "$COORD_STATE/dt.db-wal" 600 root &&
        expect_mode "$COORD_STATE/dt.db-shm" 600 root &&
        expect_mode "$COORD_STATE/dtcoordd.log" 600 root &&
        expect_mode "$COORD_STATE/jobs" 711 root &&
        expect_mode "$COORD_SOCK" 666 root
}
check "dtcoordd's state: database, journal and log 0600, directories 0711" t_coord_files
t_nobody_cannot_read() {
    for _f in dt.db dt.db-wal dtcoordd.log; do
        if as_nobody cat "$COORD_STATE/$_f" >/dev/null 2>&1; then
            echo "nobody read $_f"
            return 1
        fi
    done
    ! as_nobody ls "$COORD_STATE" >/dev/null 2>&1 || { echo "nobody listed the state dir"; return 1; }
}
check "nobody can neither read the database nor list the state directory" t_nobody_cannot_read

# ---- a job of nobody's, end to end --------------------------------------------------
J=$(nctl submit "$TMPD/job.spec" --json | json_num id | head -n 1)
check "nobody submits a training job" test -n "$J"
JD=$COORD_STATE/jobs/$J
nagent n0 2 "$J"
nagent n1 2 "$J"
finish_job "$J"
check "nobody's job on nobody's agents completed" completed "$J"
t_committed() {
    run_rc 0 nctl checkpoints "$J" && out_has "committed"
}
check "its checkpoints were committed" t_committed
check "its directory is nobody's, mode 700" expect_mode "$JD" 700 nobody
t_job_files() {
    _n=0
    for _d in "$JD/ckpt"/step-*; do
        [ -d "$_d" ] || continue
        expect_mode "$_d" 700 nobody >/dev/null || { expect_mode "$_d" 700 nobody; return 1; }
        for _f in "$_d"/*; do
            expect_mode "$_f" 600 nobody >/dev/null || { expect_mode "$_f" 600 nobody; return 1; }
        done
        _n=$((_n + 1))
    done
    [ "$_n" -ge 1 ] || { echo "no step directory under $JD/ckpt"; return 1; }
    expect_mode "$JD/logs/rank-0.log" 600 nobody >/dev/null || return 1
    _root=$(find "$JD" -user root | head -n 3)
    [ -z "$_root" ] || { echo "root owns: $_root"; return 1; }
    echo "$_n step directories, every file 600 and nobody's"
}
check "checkpoints, markers and rank logs are nobody's, 700/600, none root's" t_job_files

# ---- planted links: the commit marker is never written through them -------------------
# nobody keeps planting links to a root-only file at the marker's
# temporary names (dtcoordd's pid and the agents'), in every new step
# directory of a ckpt_dir nobody owns. Whoever writes the marker must not
# write through them; the agents are nobody, so nothing root's can change.
printf 'root-secret\n' >"$TMPD/secret" && chmod 600 "$TMPD/secret"
mkdir -p "$TMPD/nck/ckpt" && chown -R nobody "$TMPD/nck"
sed "s|^seed = 3\$|seed = 3\nckpt_dir = $TMPD/nck/ckpt|" "$TMPD/job.spec" >"$TMPD/planted.spec"
J2=$(nctl submit "$TMPD/planted.spec" --json | json_num id | head -n 1)
nagent n0 2 "$J2"
nagent n1 2 "$J2"
cat >"$TMPD/plant.sh" <<EOF
echo \$\$ >$TMPD/nck/planter.pid
while :; do
    for d in $TMPD/nck/ckpt/step-*; do
        [ -d "\$d" ] || continue
        for p in $COORD_PID \$(pgrep -f "$DTAGENTD .*--job $J2 " | tr '\n' ' '); do
            ln -s $TMPD/secret "\$d/.COMMITTED.tmp.\$p" 2>/dev/null
        done
    done
done
EOF
as_nobody sh "$TMPD/plant.sh" &
PLANTER_SH=$!
wait_for 10 test -s "$TMPD/nck/planter.pid" || die "the planting loop did not start"
PLANTER=$(cat "$TMPD/nck/planter.pid")
track "$PLANTER"
finish_job "$J2"
kill "$PLANTER" 2>/dev/null
wait_for 10 dead "$PLANTER"
wait "$PLANTER_SH" 2>/dev/null
untrack "$PLANTER"
t_secret() {
    [ "$(cat "$TMPD/secret")" = root-secret ] || { echo "secret now: $(cat "$TMPD/secret")"; return 1; }
    expect_mode "$TMPD/secret" 600 root
}
check "planted links: the root-only file is untouched" t_secret
t_planted_ran() {
    ls -a "$TMPD/nck/ckpt"/step-* 2>/dev/null | grep -q '^\.COMMITTED\.tmp\.' ||
        { echo "no link was planted: the check proves nothing"; return 1; }
    _root=$(find "$TMPD/nck" -user root | head -n 3)
    [ -z "$_root" ] || { echo "root owns: $_root"; return 1; }
    echo "links planted; nothing under the ckpt_dir is root's; job $(state_of "$J2")"
}
check "planted links: they were there, and nothing root's was made" t_planted_ran

# ---- a ckpt_dir inside a root-only directory ------------------------------------------
mkdir -m 700 "$TMPD/rootonly"
sed "s|^seed = 3\$|seed = 3\nckpt_dir = $TMPD/rootonly/ckpt|" "$TMPD/job.spec" \
    >"$TMPD/rootonly.spec"
J3=$(nctl submit "$TMPD/rootonly.spec" --json | json_num id | head -n 1)
nagent n0 2 "$J3"
nagent n1 2 "$J3"
finish_job "$J3"
t_rootonly() {
    [ ! -e "$TMPD/rootonly/ckpt" ] || { echo "root made $TMPD/rootonly/ckpt for nobody"; return 1; }
    [ "$(state_of "$J3")" = failed ] || { echo "job $J3 is $(state_of "$J3")"; return 1; }
    ctl show "$J3" >"$TMPD/show3" 2>&1
    grep -i "permission denied" "$TMPD/show3" || { cat "$TMPD/show3"; return 1; }
}
check "ckpt_dir in a root-only directory: nothing made there, the job fails saying why" t_rootonly

# ---- root's agent for nobody's job -------------------------------------------------
J4=$(nctl submit "$TMPD/job.spec" --json | json_num id | head -n 1)
t_root_agent() {
    run_rc 1 "$DTPROBE" --socket "$COORD_SOCK" --timeout 5 REGISTER \
        "{\"job\": $J4, \"node\": \"rootnode\", \"slots\": 2}" &&
        out_has "its agents must run as that user"
}
check "root's agent may not run nobody's job" t_root_agent
ctl cancel "$J4" >/dev/null 2>&1

no_agents_left() {
    _na=$(pgrep -f "^$DTAGENTD .*$TMPD/nagents" || true)
    [ -z "$_na" ] || { echo "agents left: $_na"; return 1; }
}
check "every agent of the test has ended" no_agents_left
finish
