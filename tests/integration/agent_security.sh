#!/bin/sh
# SPDX-License-Identifier: MIT
#
# What another local user can do to a running dtagentd through its PMIx
# server, end to end: a private munged and dtcoordd, an agent run by root
# with two dtengine workers, and the user nobody as the other user, with
# tests/tools/pmixforeign. Everything nobody needs is public: the agent's pid
# (ps) names the server's namespace "pmix-server.PID", its TCP port on
# 127.0.0.1 is in /proc/net/tcp, and a generation's namespace is
# "dt.JOB.GEN". Checked, as the user sees it:
#   - nobody's bare TCP connection is closed at once; nobody's PMIx client
#     gets nothing, neither with its own uid nor claiming root's (over TCP
#     libpmix's "native" check believed the claim: job data and a fence);
#   - the agent still exits, in bounded time and with the status it meant,
#     on SIGTERM and when its job completes, while nobody holds a
#     connection open (it used to hang for ever in PMIx_server_finalize);
#   - root's own client that stalls in its handshake is cut off after
#     DT_ACCEPT_GATE_HANDSHAKE_TIMEOUT_MS, and one that keeps libpmix
#     reading for ever does not keep the agent from exiting on SIGTERM
#     (finalize is abandoned after its deadline, the exit status is still 1);
#   - the server's directory is made 0700 when found open, holds no
#     rendezvous file, and an agent whose state directory lies inside a
#     directory another user owns refuses to start (exit 1, it is named).
# Needs root (it runs commands as nobody). Not here: the coordinator's own
# sockets (security.sh), Slurm.

. "$(dirname "$0")/lib.sh"
. "$DT_TESTDIR/coordlib.sh"

[ "$(id -u)" = 0 ] || skip "needs root (it runs commands as nobody)"
id nobody >/dev/null 2>&1 || skip "there is no user nobody"
command -v setpriv >/dev/null 2>&1 || skip "setpriv is not installed (util-linux)"
NOBODY_GROUP=$(id -gn nobody)
as_nobody() {
    setpriv --reuid=nobody --regid="$NOBODY_GROUP" --clear-groups "$@"
}
need_mpirun

DTAGENTD=$DT_BUILDDIR/agent/dtagentd
PMIXFOREIGN=$DT_BUILDDIR/tests/tools/pmixforeign
for _b in "$DTAGENTD" "$PMIXFOREIGN"; do
    [ -x "$_b" ] || die "$_b is not built (make agent/dtagentd tests/tools/pmixforeign)"
done
as_nobody "$PMIXFOREIGN" --help >/dev/null 2>&1
[ $? = 2 ] || skip "nobody cannot run $PMIXFOREIGN (a directory above it not searchable by all?)"

umask 022
munge_start
coord_setup
coord_start || die "dtcoordd did not start"

# a job that runs until stopped, and one that completes in a few seconds
{
    small_job_spec | sed 's/^ranks = 4$/ranks = 2/; s/^ckpt_every = 10$/ckpt_every = 100000/'
    echo "nodes = 1"
    echo "gpus_per_node = 2"
} >"$TMPD/short.spec"
sed 's/^steps = 40$/steps = 10000000/' "$TMPD/short.spec" >"$TMPD/long.spec"

submit() {
    ctl submit "$1" --json | json_num id | head -n 1
}

step_of() {
    ctl show "$1" --json | json_num step | sort -n | tail -n 1
}

stepping() { # JOB [STEP]: some rank is past STEP (default 0)
    _st=$(step_of "$1")
    [ -n "$_st" ] && [ "$_st" -gt "${2:-0}" ]
}

# agent JOB: dtagentd for JOB in the background (AGENT, AGENT_LOG, STATE)
agent() {
    STATE=$TMPD/agents/$1
    AGENT_LOG=$TMPD/agents/$1.log
    mkdir -p "$TMPD/agents"
    "$DTAGENTD" --coord "unix:$COORD_SOCK" --munge-socket "$MUNGE_SOCKET" --job "$1" \
        --node a0 --slots 2 --state-dir "$STATE" --hang-timeout 30s --grace 1s \
        >"$AGENT_LOG" 2>&1 &
    AGENT=$!
    track "$AGENT"
}

# pmix_uri PID: the URI of PID's PMIx server, as any user can work it out
# (root reads the socket's inode from /proc/PID/fd to pick the right port)
pmix_uri() {
    for _pu_i in $(ls -l "/proc/$1/fd" 2>/dev/null | sed -n 's/.*socket:\[\([0-9]*\)\]$/\1/p'); do
        _pu_port=$(awk -v i="$_pu_i" '$4 == "0A" && $10 == i && $2 ~ /^0100007F:/ {
            split($2, a, ":"); print a[2] }' /proc/net/tcp)
        if [ -n "$_pu_port" ]; then
            echo "pmix-server.$1;tcp4://127.0.0.1:$(printf '%d' "0x$_pu_port")"
            return 0
        fi
    done
    return 1
}

