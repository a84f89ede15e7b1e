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
    run_rc 0 nctl submit --kind attn --model tiny --tokens 2048 --ranks 1 --gpu cpu \
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
