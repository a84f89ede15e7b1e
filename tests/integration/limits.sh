#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Every peer's memory and share of the coordinator is bounded (dtcoordd(8),
# LIMITS), measured on a real dtcoordd run by root with a descriptor limit
# of 256, and hostile peers from dtprobe, some of them the user nobody:
# a million PINGs over TCP before authentication, a million after it and
# 100,000 LISTs over the Unix socket, none of whose replies is read; and
# connections that never speak. The coordinator's peak RSS (VmHWM) may grow
# by at most 32 MiB over all of it, dtctl list keeps answering root during
# and after, each hostile connection is closed with a log line naming the
# peer, and root gets in when another user holds every connection. Then
# SIGHUP shortens auth_timeout, idle_timeout and output_timeout: silent and
# unread connections are closed on time while dtctl watch keeps polling.
# Needs root (it switches to nobody). Not here: the agents' own links.

. "$(dirname "$0")/lib.sh"
. "$DT_TESTDIR/coordlib.sh"

need_nobody
umask 022
munge_start
COORD_NOFILE=256 # max_connections in force: 256 - 96 - 32 = 128
coord_setup
check "dtcoordd starts with 256 descriptors" coord_start
coord_ping || finish

# nctl ARGS...: dtctl as nobody on the Unix socket
nctl() {
    as_nobody "$DTCTL" --socket "$COORD_SOCK" "$@"
}

status_kib() {
    awk -v k="$1:" '$1 == k { print $2 }' "/proc/$COORD_PID/status"
}
# hwm_ok: the peak RSS grew by less than 32 MiB since BASE_HWM
hwm_ok() {
    _hw=$(status_kib VmHWM)
    [ -n "$_hw" ] || { echo "no VmHWM for pid $COORD_PID"; return 1; }
    [ $((_hw - BASE_HWM)) -lt 32768 ] ||
        { echo "peak RSS grew from $BASE_HWM to $_hw KiB"; return 1; }
}
log_count() {
    grep -c -E -e "$1" "$COORD_LOG"
}
log_more() {
    [ "$(log_count "$2")" -gt "$1" ]
}
# list_ok: root's dtctl list answers (exit 0, the jobs there)
list_ok() {
    run_rc 0 ctl list && out_has "^ *$JOB +limits "
}

JOB=$(ctl submit --kind attn --model tiny --tokens 4096 --ranks 2 --gpu cpu --name limits)
for _i in 1 2 3 4 5 6 7 8; do # warm up: the baseline after the first requests
    ctl list >/dev/null
    probe_tcp --auth PING >/dev/null 2>&1
done
BASE_HWM=$(status_kib VmHWM)
echo "baseline: VmRSS $(status_kib VmRSS) KiB, VmHWM $BASE_HWM KiB"

# ---- replies never read -------------------------------------------------------

t_flood_preauth() {
    _re='peer=127\.0\.0\.1:[0-9]+ closed: more than 8 requests before authenticating'
    _n=$(log_count "$_re")
    run_rc 3 probe_tcp --timeout 5 --flood 1000000 PING && out_has '^FLOOD .*: closed' ||
        return 1
    _line=$(head -n 1 "$TMPD/out")
    hwm_ok && list_ok || return 1
    wait_for 2 log_more "$_n" "$_re" || { echo "no log line"; return 1; }
    echo "$_line; VmHWM $(status_kib VmHWM) KiB"
}
check "1,000,000 PINGs before AUTH, unread: closed after 8, peak RSS +<32 MiB" t_flood_preauth

# flood_check OUT: a flood running in the background (its output in OUT)
# stalls, the coordinator's peak RSS stays bounded and root's dtctl list
# answers while it holds the connection, unread
flood_check() {
    wait_for 30 grep -q '^FLOOD' "$1" || { echo "the flood did not stall"; cat "$1"; return 1; }
    grep -q '^FLOOD .*: stalled' "$1" || { cat "$1"; return 1; }
    hwm_ok && list_ok
}

t_flood_tcp() {
    _re='peer=127\.0\.0\.1:[0-9]+ went away with [0-9]+ bytes of replies unsent'
    _n=$(log_count "$_re")
    probe_tcp --auth --timeout 3 --hold 3000 --flood 1000000 PING >"$TMPD/flood" 2>&1 &
    _fp=$!
    flood_check "$TMPD/flood"
    _rc=$?
    wait "$_fp"
    [ "$_rc" -eq 0 ] || { echo "flood_check rc=$_rc"; return 1; }
    wait_for 3 log_more "$_n" "$_re" ||
        { echo "no log line"; return 1; }
    list_ok && hwm_ok || return 1
    echo "$(head -n 1 "$TMPD/flood"); VmHWM $(status_kib VmHWM) KiB"
}
check "1,000,000 PINGs after AUTH, unread: reading stops, RSS bounded, list answers" t_flood_tcp

t_flood_unix() {
    _re='peer=uid=65534 pid=[0-9]+ went away with [0-9]+ bytes of replies unsent'
    _n=$(log_count "$_re")
    as_nobody "$DTPROBE" --socket "$COORD_SOCK" --timeout 3 --hold 3000 --flood 100000 LIST \
        >"$TMPD/flood" 2>&1 &
    _fp=$!
    flood_check "$TMPD/flood"
    _rc=$?
    wait "$_fp"
    [ "$_rc" -eq 0 ] || { echo "flood_check rc=$_rc"; return 1; }
    wait_for 3 log_more "$_n" "$_re" ||
        { echo "no log line"; return 1; }
    list_ok && hwm_ok || return 1
    echo "$(head -n 1 "$TMPD/flood"); VmHWM $(status_kib VmHWM) KiB"
}
check "100,000 LISTs by nobody on the Unix socket, unread: RSS bounded, list answers" \
    t_flood_unix

