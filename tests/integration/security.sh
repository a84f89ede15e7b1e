#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Who may see and change what, end to end: a private munged and dtcoordd,
# root and the user nobody as two real users. On the Unix socket the
# kernel names the peer (SO_PEERCRED): nobody sees and touches only its own
# jobs (dtctl exits 5 on root's), root sees all, and so does nobody once
# it is in admin_group (applied by SIGHUP). Over TCP the first frame must
# be a valid, fresh munge credential: none, a bogus one and a replayed one
# are refused and the connection closed; a valid one carries the user's
# uid. dtctl --coord runs in a private mount namespace where our munged
# stands in for /run/munge (see t_dtctl_coord). Needs root: it switches
# users and creates a group (removed at exit). Not here: TLS, rate limits.

. "$(dirname "$0")/lib.sh"
. "$DT_TESTDIR/coordlib.sh"

[ "$(id -u)" = 0 ] || skip "needs root (it runs commands as nobody and creates a group)"
need_nobody

# nobody must reach the sockets: everything under $TMPD is 0755 or 0666
umask 022
munge_start
coord_setup
check "dtcoordd starts" coord_start
coord_ping || finish

# nctl ARGS...: dtctl as nobody on the Unix socket
nctl() {
    as_nobody "$DTCTL" --socket "$COORD_SOCK" "$@"
}

# ---- the Unix socket: SO_PEERCRED ----------------------------------------------

ROOTJOB=$(ctl submit --kind attn --model tiny --tokens 4096 --ranks 2 --gpu cpu --name rootjob)

t_root_submit() {
    case $ROOTJOB in
    '' | *[!0-9]*) echo "root's submit printed '$ROOTJOB'"; return 1 ;;
    esac
    _mode=$(stat -c %a "$COORD_SOCK")
    [ "$_mode" = 666 ] || { echo "socket mode $_mode"; return 1; }
    echo "job $ROOTJOB"
}
check "root submits a job; the socket is open to all (mode 666)" t_root_submit

# root_view FILE: root's view of its job (show and events, --json)
root_view() {
    ctl --json show "$ROOTJOB" >"$1" && ctl --json events "$ROOTJOB" >>"$1"
}
root_view "$TMPD/root.before"

t_nobody_list() {
    run_rc 0 nctl --json list && out_lacks '"id"' &&
        run_rc 0 nctl list && out_lacks "^ *$ROOTJOB " && out_lacks rootjob
}
check "nobody's list shows nothing of root's" t_nobody_list

t_nobody_denied() {
    for _c in show cancel events checkpoints; do
        run_rc 5 nctl "$_c" "$ROOTJOB" && out_has "permission denied" || return 1
    done
    run_rc 5 nctl cancel --reason mine "$ROOTJOB" || return 1
    root_view "$TMPD/root.after"
    cmp "$TMPD/root.before" "$TMPD/root.after" ||
        { diff "$TMPD/root.before" "$TMPD/root.after"; return 1; }
}
check "nobody: show/cancel/events/checkpoints of root's job exit 5; the job is unchanged" \
    t_nobody_denied

t_nobody_submit() {
    run_rc 0 nctl submit --kind attn --model tiny --tokens 2048 --ranks 2 --gpu cpu \
        --name nobodyjob || return 1
    NOBJOB=$(cat "$TMPD/out")
    case $NOBJOB in
    '' | *[!0-9]*) echo "submit printed '$NOBJOB'"; return 1 ;;
    esac
    run_rc 0 nctl --json list && ids_are "$NOBJOB" || return 1
    run_rc 0 nctl show "$NOBJOB" && out_has "owner +nobody" && echo "job $NOBJOB"
}
check "nobody submits its own job and sees only it" t_nobody_submit

t_root_sees_all() {
    run_rc 0 ctl --json list && ids_are "$ROOTJOB $NOBJOB" && run_rc 0 ctl events "$NOBJOB"
}
check "root (admin) sees both jobs" t_root_sees_all

# ---- TCP: munge credentials ------------------------------------------------------

