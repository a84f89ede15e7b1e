#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Helpers for the coordinator's integration scripts; sourced after lib.sh,
# never run. They start a private munged (its own key, socket and files
# under $TMPD) and a private dtcoordd (its own dt.conf, state directory,
# Unix socket and a free TCP port on 127.0.0.1), in the foreground (-D, a
# child of the test) or daemonised, and stop them again. Every process
# started here is remembered; the exit trap stops what is still running
# (TERM, then KILL after 5 s) before lib.sh's $TMPD is removed, and
# `none_left` checks that nothing is. Waits poll with a bound; nothing
# sleeps longer than needed. Not here: the checks themselves.

DTCOORDD=$DT_BUILDDIR/coordinator/dtcoordd
DTCTL=$DT_BUILDDIR/cli/dtctl
: "${DTPROBE:=$DT_BUILDDIR/tests/tools/dtprobe}"
for _cl_bin in "$DTCOORDD" "$DTCTL" "$DTPROBE"; do
    [ -x "$_cl_bin" ] ||
        die "$_cl_bin is not built (make coordinator/dtcoordd cli/dtctl tests/tools/dtprobe;" \
            "DT_BUILDDIR=$DT_BUILDDIR)"
done

DT_PIDS=          # every process started here (munged, coordinators)
DT_EXIT_HOOK=     # a command the script wants run at exit (before the stop)
trap 'dt_exit_cleanup; rm -rf "$TMPD"' EXIT

# ---- processes --------------------------------------------------------------

# alive PID: PID exists and is not a zombie (a killed child of this shell
# stays a zombie until waited for, and kill -0 still succeeds on it)
alive() {
    kill -0 "$1" 2>/dev/null || return 1
    _al_st=$(sed 's/.*) \(.\).*/\1/' "/proc/$1/stat" 2>/dev/null) || return 1
    [ "$_al_st" != Z ]
}

# wait_for SECONDS CMD...: poll CMD every 50 ms until it succeeds; 1 on timeout
wait_for() {
    _wf_n=$(($1 * 20))
    shift
    while [ "$_wf_n" -gt 0 ]; do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.05
        _wf_n=$((_wf_n - 1))
    done
    return 1
}

dead() {
    ! alive "$1"
}

# track PID / untrack PID: remember (forget) a process this test started
track() {
    DT_PIDS="$DT_PIDS $1"
}
untrack() {
    _ut_new=
    for _ut_p in $DT_PIDS; do
        [ "$_ut_p" = "$1" ] || _ut_new="$_ut_new $_ut_p"
    done
    DT_PIDS=$_ut_new
}

# stop_pid PID [SIGNAL]: signal (default TERM), wait up to 10 s, then KILL;
# reap it when it is our child. Returns its exit status when it is a child
# (128+n for a signal), else 0 once it is gone.
stop_pid() {
    _sp_sig=${2:-TERM}
    kill -s "$_sp_sig" "$1" 2>/dev/null
    if ! wait_for 10 dead "$1"; then
        echo "pid $1 ignored SIG$_sp_sig for 10 s: killing it"
        kill -s KILL "$1" 2>/dev/null
        wait_for 5 dead "$1"
    fi
    untrack "$1"
    wait "$1" 2>/dev/null
}

dt_exit_cleanup() {
    [ -n "$DT_EXIT_HOOK" ] && eval "$DT_EXIT_HOOK"
    _ec_live=
    for _ec_p in $DT_PIDS; do
        if alive "$_ec_p"; then
            kill -s TERM "$_ec_p" 2>/dev/null
            _ec_live="$_ec_live $_ec_p"
        fi
    done
    for _ec_p in $_ec_live; do
        wait_for 5 dead "$_ec_p" || kill -s KILL "$_ec_p" 2>/dev/null
    done
}

# none_left: every process this test started has ended (a check)
none_left() {
    _nl_rc=0
    for _nl_p in $DT_PIDS; do
        if alive "$_nl_p"; then
            echo "pid $_nl_p still running: $(tr '\0' ' ' <"/proc/$_nl_p/cmdline")"
            _nl_rc=1
        fi
    done
    return $_nl_rc
}

# ---- munged -----------------------------------------------------------------