# ---- connections that never speak ----------------------------------------------

t_root_reserve() {
    _re='peer=uid=65534 pid=[0-9]+ refused: [0-9]+ connections open \(max_connections 128\)'
    _n=$(log_count "$_re")
    as_nobody "$DTPROBE" --socket "$COORD_SOCK" --idle 300 --hold 4000 >"$TMPD/idle" 2>&1 &
    _ip=$!
    wait_for 20 grep -q '^IDLE opened' "$TMPD/idle" || { kill "$_ip"; return 1; }
    list_ok || { kill "$_ip"; wait "$_ip"; return 1; }
    run_rc 3 nctl list && out_has 'refused the connection: .*max_connections 128'
    _rc=$?
    wait "$_ip"
    [ "$_rc" -eq 0 ] || return 1
    log_more "$_n" "$_re" ||
        { echo "no log line"; return 1; }
    # once they are gone, nobody gets in again
    wait_for 5 nctl list || { echo "nobody's list still refused"; return 1; }
    hwm_ok || return 1
    echo "$(head -n 1 "$TMPD/idle"), 128 kept: root in, nobody refused (exit 3)"
}
check "nobody holds every connection (300 idle): root's list answers, nobody's exits 3" \
    t_root_reserve

# ---- shorter timeouts by SIGHUP -------------------------------------------------------

t_reload_limits() {
    _n=$(log_count 'configuration reloaded')
    COORD_CONF_EXTRA="idle_timeout = 1s
auth_timeout = 1s
output_timeout = 2s
max_connections_per_user = 16"
    coord_write_conf
    kill -s HUP "$COORD_PID"
    wait_for 5 log_more "$_n" 'configuration reloaded' || { tail -n 3 "$COORD_LOG"; return 1; }
}
check "SIGHUP applies idle_timeout, auth_timeout, output_timeout, max_connections_per_user" \
    t_reload_limits

t_per_user() {
    as_nobody "$DTPROBE" --socket "$COORD_SOCK" --idle 40 --hold 3000 >"$TMPD/idle" 2>&1 &
    _ip=$!
    wait_for 20 grep -q '^IDLE opened' "$TMPD/idle" || { kill "$_ip"; return 1; }
    list_ok && run_rc 3 nctl list && out_has 'max_connections_per_user 16'
    _rc=$?
    wait "$_ip"
    [ "$_rc" -eq 0 ]
}
check "max_connections_per_user = 16: nobody's 17th connection is refused, root's list answers" \
    t_per_user

t_idle() {
    _re='peer=uid=65534 pid=[0-9]+ closed: silent \(idle_timeout\)'
    _n=$(log_count "$_re")
    # dtctl watch waits legitimately: one connection per poll, so it goes on
    "$DT_TIMEOUT" 4 "$DTCTL" --socket "$COORD_SOCK" watch --interval 300ms "$JOB" \
        >"$TMPD/watch" 2>&1 &
    _wp=$!
    run_rc 3 as_nobody "$DTPROBE" --socket "$COORD_SOCK" --idle 10 --wait-close 5 &&
        out_has '^IDLE closed=10 of 10 after' || { wait "$_wp"; return 1; }
    wait "$_wp"
    _wrc=$?
    [ "$_wrc" -eq 124 ] && grep -q -E "^job $JOB limits +state queued" "$TMPD/watch" ||
        { echo "watch exited $_wrc:"; cat "$TMPD/watch"; return 1; }
    log_more "$_n" "$_re" ||
        { echo "no log line"; return 1; }
    tail -n 1 "$TMPD/out"
}
[ -n "$DT_TIMEOUT" ] || die "timeout(1) is not installed"
check "idle_timeout = 1s closes 10 silent connections; dtctl watch goes on polling" t_idle

t_auth_timeout() {
    _re='peer=127\.0\.0\.1:[0-9]+ closed: not authenticated \(auth_timeout\)'
    _n=$(log_count "$_re")
    run_rc 3 probe_tcp --idle 5 --wait-close 5 && out_has '^IDLE closed=5 of 5 after' ||
        return 1
    log_more "$_n" "$_re" ||
        { echo "no log line"; return 1; }
    tail -n 1 "$TMPD/out"
}
check "auth_timeout = 1s closes TCP connections that never authenticate" t_auth_timeout

t_output_timeout() {
    _re='peer=127\.0\.0\.1:[0-9]+ closed: replies unread, over output_soft_limit'
    _n=$(log_count "$_re")
    # stalled after 1 s, or closed while still sending: either way closed
    run_rc 3 probe_tcp --auth --timeout 1 --wait-close 10 --flood 1000000 PING &&
        out_has '^(FLOOD .*: closed|CLOSED after)' || return 1
    _line=$(tail -n 1 "$TMPD/out")
    wait_for 2 log_more "$_n" "$_re" || { echo "no log line"; return 1; }
    list_ok && hwm_ok || return 1
    echo "$_line; VmHWM $(status_kib VmHWM) KiB"
}
check "output_timeout = 2s closes a peer that does not read its replies" t_output_timeout

t_rss_after() {
    _r=$(status_kib VmRSS)
    list_ok && hwm_ok || return 1
    echo "VmRSS $_r KiB, VmHWM $(status_kib VmHWM) KiB (baseline $BASE_HWM)"
}
check "after every flood: list answers, peak RSS within 32 MiB of the baseline" t_rss_after

coord_stop
munge_stop
check "no process left behind" none_left

finish
