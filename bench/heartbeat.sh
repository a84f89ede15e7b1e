#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Heartbeat handling in dtcoordd: for each N in DT_BENCH_AGENTS (default
# 256 1024 4096), bench_heartbeat opens N agent connections over TCP (munge
# AUTH, REGISTER), heartbeats each at 1 Hz with phases spread over the
# second, and after a 2 s warm-up measures for DT_BENCH_SECONDS (default 20)
# the send-to-reply latency and the coordinator's CPU (% of one core) and
# RSS. The baseline is the issue's target: 4096 agents on one core with
# p99 < 10 ms. Everything runs here, in a private munged and a private
# dtcoordd (a fresh one, with a fresh database, for each N, so agents of
# the previous row being swept as lost cannot disturb the next), and is
# stopped on exit. The generator shares the machine: its own CPU is shown.
# Prints a table; asserts nothing.
set -eu
top=${DT_BUILDDIR:-$(cd "$(dirname "$0")/.." && pwd)}
AGENTS=${DT_BENCH_AGENTS:-256 1024 4096}
DURATION=${DT_BENCH_SECONDS:-20}
MUNGED=${MUNGED:-}

dtcoordd=$top/coordinator/dtcoordd
dtctl=$top/cli/dtctl
bench=$top/bench/bench_heartbeat
for p in "$dtcoordd" "$dtctl" "$bench"; do
    if [ ! -x "$p" ]; then
        echo "heartbeat.sh: $p is not built" \
            "(make coordinator/dtcoordd cli/dtctl bench/bench_heartbeat)" >&2
        exit 1
    fi
done
# munged lives in sbin, often not on a user's PATH
if [ -z "$MUNGED" ]; then
    for m in "$(command -v munged 2>/dev/null || :)" /usr/sbin/munged /sbin/munged \
        /usr/local/sbin/munged; do
        if [ -n "$m" ] && [ -x "$m" ]; then
            MUNGED=$m
            break
        fi
    done
fi
if [ -z "$MUNGED" ] || ! command -v "$MUNGED" >/dev/null 2>&1; then
    echo "heartbeat.sh: munged not found (install munge, or set MUNGED=/path/to/munged)" >&2
    exit 1
fi

# One descriptor per agent on each side: raise the limit for everything
# started from here. (`ulimit -n` is not in POSIX but dash, bash and busybox
# sh all have it.)
# shellcheck disable=SC3045
ulimit -n 65536 2>/dev/null || ulimit -n hard 2>/dev/null ||
    ulimit -n "$(ulimit -Hn)" 2>/dev/null || :

work=$(mktemp -d "${TMPDIR:-/tmp}/dt-heartbeat.XXXXXX")
chmod 0711 "$work" # munged wants every directory above its socket searchable by all
coord_pid=
bench_pid=

running() { # PID: alive and not a zombie waiting to be reaped
    [ -r "/proc/$1/stat" ] && [ "$(sed -n 's/.*) \(.\).*/\1/p' "/proc/$1/stat" 2>/dev/null)" != Z ]
}