t_tcp_noauth() {
    run_rc 3 probe_tcp --keep-going LIST PING || return 1
    sed -n 1p "$TMPD/out" | grep -q '^ERROR code=-13 .*authenticate first' &&
        sed -n 2p "$TMPD/out" | grep -q '^CLOSED' || { cat "$TMPD/out"; return 1; }
}
check "TCP without AUTH: ERROR 'authenticate first', then the connection closes" t_tcp_noauth

t_tcp_badauth() {
    run_rc 3 probe_tcp --bad-auth --keep-going LIST &&
        sed -n 1p "$TMPD/out" | grep -q '^ERROR code=-13 .*munge credential refused' &&
        sed -n 2p "$TMPD/out" | grep -q '^CLOSED' || { cat "$TMPD/out"; return 1; }
}
check "TCP with a bogus credential is refused and closed" t_tcp_badauth

t_tcp_foreign() {
    # a real credential, from a munged with another key (another realm)
    _ms=$MUNGE_SOCKET _md=$MUNGE_DIR _mp=$MUNGED_PID
    munge_start "$TMPD/munge-foreign"
    _fs=$MUNGE_SOCKET _fp=$MUNGED_PID
    MUNGE_SOCKET=$_ms MUNGE_DIR=$_md MUNGED_PID=$_mp
    run_rc 3 "$DTPROBE" --tcp "127.0.0.1:$COORD_PORT" --munge-socket "$_fs" --auth --keep-going \
        LIST
    _rc=$?
    stop_pid "$_fp"
    [ "$_rc" -eq 0 ] || return 1
    sed -n 1p "$TMPD/out" | grep -q '^ERROR code=-13 .*munge credential refused' &&
        sed -n 2p "$TMPD/out" | grep -q '^CLOSED' || { cat "$TMPD/out"; return 1; }
    head -n 1 "$TMPD/out" | sed 's/.*"error":"\([^"]*\)".*/\1/'
}
check "TCP with a credential from another munge key is refused and closed" t_tcp_foreign

t_tcp_replay() {
    rm -f "$TMPD/cred"
    run_rc 0 probe_tcp --auth --cred-file "$TMPD/cred" LIST || return 1
    [ -s "$TMPD/cred" ] || { echo "no credential saved"; return 1; }
    run_rc 1 probe_tcp --auth --cred-file "$TMPD/cred" LIST && out_has '^ERROR .*[Rr]eplayed' &&
        out_lacks '^OK'
}
check "TCP with a replayed credential is refused ('replayed')" t_tcp_replay

t_tcp_nobody() {
    run_rc 0 as_nobody "$DTPROBE" --tcp "127.0.0.1:$COORD_PORT" --munge-socket "$MUNGE_SOCKET" \
        --auth LIST || return 1
    out_has "\"id\":${NOBJOB}[,}]" && out_lacks "\"id\":${ROOTJOB}[,}]" || return 1
    run_rc 1 as_nobody "$DTPROBE" --tcp "127.0.0.1:$COORD_PORT" --munge-socket "$MUNGE_SOCKET" \
        --auth SHOW "{\"id\": $ROOTJOB}" && out_has "permission denied"
}
check "TCP with nobody's valid credential: nobody's jobs only" t_tcp_nobody

t_tcp_root() {
    run_rc 0 probe_tcp --auth LIST && out_has "\"id\":${ROOTJOB}[,}]" &&
        out_has "\"id\":${NOBJOB}[,}]"
}
check "TCP with root's valid credential: every job" t_tcp_root

# libmunge takes its socket from MUNGE_OPT_SOCKET only (munge.h; the library
# reads no environment variable), and dtctl sets none: it always talks to
# /run/munge/munge.socket.2. So dtctl --coord runs in a private mount
# namespace where a tmpfs hides the host's /run and our munge directory is
# bound on /run/munge; nothing outside the namespace changes. Where
# namespaces are not allowed the check is skipped with a message.
in_ns() {
    unshare --mount --propagation private sh -c '
        mount -t tmpfs dt-test /run || exit 90
        if [ "$1" = with-munge ]; then
            mkdir /run/munge && mount --bind "$2" /run/munge || exit 90
        fi
        shift 2
        exec "$@"' sh "$@"
}

