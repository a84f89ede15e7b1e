#!/bin/sh
# SPDX-License-Identifier: MIT
#
# dtcoordd's Prometheus endpoint (metrics_listen, dtcoordd(8) METRICS) with
# real daemons: a private munged and dtcoordd, two dtagentd over the Unix
# socket, each the PMIx server of 2 dtengine workers training a small
# model. It checks what an administrator's Prometheus would see:
#   - without metrics_listen there is no second listener;
#   - with it, GET /metrics during the job answers 200 with the text
#     format's content type, and the job's series (state, step, tokens/s,
#     loss, ETTR, checkpoint age, restarts) and its agents' (heartbeat
#     age, slots) are there with plausible values, and the job's name is
#     not;
#   - `promtool check metrics` (Prometheus' own linter) passes the scrape
#     with nothing to say;
#   - another path is 404, another method 405, a malformed request 400,
#     an oversize head 431;
#   - connections that never send, or never finish, a request hold no
#     more than the bound (the next one is told 503), do not stall the
#     coordinator (dtctl list answers meanwhile) and are closed after the
#     endpoint's 10 s;
#   - after the job is cancelled it shows by its state only.
# It needs curl and promtool (Debian's prometheus package; contrib/deps.sh
# installs both) and skips, saying which is missing, without them.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/coordlib.sh"
need_mpirun

DTAGENTD=$DT_BUILDDIR/agent/dtagentd
[ -x "$DTAGENTD" ] || die "$DTAGENTD is not built"
command -v curl >/dev/null 2>&1 || skip "curl is not installed (apt-get install curl)"
command -v promtool >/dev/null 2>&1 ||
    skip "promtool is not installed (apt-get install prometheus: Debian's package has it)"

munge_start
coord_setup

# tcp_listeners PID: how many listening TCP sockets the process holds
tcp_listeners() {
    _tl_ino=$(ls -l "/proc/$1/fd" 2>/dev/null | sed -n 's/.*socket:\[\([0-9]*\)\]$/\1/p' |
        tr '\n' ' ')
    cat /proc/net/tcp /proc/net/tcp6 2>/dev/null |
        awk -v ids=" $_tl_ino " '$4 == "0A" && index(ids, " " $10 " ") { n++ } END { print n + 0 }'
}

# ---- off by default ------------------------------------------------------------

t_off() {
    coord_start || return 1
    _n=$(tcp_listeners "$COORD_PID")
    [ "$_n" = 1 ] || { echo "$_n TCP listeners, expected 1 (listen only)"; return 1; }
    grep -q 'metrics_listen=- ' "$COORD_LOG" || { tail -n 3 "$COORD_LOG"; return 1; }
    ! grep -q 'metrics listening' "$COORD_LOG" || { echo "an endpoint was started"; return 1; }
    coord_stop
}
check "without metrics_listen: no endpoint (one TCP listener, listen's)" t_off

# ---- on ------------------------------------------------------------------------