stop_pid() { # PID: TERM, then KILL after 5 s; reaps it when it is our child
    kill "$1" 2>/dev/null || return 0
    i=0
    while running "$1" && [ $i -lt 50 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    if running "$1"; then
        kill -9 "$1" 2>/dev/null || :
    fi
    wait "$1" 2>/dev/null || :
}

cleanup() {
    [ -n "$bench_pid" ] && stop_pid "$bench_pid"
    [ -n "$coord_pid" ] && stop_pid "$coord_pid"
    if [ -s "$work/munged.pid" ]; then
        stop_pid "$(cat "$work/munged.pid")"
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- a private munged -------------------------------------------------------
mkdir -m 0755 "$work/munge"
(umask 077 && dd if=/dev/urandom of="$work/munge.key" bs=1024 count=1 2>/dev/null)
chmod 0600 "$work/munge.key"
msock=$work/munge/munge.socket
# munged forks, and its parent returns once the socket is ready
if ! "$MUNGED" --key-file="$work/munge.key" --socket="$msock" --pid-file="$work/munged.pid" \
    --seed-file="$work/munged.seed" --log-file="$work/munged.log" --num-threads=4 \
    2>"$work/munged.err"; then
    echo "heartbeat.sh: munged did not start:" >&2
    cat "$work/munged.err" "$work/munged.log" >&2 2>/dev/null || :
    exit 1
fi

# ---- a private dtcoordd per row -----------------------------------------------
# Start dtcoordd on a free port for row $1, submit one job; sets coord_pid,
# port and job.
start_coord() {
    state=$work/state-$1
    sock=$state/dtcoordd.sock
    tries=0
    while :; do
        port=${DT_BENCH_PORT:-$(awk -v s=$(($$ + tries * 7919 + $1)) \
            'BEGIN { srand(s); print 20000 + int(rand() * 30000) }')}
        cat >"$work/dt-$1.conf" <<EOF
state_dir = $state
socket = $sock
listen = 127.0.0.1:$port
munge_socket = $msock
heartbeat = 1s
agent_timeout = 30s
log_level = warn
EOF
        "$dtcoordd" -D -f "$work/dt-$1.conf" 2>>"$work/dtcoordd-$1.log" &
        coord_pid=$!
        i=0
        while [ $i -lt 100 ]; do
            if ! kill -0 "$coord_pid" 2>/dev/null; then
                break
            fi
            # answers on the Unix socket only once its loop runs, after TCP listens
            if "$dtctl" --socket "$sock" list >/dev/null 2>&1; then
                job=$("$dtctl" --socket "$sock" submit --kind attn --model tiny --tokens 4096 \
                    --ranks 2 --gpu cpu) || {
                    echo "heartbeat.sh: dtctl submit failed" >&2
                    exit 1
                }
                return 0
            fi
            sleep 0.1
            i=$((i + 1))
        done
        stop_pid "$coord_pid"
        coord_pid=
        tries=$((tries + 1))
        if [ -n "${DT_BENCH_PORT:-}" ] || [ $tries -ge 5 ] ||
            ! grep -qi 'in use' "$work/dtcoordd-$1.log"; then
            echo "heartbeat.sh: dtcoordd did not start:" >&2
            cat "$work/dtcoordd-$1.log" >&2
            exit 1
        fi
    done
}

# ---- the table ------------------------------------------------------------------
field() { # LINE KEY -> value
    printf ' %s\n' "$1" | sed -n "s/.* $2=\([^ ]*\).*/\1/p"
}

printf 'dtcoordd heartbeat handling: N agents over TCP, 1 Hz each, %s s measured %s\n' \
    "$DURATION" 'after a 2 s warm-up'
# shellcheck disable=SC3045
printf 'baseline (the target): 4096 agents on one core, p99 < 10 ms; %s\n' \
    "this machine: $(nproc 2>/dev/null || echo '?') cores, nofile $(ulimit -n)"
printf '%6s | %7s %7s %7s | %10s %6s | %10s %13s | %8s\n' N "p50 ms" "p99 ms" "max ms" \
    "replies/s" errors "coord CPU%" "coord RSS MiB" "gen CPU%"
notes=
for n in $AGENTS; do
    start_coord "$n"
    rc=0
    "$bench" --coord "127.0.0.1:$port" --munge-socket "$msock" --job "$job" --agents "$n" \
        --seconds "$DURATION" --pid "$coord_pid" >"$work/bench-$n.out" 2>"$work/bench-$n.err" &
    bench_pid=$!
    wait "$bench_pid" || rc=$?
    bench_pid=
    line=$(tail -n 1 "$work/bench-$n.out")
    if [ $rc -ne 0 ] || [ -z "$line" ]; then
        printf '%6s | failed (exit %s):\n' "$n" "$rc"
        sed 's/^/       /' "$work/bench-$n.err"
    else
        errs=$(($(field "$line" errors) + $(field "$line" setup_errors) + $(field "$line" skipped)))
        printf '%6s | %7s %7s %7s | %10s %6s | %10s %13s | %8s\n' "$n" \
            "$(field "$line" p50_ms)" "$(field "$line" p99_ms)" "$(field "$line" max_ms)" \
            "$(field "$line" rate_hz)" "$errs" "$(field "$line" coord_cpu_pct)" \
            "$(field "$line" coord_rss_mib)" "$(field "$line" gen_cpu_pct)"
        if [ "$errs" -ne 0 ]; then
            notes="$notes
N=$n: $line
$(sed 's/^/    /' "$work/bench-$n.err")"
        fi
    fi
    stop_pid "$coord_pid"
    coord_pid=
done
echo
echo 'latency: send to reply as the generator sees it (its own scheduling included);'
echo 'CPU: utime+stime over the measured window as % of one core; RSS: VmRSS at its end;'
echo 'errors: error replies, lost connections, unanswered, skipped and failed registrations.'
if [ -n "$notes" ]; then
    printf '\nrows with errors:%s\n' "$notes"
fi