t_dtctl_coord() {
    run_rc 0 in_ns with-munge "$MUNGE_DIR" "$DTCTL" --coord "127.0.0.1:$COORD_PORT" --json list &&
        ids_are "$ROOTJOB $NOBJOB" || return 1
    run_rc 0 in_ns with-munge "$MUNGE_DIR" setpriv --reuid=nobody --regid="$NOBODY_GROUP" \
        --clear-groups "$DTCTL" --coord "127.0.0.1:$COORD_PORT" --json list &&
        ids_are "$NOBJOB" || return 1
    run_rc 5 in_ns with-munge "$MUNGE_DIR" setpriv --reuid=nobody --regid="$NOBODY_GROUP" \
        --clear-groups "$DTCTL" --coord "127.0.0.1:$COORD_PORT" cancel "$ROOTJOB" || return 1
    # no munged at all: exit 3 with a hint
    run_rc 3 in_ns without - "$DTCTL" --coord "127.0.0.1:$COORD_PORT" list &&
        out_has "munged running"
}
if unshare --mount --propagation private true 2>/dev/null; then
    check "dtctl --coord: root sees all, nobody its own, no munged exits 3" t_dtctl_coord
else
    echo "skip dtctl --coord: mount namespaces are not allowed here (not counted)"
fi

# ---- admin_group -----------------------------------------------------------------

ADMIN_GROUP=dtadm$$
if getent group "$ADMIN_GROUP" >/dev/null; then
    die "group $ADMIN_GROUP already exists"
fi
# shellcheck disable=SC2034 # run by coordlib's exit trap
DT_EXIT_HOOK='getent group "$ADMIN_GROUP" >/dev/null && groupdel "$ADMIN_GROUP"'
groupadd "$ADMIN_GROUP" || die "groupadd $ADMIN_GROUP failed"
gpasswd -a nobody "$ADMIN_GROUP" >/dev/null || die "cannot add nobody to $ADMIN_GROUP"

reloaded_more() {
    [ "$(grep -c 'configuration reloaded' "$COORD_LOG")" -gt "$1" ]
}

t_admin_group() {
    # before the reload, membership alone changes nothing
    run_rc 0 nctl --json list && ids_are "$NOBJOB" || return 1
    _n=$(grep -c 'configuration reloaded' "$COORD_LOG")
    COORD_CONF_EXTRA="admin_group = $ADMIN_GROUP"
    coord_write_conf
    kill -s HUP "$COORD_PID"
    wait_for 5 reloaded_more "$_n" || { echo "no reload in the log"; return 1; }
    run_rc 0 nctl --json list && ids_are "$ROOTJOB $NOBJOB" || return 1
    run_rc 0 nctl show "$ROOTJOB" && out_has "rootjob"
}
check "nobody in admin_group sees every job after SIGHUP" t_admin_group

t_admin_revoked() {
    _n=$(grep -c 'configuration reloaded' "$COORD_LOG")
    # shellcheck disable=SC2034 # read by coord_write_conf
    COORD_CONF_EXTRA=
    coord_write_conf
    kill -s HUP "$COORD_PID"
    wait_for 5 reloaded_more "$_n" || { echo "no reload in the log"; return 1; }
    run_rc 5 nctl show "$ROOTJOB"
}
check "admin_group removed by SIGHUP: root's job is denied again" t_admin_revoked

# ---- names with control characters ----------------------------------------------
# Text with ESC sequences or newlines is refused where it enters (an agent's
# node name and other strings, a submitted name, a cancel's reason), and
# what is stored already (a row written before names were checked) is shown
# escaped by every dtctl output, so it can neither drive root's terminal
# nor forge a line.

ESC=$(printf '\033')
CR=$(printf '\r')
if command -v sqlite3 >/dev/null 2>&1; then
    HAVE_SQLITE=1
else
    HAVE_SQLITE=
    echo "skip the database checks of this part: the sqlite3 CLI is not installed (not counted)"