# munge_start [DIR]: a private munged with its own key under DIR (default
# $TMPD/munge); sets MUNGE_DIR, MUNGE_SOCKET and MUNGED_PID. Skips the test
# when munge is not installed.
munge_start() {
    MUNGED=
    for _ms_c in munged /usr/sbin/munged /sbin/munged; do
        if command -v "$_ms_c" >/dev/null 2>&1; then
            MUNGED=$(command -v "$_ms_c")
            break
        fi
    done
    [ -n "$MUNGED" ] || skip "munged is not installed (apt-get install munge)"
    command -v munge >/dev/null 2>&1 && command -v unmunge >/dev/null 2>&1 ||
        skip "munge/unmunge are not installed (apt-get install munge)"
    MUNGE_DIR=${1:-$TMPD/munge}
    # the default name, so that the directory can stand in for /run/munge
    MUNGE_SOCKET=$MUNGE_DIR/munge.socket.2
    # munged wants every directory above its socket searchable by all, and
    # refuses key, socket and log directories that others may write to
    chmod 0755 "$TMPD" || die "cannot chmod $TMPD"
    mkdir -m 0755 "$MUNGE_DIR" || die "cannot create $MUNGE_DIR"
    dd if=/dev/urandom of="$MUNGE_DIR/munge.key" bs=1024 count=1 2>/dev/null ||
        die "cannot make a munge key"
    chmod 0600 "$MUNGE_DIR/munge.key"
    # munged forks and its parent returns once the socket is bound
    "$MUNGED" --key-file="$MUNGE_DIR/munge.key" --socket="$MUNGE_SOCKET" \
        --pid-file="$MUNGE_DIR/munged.pid" --seed-file="$MUNGE_DIR/munged.seed" \
        --log-file="$MUNGE_DIR/munged.log" >"$MUNGE_DIR/start.out" 2>&1 || {
        cat "$MUNGE_DIR/start.out" "$MUNGE_DIR/munged.log" 2>/dev/null | sed 's/^/    /'
        die "munged did not start (output above)"
    }
    wait_for 10 test -s "$MUNGE_DIR/munged.pid" || die "munged wrote no pid file"
    MUNGED_PID=$(cat "$MUNGE_DIR/munged.pid")
    track "$MUNGED_PID"
    wait_for 10 munge_works || die "munged at $MUNGE_SOCKET does not answer"
}

munge_works() {
    munge -n -S "$MUNGE_SOCKET" | unmunge -S "$MUNGE_SOCKET" >/dev/null
}

munge_stop() {
    stop_pid "$MUNGED_PID"
}

# ---- dtcoordd ---------------------------------------------------------------

# port_free PORT: nothing on this host is bound to TCP PORT
port_free() {
    _pf_hex=$(printf '%04X' "$1")
    ! cat /proc/net/tcp /proc/net/tcp6 2>/dev/null |
        awk '{ print $2 }' | grep -q ":$_pf_hex\$"
}

# pick_port [FROM]: COORD_PORT = the first free port from FROM (default a
# per-process start in 20000..39999)
pick_port() {
    COORD_PORT=${1:-$((20000 + $$ % 20000))}
    while ! port_free "$COORD_PORT"; do
        COORD_PORT=$((COORD_PORT + 1))
        [ "$COORD_PORT" -lt 65000 ] || COORD_PORT=20000
    done
}

# coord_setup [DIR]: paths of a coordinator under DIR (default $TMPD/coord)
# and its dt.conf; COORD_CONF_EXTRA (lines) is appended to the file.
coord_setup() {
    COORD_DIR=${1:-$TMPD/coord}
    COORD_STATE=$COORD_DIR/state
    COORD_SOCK=$COORD_STATE/dtcoordd.sock
    COORD_CONF=$COORD_DIR/dt.conf
    COORD_PID=
    : "${COORD_CONF_EXTRA:=}"
    mkdir -p "$COORD_DIR" || die "cannot create $COORD_DIR"
    chmod 0755 "$COORD_DIR"
    pick_port
    coord_write_conf
}

coord_write_conf() {
    {
        echo "# written by $DT_TESTNAME"
        echo "state_dir = $COORD_STATE"
        echo "socket = $COORD_SOCK"
        echo "listen = 127.0.0.1:$COORD_PORT"
        echo "munge_socket = $MUNGE_SOCKET"
        echo "heartbeat = 200ms"
        echo "agent_timeout = 1s"
        [ -n "$COORD_CONF_EXTRA" ] && printf '%s\n' "$COORD_CONF_EXTRA"
    } >"$COORD_CONF"
}

# coord_ping: the coordinator answers PING on its Unix socket
coord_ping() {
    "$DTPROBE" --socket "$COORD_SOCK" --timeout 2 PING >/dev/null 2>&1
}