# ended_within SECONDS PID: PID (a child) ends within SECONDS; prints how
# long it took and sets ENDED_RC to its exit status
ended_within() {
    _ew_t0=$(date +%s.%N)
    if ! wait_for "$1" dead "$2"; then
        echo "pid $2 still running $1 s later:"
        tail -n 5 "$AGENT_LOG" | sed 's/^/  | /'
        kill -KILL "$2" 2>/dev/null
        wait "$2" 2>/dev/null
        untrack "$2"
        return 1
    fi
    wait "$2"
    ENDED_RC=$?
    untrack "$2"
    ENDED_S=$(echo "$(date +%s.%N) $_ew_t0" | awk '{ printf "%.1f", $1 - $2 }')
}

# foreign NAME ARGS...: pmixforeign as nobody (exit status in $TMPD/NAME.rc)
foreign() {
    _f_name=$1
    shift
    as_nobody timeout 60 "$PMIXFOREIGN" --uri "$URI" "$@" >"$TMPD/$_f_name.out" 2>&1
    echo $? >"$TMPD/$_f_name.rc"
}

# ---- a running job, nobody against its agent ------------------------------------

J=$(submit "$TMPD/long.spec")
agent "$J"
wait_for 120 stepping "$J" || die "job $J did not start stepping (agent log: $AGENT_LOG)"
URI=$(pmix_uri "$AGENT") || die "no PMIx listener found for agent pid $AGENT"
echo "# agent $AGENT, server $URI, job $J"

t_raw() {
    foreign raw --raw 3
    grep -q "closed by the server after" "$TMPD/raw.out" && [ "$(cat "$TMPD/raw.rc")" = 3 ] || {
        echo "exit $(cat "$TMPD/raw.rc"):"
        cat "$TMPD/raw.out"
        return 1
    }
    _ms=$(sed -n 's/.*closed by the server after \([0-9]*\) ms/\1/p' "$TMPD/raw.out")
    [ "$_ms" -lt 1000 ] || { echo "closed only after $_ms ms"; return 1; }
    grep -q "PMIx server: connection from uid $(id -u nobody) refused" "$AGENT_LOG" || {
        echo "no refusal in the agent's log"
        return 1
    }
    echo "closed after $_ms ms, logged"
}
check "nobody's bare TCP connection to the agent's PMIx server is closed at once" t_raw

# nothing: PMIx_Init refused and no GOT line
got_nothing() {
    if grep -q "^pmixforeign: GOT" "$TMPD/$1.out" || [ "$(cat "$TMPD/$1.rc")" != 3 ] ||
        ! grep -q "^pmixforeign: PMIx_Init: " "$TMPD/$1.out"; then
        echo "exit $(cat "$TMPD/$1.rc"):"
        cat "$TMPD/$1.out"
        return 1
    fi
    sed -n 's/^pmixforeign: //p' "$TMPD/$1.out" | head -n 1
}

t_clients() {
    _s0=$(step_of "$J")
    foreign own --nspace "dt.$J.1" --rank 1 && got_nothing own >/dev/null || return 1
    foreign claim --nspace "dt.$J.1" --rank 0 --claim-uid 0 --claim-gid 0 &&
        got_nothing claim >/dev/null || return 1
    wait_for 60 stepping "$J" "$_s0" || { echo "job $J stuck at step $_s0"; return 1; }
    echo "both refused ($(sed -n 's/^pmixforeign: PMIx_Init: //p' "$TMPD/claim.out")), job past step $_s0"
}
check "nobody's PMIx clients (own uid; claiming root's as rank 0) get no data, no fence; the job goes on" \
    t_clients

# nobody holds a connection open across the stop
as_nobody "$PMIXFOREIGN" --uri "$URI" --raw 120 >"$TMPD/hold.out" 2>&1 &
HOLD=$!
track "$HOLD"
sleep 0.5

t_sigterm() {
    kill -TERM "$AGENT"
    ended_within 30 "$AGENT" || return 1
    [ "$ENDED_RC" = 1 ] || { echo "exit $ENDED_RC, want 1 (stopped by a signal)"; return 1; }
    _w=$(pgrep -f "$TMPD/agents/$J/gen-" || true)
    [ -z "$_w" ] || { echo "workers left: $_w"; return 1; }
    echo "exited 1 after ${ENDED_S} s"
}
check "SIGTERM: the agent exits 1 within 30 s, no worker left, while nobody holds a connection" \
    t_sigterm
stop_pid "$HOLD" >/dev/null
ctl cancel "$J" >/dev/null 2>&1