fi
dbq() {
    if [ -n "$HAVE_SQLITE" ]; then
        sqlite3 "$COORD_STATE/dt.db" "$1"
    else
        echo "-"
    fi
}
# nprobe ARGS...: dtprobe as nobody over TCP, authenticated as nobody
nprobe() {
    as_nobody "$DTPROBE" --tcp "127.0.0.1:$COORD_PORT" --munge-socket "$MUNGE_SOCKET" --auth "$@"
}
# raw_free FILE: FILE has no ESC and no CR byte
raw_free() {
    ! grep -q "[$ESC$CR]" "$1" || { echo "raw control bytes in the output:"; od -c "$1" | head; return 1; }
}

t_register_control() {
    _n0=$(dbq 'SELECT count(*) FROM agents')
    run_rc 1 nprobe REGISTER "{\"job\": $NOBJOB, \"node\": \"\\u001b[2J\\u001b[H\", \"slots\": 1}" &&
        out_has "^ERROR code=-22 .*register: field 'node': control character ..x1b at byte 0" ||
        return 1
    run_rc 1 nprobe REGISTER "{\"job\": $NOBJOB, \"slots\": 1,
        \"node\": \"n1\\n2026-01-01 00:00:00  agent_lost  lost  forged\"}" &&
        out_has "^ERROR code=-22 .*field 'node': control character ..x0a at byte 2" || return 1
    [ "$(dbq 'SELECT count(*) FROM agents')" = "$_n0" ] || { echo "an agent was stored"; return 1; }
    grep -q "registration refused: field 'node': control character" "$COORD_LOG" ||
        { echo "no log line"; return 1; }
    raw_free "$COORD_LOG" || return 1
    run_rc 0 nctl events "$NOBJOB" && out_lacks forged && out_lacks agent_registered
}
check "an agent's node name with ESC or a newline is refused; nothing stored or logged raw" \
    t_register_control

t_agent_strings() {
    _n0=$(dbq 'SELECT count(*) FROM shards')
    run_rc 1 nprobe --keep-going REGISTER "{\"job\": $NOBJOB, \"node\": \"n-ok\", \"slots\": 1}" \
        SHARD_WRITTEN "{\"agent\": \"\$agent\", \"step\": 1, \"rank\": 0, \"bytes\": 1,
            \"path\": \"/ck/\\u001b[2J\", \"sha256\": \"$(printf '%064d' 0)\"}" \
        PREEMPT '{"agent": "$agent", "signal": "USR1\u001b[2J"}' || return 1
    sed -n 1p "$TMPD/out" | grep -q '^OK' &&
        sed -n 2p "$TMPD/out" | grep -q "^ERROR code=-22 .*field 'path': control character" &&
        sed -n 3p "$TMPD/out" | grep -q "^ERROR code=-22 .*field 'signal'" ||
        { cat "$TMPD/out"; return 1; }
    [ "$(dbq 'SELECT count(*) FROM shards')" = "$_n0" ] || { echo "a shard was stored"; return 1; }
}
check "an agent's shard path and signal name with ESC are refused" t_agent_strings

t_submit_cancel_control() {
    _n0=$(dbq 'SELECT count(*) FROM jobs')
    _spec='kind = attn\nmodel = tiny\ntokens = 2048\nranks = 1\ngpu = cpu\n'
    run_rc 1 as_nobody "$DTPROBE" --socket "$COORD_SOCK" SUBMIT \
        "{\"spec\": \"$_spec\", \"name\": \"\\u001b]0;owned\\u0007\"}" &&
        out_has "^ERROR code=-22 .*field 'name': control character ..x1b at byte 0" || return 1
    [ "$(dbq 'SELECT count(*) FROM jobs')" = "$_n0" ] || { echo "a job was stored"; return 1; }
    run_rc 1 as_nobody "$DTPROBE" --socket "$COORD_SOCK" CANCEL \
        "{\"id\": $NOBJOB, \"reason\": \"bye\\n2026-01-01 00:00:00  completed  forged\"}" &&
        out_has "^ERROR code=-22 .*field 'reason': control character ..x0a at byte 3" || return 1
    # dtctl says so too, escaped, as bad usage
    run_rc 2 nctl cancel --reason "$(printf 'a\033[2J')" "$NOBJOB" &&
        out_has "^dtctl cancel: field 'reason': control character .x1b at byte 1" &&
        raw_free "$TMPD/out" || return 1
    run_rc 0 nctl --json show "$NOBJOB" && [ "$(json_str state <"$TMPD/out" | head -n 1)" = queued ]
}
check "SUBMIT name and CANCEL reason with control characters are refused; the job stays" \
    t_submit_cancel_control