# coord_start [-d]: start dtcoordd on $COORD_CONF, in the foreground (a
# child; log in $COORD_DIR/fg.log) or with -d daemonised (the parent
# returns when the daemon is ready; log in STATE/dtcoordd.log). Sets
# COORD_PID and COORD_LOG; waits until it answers PING. Another port is
# tried when the one chosen was taken meanwhile. Returns 1 with the reason
# printed when it does not start.
coord_start() {
    _cs_tries=0
    while :; do
        if [ "${1:-}" = -d ]; then
            COORD_LOG=$COORD_STATE/dtcoordd.log
            (coord_limits && exec "$DTCOORDD" -f "$COORD_CONF") >"$COORD_DIR/start.out" 2>&1
            _cs_rc=$?
            if [ "$_cs_rc" -eq 0 ]; then
                COORD_PID=$(cat "$COORD_STATE/dtcoordd.pid" 2>/dev/null)
                [ -n "$COORD_PID" ] || { echo "dtcoordd wrote no pidfile"; return 1; }
                track "$COORD_PID"
                break
            fi
        else
            COORD_LOG=$COORD_DIR/fg.log
            (coord_limits && exec "$DTCOORDD" -D -f "$COORD_CONF") >>"$COORD_LOG" 2>&1 &
            COORD_PID=$!
            track "$COORD_PID"
            if wait_for 10 coord_up_or_dead; then
                alive "$COORD_PID" && break
                wait "$COORD_PID"
                _cs_rc=$?
                untrack "$COORD_PID"
                tail -n 5 "$COORD_LOG" >"$COORD_DIR/start.out"
            else
                echo "dtcoordd (pid $COORD_PID) did not answer within 10 s"
                return 1
            fi
        fi
        _cs_tries=$((_cs_tries + 1))
        if grep -q 'address already in use' "$COORD_DIR/start.out" && [ "$_cs_tries" -lt 10 ]; then
            pick_port $((COORD_PORT + 1))
            coord_write_conf
            continue
        fi
        echo "dtcoordd did not start (exit $_cs_rc):"
        sed 's/^/    /' "$COORD_DIR/start.out"
        return 1
    done
    wait_for 10 coord_ping || {
        echo "dtcoordd (pid $COORD_PID) does not answer PING at $COORD_SOCK"
        return 1
    }
}

# A coordinator that runs away must fail on its own, not take the machine
# (and CI) with it: 1 GiB of address space is far more than it needs.
# (ulimit -v is not POSIX, but dash, bash and busybox sh have it.) Not in a
# sanitizer build (tests/sanrun.sh sets DT_SANITIZERS): AddressSanitizer
# reserves terabytes of address space for its shadow memory.
# COORD_NOFILE, when set, is its descriptor limit (soft and hard).
coord_limits() {
    [ -n "${DT_SANITIZERS:-}" ] && return 0
    # shellcheck disable=SC3045
    ulimit -v 1048576 2>/dev/null || :
    if [ -n "${COORD_NOFILE:-}" ]; then
        # shellcheck disable=SC3045
        ulimit -n "$COORD_NOFILE" || return 1
    fi
}

coord_up_or_dead() {
    coord_ping || ! alive "$COORD_PID"
}

# coord_stop [SIGNAL]: stop the running coordinator (default TERM) and
# wait until it is gone; returns its exit status when it was a child
coord_stop() {
    stop_pid "$COORD_PID" "${1:-TERM}"
}

# ctl ARGS...: dtctl on this coordinator's Unix socket
ctl() {
    "$DTCTL" --socket "$COORD_SOCK" "$@"
}

# probe ARGS...: dtprobe over TCP to this coordinator
probe_tcp() {
    "$DTPROBE" --tcp "127.0.0.1:$COORD_PORT" --munge-socket "$MUNGE_SOCKET" "$@"
}

# need_nobody: define as_nobody CMD... (CMD as the user nobody, with no
# supplementary groups), or skip the test when that cannot be done here.
# Needs root.
need_nobody() {
    [ "$(id -u)" = 0 ] || skip "needs root (it runs commands as the user nobody)"
    id nobody >/dev/null 2>&1 || skip "there is no user nobody"
    NOBODY_GROUP=$(id -gn nobody)
    if command -v setpriv >/dev/null 2>&1; then
        as_nobody() {
            setpriv --reuid=nobody --regid="$NOBODY_GROUP" --clear-groups "$@"
        }
    elif command -v su >/dev/null 2>&1; then
        as_nobody() {
            su -s /bin/sh nobody -c 'exec "$0" "$@"' "$@"
        }
    else
        skip "neither setpriv nor su is installed"
    fi
    as_nobody "$DTCTL" --version >/dev/null 2>&1 ||
        skip "nobody cannot run $DTCTL (a directory above DT_BUILDDIR is not searchable by all?)"
}

# ---- assertions for check() -------------------------------------------------

# run_rc, out_has and out_lacks are in lib.sh

# out_ids: the job or event ids in the last run_rc's --json output, on one
# line; ids_are "1 2": they are exactly these
out_ids() {
    json_num id <"$TMPD/out" | tr '\n' ' ' | sed 's/ $//'
}
ids_are() {
    [ "$(out_ids)" = "$1" ] && return 0
    echo "ids '$(out_ids)', expected '$1':"
    sed 's/^/  | /' "$TMPD/out" | head -n 30
    return 1
}