COORD_CONF_EXTRA="metrics_listen = 127.0.0.1:0"
coord_write_conf
coord_start || die "dtcoordd did not start"
MPORT=$(sed -n 's/.*metrics listening on 127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$COORD_LOG" | tail -n 1)
[ -n "$MPORT" ] || die "dtcoordd logged no metrics port: $(tail -n 3 "$COORD_LOG")"
URL=http://127.0.0.1:$MPORT

t_on() {
    _n=$(tcp_listeners "$COORD_PID")
    [ "$_n" = 2 ] || { echo "$_n TCP listeners, expected 2 (listen, metrics_listen)"; return 1; }
    echo "port $MPORT"
}
check "metrics_listen = 127.0.0.1:0: a second listener, its port logged" t_on

# scrape NAME [CURL ARGS...]: GET /metrics into $TMPD/NAME.prom (headers
# in NAME.hdr); fails unless the answer is 200
scrape() {
    _sc_n=$1
    shift
    curl -sS --max-time 10 -D "$TMPD/$_sc_n.hdr" -o "$TMPD/$_sc_n.prom" "$@" "$URL/metrics" &&
        head -n 1 "$TMPD/$_sc_n.hdr" | grep -q '^HTTP/1.1 200 '
}

# val FILE SERIES: the value of the sample written exactly as SERIES
val() {
    awk -v s="$2" '$1 == s { print $2; exit }' "$1"
}

# is NUM OP NUM (awk's comparison of numbers)
is() {
    awk -v a="$1" -v b="$3" "BEGIN { exit !(a != \"\" && a $2 b) }"
}

# want FILE SERIES OP NUM: the sample is there and compares so
want() {
    _w=$(val "$1" "$2")
    is "$_w" "$3" "$4" && return 0
    echo "$2 = '${_w:-absent}', expected $3 $4"
    return 1
}

# status CURL ARGS...: the HTTP status of one request to the endpoint
status() {
    curl -sS --max-time 10 -o /dev/null -w '%{http_code}' "$@"
}

# a training job that runs until it is cancelled; its name must not be shown
{
    small_job_spec | sed -e 's/^steps = .*/steps = 1000000/' -e 's/^ckpt_every = .*/ckpt_every = 20/'
    echo 'name = "m3trics-se\"cret name"'
    echo "nodes = 2"
    echo "gpus_per_node = 2"
} >"$TMPD/job.spec"
J=$(submit "$TMPD/job.spec")
[ -n "$J" ] || die "the job was not submitted"
agent a0 2 "$J"
agent a1 2 "$J"

# ---- peers that hold connections (while the job starts) ----------------------------

# 7 that never send a byte and one that never finishes its request: the
# bound of 8, held until the endpoint's timeout closes them
"$DTPROBE" --tcp "127.0.0.1:$MPORT" --idle 7 --wait-close 25 >"$TMPD/idle.out" 2>&1 &
IDLE=$!
track "$IDLE"
# "GET /metrics HTTP/1.1\r\nHost: x\r\n" and no empty line
"$DTPROBE" --tcp "127.0.0.1:$MPORT" --timeout 25 \
    --raw 474554202f6d65747269637320485454502f312e310d0a486f73743a20780d0a \
    >"$TMPD/slow.out" 2>&1 &
SLOW=$!
track "$SLOW"

t_held() {
    wait_for 10 grep -q 'IDLE opened=7 of 7' "$TMPD/idle.out" || { cat "$TMPD/idle.out"; return 1; }
    sleep 0.5 # the slow one is in too
    _s=$(status "$URL/metrics")
    [ "$_s" = 503 ] || { echo "a ninth connection got $_s, not 503"; return 1; }
    # the coordinator is not stalled by them
    run_rc 0 ${DT_TIMEOUT:+"$DT_TIMEOUT" 5} "$DTCTL" --socket "$COORD_SOCK" list &&
        out_has "^ *$J " &&
        coord_ping && echo "503 for the ninth; dtctl list answers"
}
check "8 connections that send no whole request: the ninth is told 503, dtctl still answers" t_held

t_closed() {
    wait_for 30 dead "$IDLE" && wait_for 30 dead "$SLOW" || { echo "the probes still run"; return 1; }
    wait "$IDLE"
    _ri=$?
    wait "$SLOW"
    _rs=$?
    untrack "$IDLE"
    untrack "$SLOW"
    grep -q 'IDLE closed=7 of 7' "$TMPD/idle.out" && [ "$_ri" = 3 ] ||
        { echo "idle probe exit $_ri:"; cat "$TMPD/idle.out"; return 1; }
    grep -q '^CLOSED' "$TMPD/slow.out" && [ "$_rs" = 3 ] ||
        { echo "slow probe exit $_rs:"; cat "$TMPD/slow.out"; return 1; }
    # closed by the timeout, not at once
    _ms=$(sed -n 's/.*closed=7 of 7 after \([0-9]*\) ms/\1/p' "$TMPD/idle.out")
    is "$_ms" '>' 1000 || { cat "$TMPD/idle.out"; return 1; }
    scrape after_idle && want "$TMPD/after_idle.prom" 'dt_coordinator_connections{kind="metrics"}' == 1 &&
        sed -n 's/^IDLE //p' "$TMPD/idle.out"
}
check "the held connections are closed by the endpoint's timeout; scrapes work again" t_closed

# ---- during the job --------------------------------------------------------------

committed_ckpt() {
    ctl checkpoints "$J" 2>/dev/null | grep -q committed
}
wait_for 120 step_at_least "$J" 30 && wait_for 60 committed_ckpt ||
    echo "job $J did not reach step 30 with a committed checkpoint"

t_scrape() {
    scrape during || { cat "$TMPD/during.hdr" 2>/dev/null; return 1; }
    grep -q '^Content-Type: text/plain; version=0.0.4; charset=utf-8' "$TMPD/during.hdr" &&
        grep -q '^Connection: close' "$TMPD/during.hdr" || { cat "$TMPD/during.hdr"; return 1; }
    echo "$(wc -l <"$TMPD/during.prom") lines"
}
check "GET /metrics: 200, text/plain; version=0.0.4, Connection: close" t_scrape

t_promtool() {
    promtool check metrics <"$TMPD/during.prom" >"$TMPD/promtool.out" 2>&1
    _rc=$?
    [ "$_rc" -eq 0 ] && [ ! -s "$TMPD/promtool.out" ] && { echo "promtool: no complaint"; return 0; }
    echo "promtool exit $_rc:"
    cat "$TMPD/promtool.out"
    return 1
}
check "promtool check metrics passes the scrape with nothing to say" t_promtool

P=$TMPD/during.prom
t_job() {
    want "$P" "dt_job_state{job=\"$J\",state=\"running\"}" == 1 &&
        want "$P" "dt_job_step{job=\"$J\"}" '>=' 30 &&
        want "$P" "dt_job_steps_planned{job=\"$J\"}" == 1000000 &&
        want "$P" "dt_job_generation{job=\"$J\"}" == 1 &&
        want "$P" "dt_job_tokens_per_second{job=\"$J\"}" '>' 0 &&
        want "$P" "dt_job_loss{job=\"$J\"}" '>' 0 &&
        want "$P" "dt_job_loss{job=\"$J\"}" '<' 100 &&
        want "$P" "dt_job_ettr_ratio{job=\"$J\"}" '>' 0 &&
        want "$P" "dt_job_ettr_ratio{job=\"$J\"}" '<=' 1 &&
        want "$P" "dt_job_restarts_total{job=\"$J\"}" == 0 &&
        want "$P" "dt_job_failures_total{job=\"$J\"}" == 0 &&
        want "$P" "dt_job_checkpoint_step{job=\"$J\"}" '>=' 20 &&
        want "$P" "dt_job_checkpoint_age_seconds{job=\"$J\"}" '>=' 0 &&
        want "$P" "dt_job_checkpoint_age_seconds{job=\"$J\"}" '<' 120 &&
        want "$P" "dt_job_checkpoint_stall_seconds_total{job=\"$J\"}" '>=' 0 &&
        want "$P" "dt_job_memory_checkpoint_step{job=\"$J\"}" '>=' 25 &&
        want "$P" "dt_job_memory_checkpoint_coverage_ratio{job=\"$J\"}" '>' 0 &&
        want "$P" "dt_job_memory_checkpoint_coverage_ratio{job=\"$J\"}" '<=' 1 || return 1
    echo "step $(val "$P" "dt_job_step{job=\"$J\"}")," \
        "$(val "$P" "dt_job_tokens_per_second{job=\"$J\"}") tokens/s," \
        "ETTR $(val "$P" "dt_job_ettr_ratio{job=\"$J\"}")"
}
check "the job's series: running, step, tokens/s, loss, ETTR, checkpoint age, in-memory checkpoints, restarts" t_job

t_agents() {
    _n=$(grep -c "^dt_agent_heartbeat_age_seconds{job=\"$J\"," "$P")
    [ "$_n" = 2 ] || { echo "$_n agents' heartbeat ages, expected 2"; grep '^dt_agent' "$P"; return 1; }
    grep "^dt_agent_heartbeat_age_seconds{job=\"$J\"," "$P" | while read -r _s _v; do
        is "$_v" '<' 2 || { echo "$_s $_v: older than the agent timeout"; exit 1; }
    done || return 1
    for _a in a0 a1; do
        grep -q "^dt_agent_slots{job=\"$J\",agent=\"[0-9]*\",node=\"$_a\"} 2\$" "$P" &&
            grep -q "^dt_agent_connected{job=\"$J\",agent=\"[0-9]*\",node=\"$_a\"} 1\$" "$P" &&
            grep -q "^dt_agent_suspect{job=\"$J\",agent=\"[0-9]*\",node=\"$_a\"} 0\$" "$P" ||
            { echo "agent $_a:"; grep "node=\"$_a\"" "$P"; return 1; }
    done
    want "$P" 'dt_coordinator_connections{kind="agent"}' '>=' 2 &&
        want "$P" 'dt_coordinator_agents' == 2 &&
        want "$P" 'dt_coordinator_jobs{state="running"}' == 1 &&
        want "$P" 'dt_coordinator_scrapes_total' '>=' 1 &&
        want "$P" 'dt_coordinator_scrapes_refused_total' '>=' 1
}
check "the agents' series (heartbeat age, slots, connected) and the coordinator's" t_agents

t_dashboard() {
    _d=$DT_SRCDIR/contrib/grafana/dt-dashboard.json
    _names=$(grep -o 'dt_[a-z_]*' "$_d" | sort -u)
    [ -n "$_names" ] || { echo "no dt_ metric in $_d"; return 1; }
    for _m in $_names; do
        grep -q "^# TYPE $_m " "$P" || { echo "$_d queries $_m, which the scrape lacks"; return 1; }
    done
    echo "$(echo "$_names" | wc -l) families, all in the scrape"
}
check "every family the Grafana dashboard queries is in the scrape" t_dashboard

t_man() {
    _man=$DT_SRCDIR/man/dtcoordd.8
    grep '^# TYPE ' "$P" >"$TMPD/families"
    _n=0
    while read -r _h _t _m _ty; do
        grep -q "^\.BR $_m \" ($_ty[;,)]" "$_man" ||
            { echo "$_m ($_ty) is not in dtcoordd(8) METRICS"; return 1; }
        _n=$((_n + 1))
    done <"$TMPD/families"
    [ "$_n" -gt 25 ] || { echo "only $_n families"; return 1; }
    echo "$_n families, each in dtcoordd(8) with its type"
}
check "every family of the scrape is in dtcoordd(8) METRICS with its type" t_man

t_no_name() {
    ! grep -q 'm3trics' "$P" || { grep 'm3trics' "$P"; return 1; }
    ! grep -q "$TMPD" "$P" || { echo "a path of the test is shown"; return 1; }
}
check "no job name, no path in the scrape" t_no_name

t_http_errors() {
    _s=$(status "$URL/other") && [ "$_s" = 404 ] || { echo "GET /other: $_s"; return 1; }
    _s=$(status -X POST "$URL/metrics") && [ "$_s" = 405 ] || { echo "POST: $_s"; return 1; }
    _s=$(status --request-target '*' "$URL/metrics") && [ "$_s" = 400 ] ||
        { echo "GET *: $_s"; return 1; }
    _big=$(printf '%05000d' 0)
    _s=$(status -H "X-Big: $_big" "$URL/metrics") && [ "$_s" = 431 ] ||
        { echo "a 5000-byte header: $_s"; return 1; }
    scrape query -G --data-urlencode 'name[]=dt_job_step' && echo "404 405 400 431; a query is 200"
}
check "GET /other 404, POST 405, GET * 400, an oversize head 431" t_http_errors


# ---- after the job -----------------------------------------------------------------

ctl cancel "$J" >/dev/null 2>&1
finish_job "$J"
t_ended() {
    scrape ended || return 1
    want "$TMPD/ended.prom" "dt_job_state{job=\"$J\",state=\"cancelled\"}" == 1 &&
        want "$TMPD/ended.prom" 'dt_coordinator_jobs{state="cancelled"}' == 1 || return 1
    ! grep -q "^dt_job_step{job=\"$J\"}" "$TMPD/ended.prom" || { echo "an ended job's step"; return 1; }
    promtool check metrics <"$TMPD/ended.prom"
}
check "a cancelled job shows by its state only" t_ended

t_stop() {
    coord_stop || return 1
    munge_stop
    none_left
}
check "dtcoordd stops; nothing left running" t_stop

finish