t_stored_escaped() {
    BADJOB=$(ctl submit --kind attn --model tiny --tokens 2048 --ranks 1 --gpu cpu --name badrows)
    ODDJOB=$(ctl submit --kind attn --model tiny --tokens 2048 --ranks 1 --gpu cpu --name odd)
    # rows as a coordinator without these checks could have stored them
    dbq "UPDATE jobs SET name = 'evil' || char(27) || '[2J' || char(27) || '[H',
             reason = 'why' || char(10) || '99  x  root  completed  -  forged'
         WHERE id = $BADJOB;
         UPDATE jobs SET name = 'odd' || CAST(X'FF' AS TEXT) WHERE id = $ODDJOB;
         INSERT INTO events (job_id, at_ms, kind, state, detail) VALUES ($BADJOB,
             1700000000000, 'note', 'queued', 'x' || char(13) || char(27) || '[1A' ||
             char(10) || '123  2026-01-01 00:00:00  completed  completed  all done');
         INSERT INTO agents (job_id, node, slots, state, registered_ms, last_seen_ms)
         VALUES ($BADJOB, 'n' || char(27) || ']0;t' || char(7), 1, 'lost', 1700000000000,
             1700000000000);" || return 1
    run_rc 0 ctl list && raw_free "$TMPD/out" && out_has "^ *$BADJOB +evil\\\\x1b\\[2J\\\\x1b\\[H " &&
        out_has "^ *$ODDJOB +odd\\\\xff " && out_has 'why\\n99  x' && out_lacks '^99 ' || return 1
    run_rc 0 ctl show "$BADJOB" && raw_free "$TMPD/out" &&
        out_has "^job $BADJOB  evil\\\\x1b\\[2J" && out_has 'n\\x1b]0;t\\x07' &&
        out_lacks '^99 ' || return 1
    run_rc 0 ctl events "$BADJOB" && raw_free "$TMPD/out" && out_has 'x\\r\\x1b\[1A\\n123' &&
        out_lacks '^ *123 ' || return 1
    _ne=$(ctl --json events "$BADJOB" | json_num id | wc -l)
    [ "$(wc -l <"$TMPD/out")" -eq $((_ne + 1)) ] || { echo "not one line per event"; return 1; }
    "$DT_TIMEOUT" 2 "$DTCTL" --socket "$COORD_SOCK" watch "$BADJOB" >"$TMPD/out" 2>&1
    raw_free "$TMPD/out" && out_has "^job $BADJOB evil\\\\x1b" || return 1
    # --json: jansson writes \u001b; the documents parse
    for _c in list "show $BADJOB" "events $BADJOB" "show $ODDJOB"; do
        # shellcheck disable=SC2086 # _c is a command and its argument
        run_rc 0 ctl --json $_c && raw_free "$TMPD/out" || return 1
        if command -v python3 >/dev/null 2>&1; then
            python3 -m json.tool "$TMPD/out" >/dev/null || { echo "--json $_c: not JSON"; return 1; }
        fi
    done
    out_has '"name": "odd\\\\xff"' || return 1
    echo "list, show, events, watch escaped; --json valid"
}
if [ -n "$HAVE_SQLITE" ] && [ -n "$DT_TIMEOUT" ]; then
    check "names, reasons, events and nodes stored with ESC, CR, LF or bad UTF-8 are shown escaped" \
        t_stored_escaped
else
    echo "skip stored rows shown escaped: needs the sqlite3 CLI and timeout(1) (not counted)"
fi

# ---- the end: nothing left ---------------------------------------------------------

coord_stop
munge_stop
t_cleanup() {
    groupdel "$ADMIN_GROUP" || return 1
    ! getent group "$ADMIN_GROUP" >/dev/null || { echo "group $ADMIN_GROUP still there"; return 1; }
    none_left
}
check "group removed, no process left behind" t_cleanup

finish