# json_str FIELD < JSON: the values of "FIELD": "..." in dtctl's indented
# --json output, one per line (no jq here: sed)
json_str() {
    sed -n "s/^ *\"$1\": \"\\([^\"]*\\)\",\\{0,1\\}\$/\\1/p"
}
# json_num FIELD < JSON: the values of "FIELD": N
json_num() {
    sed -n "s/^ *\"$1\": \\(-\\{0,1\\}[0-9][0-9.]*\\),\\{0,1\\}\$/\\1/p"
}

# ---- jobs -------------------------------------------------------------------

# state_of JOB: the job's state; terminal JOB: it has ended
state_of() {
    ctl show "$1" --json | json_str state | head -n 1
}
# completed JOB: the job ended completed; else its state and its last
# events, so that a failure in CI says what happened
completed() {
    _cs=$(state_of "$1")
    [ "$_cs" = completed ] && return 0
    echo "job $1 is ${_cs:-unknown}; its last events:"
    ctl events "$1" 2>&1 | tail -n 12
    return 1
}
terminal() {
    case $(state_of "$1") in completed | failed | cancelled) return 0 ;; esac
    return 1
}

# finish_job JOB: wait for the end, then for every agent in AGENT_PIDS (the
# script's, started in the background) to exit
finish_job() {
    wait_for 240 terminal "$1" || echo "job $1 did not end within 240 s"
    for _fj in $AGENT_PIDS; do
        wait_for 20 dead "$_fj" || kill -KILL "$_fj" 2>/dev/null
        wait "$_fj" 2>/dev/null
        untrack "$_fj"
    done
    AGENT_PIDS=
}

# small_job_spec: the spec lines of a job small enough to run many times
# here (a 2-layer model on the recall task, 256 tokens, 4 ranks, 40 steps,
# a checkpoint every 10); scripts add what they need (name, nodes, ...)
small_job_spec() {
    cat <<SPEC
kind = train
model = custom
dim = 64
layers = 2
heads = 4
kv_heads = 2
ffn = 128
vocab = 64
tokens = 256
steps = 40
seed = 3
ranks = 4
gpu = cpu
ckpt_every = 10
data = recall
recall_keys = 8
recall_values = 8
recall_pairs = 4
recall_queries = 4
SPEC
}

# ---- jobs on real agents (needs DTAGENTD, munge_start, coord_start) ----------

# agent NAME SLOTS JOB [tcp]: start dtagentd NAME in the background, its
# pid in AGENT_NAME and AGENT_PIDS; HANG is its hang timeout (default 2s)
AGENT_PIDS=
agent() {
    _ag_coord="unix:$COORD_SOCK"
    _ag_peer=
    # over TCP its peer channel (replicas) is TCP too, with munge, on loopback
    [ "${4:-}" = tcp ] && _ag_coord="127.0.0.1:$COORD_PORT" _ag_peer="--peer-listen=127.0.0.1:0"
    mkdir -p "$TMPD/agents"
    # shellcheck disable=SC2086
    "$DTAGENTD" --coord "$_ag_coord" --munge-socket "$MUNGE_SOCKET" --job "$3" --node "$1" $_ag_peer \
        --slots "$2" --state-dir "$TMPD/agents/$3-$1" --hang-timeout "${HANG:-2s}" --grace 1s \
        >"$TMPD/agents/$3-$1.log" 2>&1 &
    eval "AGENT_$1=$!"
    track $!
    AGENT_PIDS="$AGENT_PIDS $!"
}

submit() { # SPEC: prints the job id
    ctl submit "$1" --json | json_num id | head -n 1
}

# max step any rank of JOB reported
step_of() {
    ctl show "$1" --json | json_num step | sort -n | tail -n 1
}

step_at_least() {
    _sa=$(step_of "$1")
    [ -n "$_sa" ] && [ "$_sa" -ge "$2" ]
}

checksum_of() {
    ctl show "$1" --json | json_str checksum | head -n 1
}

# the loss of JOB's result (empty until it has one)
loss_of() {
    ctl show "$1" --json |
        sed -n '/"result": {/,/}/s/^ *"loss": \([-0-9.e+]*\),\{0,1\}$/\1/p' | head -n 1
}

# near A B TOL: numbers A and B (neither empty) differ by at most TOL
near() {
    awk -v a="$1" -v b="$2" -v t="$3" \
        'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= t) }'
}

# a worker of agent NAME of job JOB: its pid
worker_of() {
    pgrep -f "$TMPD/agents/$2-$1/gen-" | head -n 1
}

has_event() { # JOB KIND [ERE]
    ctl events "$1" >"$TMPD/ev.out" 2>&1 || return 1
    grep -E "$2.*${3:-}" "$TMPD/ev.out" >/dev/null && return 0
    echo "no event $2 ${3:-} in:"
    sed 's/^/  | /' "$TMPD/ev.out" | tail -n 30
    return 1
}