# ---- a job that completes -------------------------------------------------------

J=$(submit "$TMPD/short.spec")
agent "$J"
wait_for 60 pmix_uri "$AGENT" || die "no PMIx listener found for agent pid $AGENT"
URI=$(pmix_uri "$AGENT")
as_nobody "$PMIXFOREIGN" --uri "$URI" --raw 120 >"$TMPD/hold2.out" 2>&1 &
HOLD=$!
track "$HOLD"

t_job_end() {
    foreign claim2 --nspace "dt.$J.1" --rank 0 --claim-uid 0 --claim-gid 0
    got_nothing claim2 >/dev/null || return 1
    ended_within 120 "$AGENT" || return 1
    [ "$ENDED_RC" = 0 ] || { echo "exit $ENDED_RC, want 0 (job completed)"; return 1; }
    _state=$(ctl show "$J" --json | json_str state | head -n 1)
    [ "$_state" = completed ] || { echo "job $J is $_state"; return 1; }
    echo "job completed, agent exited 0 after ${ENDED_S} s"
}
check "job end: the agent exits 0 although nobody holds a connection and tried to join" t_job_end
stop_pid "$HOLD" >/dev/null

# ---- root's own client that stalls --------------------------------------------------

J=$(submit "$TMPD/long.spec")
# a server directory left open to others (an older agent, a hand-made one)
mkdir -p -m 0755 "$TMPD/agents/$J/pmix"
agent "$J"
wait_for 120 stepping "$J" || die "job $J did not start stepping (agent log: $AGENT_LOG)"
URI=$(pmix_uri "$AGENT") || die "no PMIx listener found for agent pid $AGENT"

t_private() {
    _d=$TMPD/agents/$J/pmix
    [ "$(stat -c %a "$_d")" = 700 ] || { echo "$_d: mode $(stat -c %a "$_d")"; return 1; }
    ! as_nobody ls "$_d" >/dev/null 2>&1 || { echo "nobody can list $_d"; return 1; }
    _rv=$(find "$_d" -mindepth 1 -maxdepth 1 ! -name 'gen.*')
    [ -z "$_rv" ] || { echo "files in $_d: $_rv"; return 1; }
    echo "$_d: made 0700, no rendezvous file in it"
}
check "a PMIx directory found open (0755) is made 0700; no rendezvous file" t_private

t_stall() {
    timeout 60 "$PMIXFOREIGN" --uri "$URI" --raw 20 >"$TMPD/stall.out" 2>&1
    _ms=$(sed -n 's/.*closed by the server after \([0-9]*\) ms/\1/p' "$TMPD/stall.out")
    [ -n "$_ms" ] && [ "$_ms" -ge 4000 ] && [ "$_ms" -lt 15000 ] || {
        cat "$TMPD/stall.out"
        return 1
    }
    echo "closed after $_ms ms"
}
check "root's own connection that sends nothing is closed after the 5 s handshake timeout" t_stall

"$PMIXFOREIGN" --uri "$URI" --raw 120 --drip >"$TMPD/drip.out" 2>&1 &
DRIP=$!
track "$DRIP"
sleep 1

t_abandon() {
    kill -TERM "$AGENT"
    ended_within 60 "$AGENT" || return 1
    [ "$ENDED_RC" = 1 ] || { echo "exit $ENDED_RC, want 1 (stopped by a signal)"; return 1; }
    grep -q "PMIx_server_finalize did not return in 5000 ms" "$AGENT_LOG" &&
        grep -q "exiting with status 1 (libpmix left running)" "$AGENT_LOG" || {
        echo "no abandoned finalize in the log:"
        tail -n 8 "$AGENT_LOG" | sed 's/^/  | /'
        return 1
    }
    echo "exited 1 after ${ENDED_S} s, finalize abandoned"
}
check "SIGTERM while root's own client keeps libpmix reading: exit 1 in bounded time" t_abandon
stop_pid "$DRIP" >/dev/null
ctl cancel "$J" >/dev/null 2>&1

# ---- the server's directory ------------------------------------------------------------

t_foreign_dir() {
    mkdir -m 0755 "$TMPD/nobodys" && chown nobody "$TMPD/nobodys" || return 1
    run_rc 1 "$DTAGENTD" --coord "unix:$COORD_SOCK" --job 999 --node a0 \
        --state-dir "$TMPD/nobodys/state" &&
        out_has "PMIx server directory .*nobodys is owned by uid $(id -u nobody), not by uid 0" ||
        return 1
    sed -n 's/.*\(PMIx server directory\)/\1/p' "$TMPD/out" | head -n 1
}
check "an agent whose state directory is inside nobody's directory refuses to start" \
    t_foreign_dir

coord_stop
munge_stop
check "no process left behind" none_left

finish
