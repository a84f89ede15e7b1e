#!/bin/sh
# SPDX-License-Identifier: MIT
#
# The agent's PMIx server (agent/pmix.c, behind agent/accept_gate.c) with
# real Open MPI ranks, through tests/tools/pmixhost (a libuv host like dtagentd) and tests/tools/pmixworker (MPI_Init,
# a ring of MPI_Sendrecv, MPI_Allreduce, a PMIx failure-event handler). It
# checks what the agent's users would see: every rank's sum, exit codes,
# fences that reach the host (local-only optimisation off, and two agents of
# one job whose coordinator is a directory), a constant number of open fds
# over 10 generations in one process, a killed rank's survivors getting the
# failure event and leaving with status 4 while blocked in MPI with none left
# running and no shared-memory segment left behind, a fence nobody answers
# failed after DT_PMIX_CB_TIMEOUT_MS, the workers' environment, a client
# that stalls in its handshake (cut off by the accept gate after
# DT_ACCEPT_GATE_HANDSHAKE_TIMEOUT_MS while the ranks still start; one that
# keeps libpmix reading does not keep dt_pmix_free past
# DT_PMIX_FINALIZE_TIMEOUT_MS), and bad input refused
# with a message. It skips (77) only when libpmix cannot start a server
# here. Latencies are printed, never asserted.

. "$(dirname "$0")/lib.sh"
# agents on one host reach each other over loopback; the agent passes the
# site's interface choice on to its workers
OMPI_MCA_btl_tcp_if_include=lo
export OMPI_MCA_btl_tcp_if_include

PMIXHOST=$DT_BUILDDIR/tests/tools/pmixhost
PMIXWORKER=$DT_BUILDDIR/tests/tools/pmixworker
for _b in "$PMIXHOST" "$PMIXWORKER"; do
    [ -x "$_b" ] || die "$_b is not built (make tests/tools/pmixhost tests/tools/pmixworker)"
done

# host NAME ARGS...: pmixhost with its own files under $TMPD/NAME; stdout
# in $TMPD/NAME.out, stderr in $TMPD/NAME.err, exit status in $TMPD/NAME.rc
host() {
    _h_name=$1
    shift
    rm -rf "$TMPD/$_h_name"
    if [ -n "$DT_TIMEOUT" ]; then
        "$DT_TIMEOUT" 120 "$PMIXHOST" --tmpdir "$TMPD/$_h_name" "$@"
    else
        "$PMIXHOST" --tmpdir "$TMPD/$_h_name" "$@"
    fi >"$TMPD/$_h_name.out" 2>"$TMPD/$_h_name.err"
    echo $? >"$TMPD/$_h_name.rc"
}

# the worker is found by the hosts below
W="--worker $PMIXWORKER"

# expect_rc NAME RC: the run's status, else its output
expect_rc() {
    _e_rc=$(cat "$TMPD/$1.rc")
    [ "$_e_rc" = "$2" ] && return 0
    echo "$1: exit $_e_rc, want $2"
    tail -n 30 "$TMPD/$1.out" "$TMPD/$1.err"
    return 1
}

# has NAME REGEX [COUNT]: lines of NAME's stdout matching (exactly COUNT)
has() {
    _n=$(grep -c -E -e "$2" "$TMPD/$1.out")
    if [ $# -ge 3 ]; then
        [ "$_n" = "$3" ] && return 0
        echo "$1: $_n lines match '$2', want $3"
    else
        [ "$_n" -gt 0 ] && return 0
        echo "$1: no line matches '$2'"
    fi
    tail -n 30 "$TMPD/$1.out"
    return 1
}

# ---- can a server start here at all ------------------------------------------

host probe --refusals
case $(cat "$TMPD/probe.rc") in
3)
    sed 's/^/    /' "$TMPD/probe.out" "$TMPD/probe.err" | head -20
    skip "libpmix cannot start a PMIx server on this host (output above)"
    ;;
esac

t_refusals() {
    expect_rc probe 0 && has probe "refused as expected" 12 &&
        has probe "^pmixhost: refusals all as expected$" 1 &&
        echo "$(grep -c 'refused as expected' "$TMPD/probe.out") bad calls refused with a message"
}
check "API refusals: bad layouts, ranks, a second server" t_refusals

# ---- one generation -------------------------------------------------------------

t_one() {
    host one $W --ranks 4
    expect_rc one 0 || return 1
    for r in 0 1 2 3; do
        has one "^pmixworker: rank $r of 4 ring ok sum 10$" 1 || return 1
    done
    has one "^pmixhost: gen 1 rank [0-3] exited 0 signal 0$" 4 &&
        has one "^pmixhost: gen 1 fences 0$" 1 && has one "^pmixhost: gen 1 ok" 1 &&
        echo "4 ranks: ring ok, sum 10 on each, all exited 0, no fence reached the host"
}
check "4 ranks, one generation: sums and exit codes" t_one

t_fakename() {
    host fake $W --ranks 3 --nodes node-a
    expect_rc fake 0 && has fake "ring ok sum 6$" 3 && has fake "^pmixhost: gen 1 ok" 1
}
check "a node name that is not the host name" t_fakename

# ---- fences through the host ---------------------------------------------------

t_relay() {
    host relay $W --ranks 4 --relay
    expect_rc relay 0 && has relay "ring ok sum 10$" 4 && has relay "^pmixhost: gen 1 ok" 1 ||
        return 1
    _f=$(sed -n 's/^pmixhost: gen 1 fences \([0-9]*\)$/\1/p' "$TMPD/relay.out")
    _s=$(grep -c '^pmixhost: gen 1 fence seq ' "$TMPD/relay.out")
    [ "${_f:-0}" -ge 2 ] && [ "$_f" = "$_s" ] || {
        echo "fences '$_f', seq lines $_s: want 2 or more, equal"
        return 1
    }
    _i=1
    while [ "$_i" -le "$_f" ]; do
        has relay "^pmixhost: gen 1 fence seq $_i bytes " 1 || return 1
        _i=$((_i + 1))
    done
    echo "$_f fences relayed, numbered 1..$_f, all ranks ok"
}
check "fence relay path (fence_localonly_opt=0)" t_relay

t_two_agents() {
    mkdir -p "$TMPD/coord" || return 1
    host agent1 $W --ranks 4 --nodes n0,n1 --self n1 --job dt.two --fence-dir "$TMPD/coord" &
    _pid=$!
    host agent0 $W --ranks 4 --nodes n0,n1 --self n0 --job dt.two --fence-dir "$TMPD/coord"
    wait $_pid
    expect_rc agent0 0 && expect_rc agent1 0 || return 1
    has agent0 "^pmixworker: rank [01] of 4 ring ok sum 10$" 2 &&
        has agent1 "^pmixworker: rank [23] of 4 ring ok sum 10$" 2 &&
        has agent0 "^pmixhost: gen 1 ok: 2 ranks here of 4" 1 &&
        has agent1 "^pmixhost: gen 1 ok: 2 ranks here of 4" 1 &&
        echo "2 servers x 2 ranks: ring across agents, $(ls "$TMPD/coord" | wc -l) fence parts"
}
check "two agents of one job, fences concatenated across them" t_two_agents

t_fence_timeout() {
    host drop $W --ranks 2 --relay --drop-fence 1
    expect_rc drop 0 && has drop "^pmixhost: gen 1 ok: fence seq 1 dropped" 1 || return 1
    grep -q "gen=1 fence seq=1 not completed in 10000 ms: failing it" "$TMPD/drop.err" || {
        echo "no timeout message on stderr:"
        cat "$TMPD/drop.err"
        return 1
    }
    sed -n 's/^pmixhost: gen 1 ok: //p' "$TMPD/drop.out"
}
check "a fence nobody answers fails after 10 s and frees the ranks" t_fence_timeout

# ---- generations ------------------------------------------------------------------

t_gens() {
    host gens $W --ranks 4 --gens 10
    expect_rc gens 0 && has gens "^pmixhost: gen [0-9]+ ok" 10 && has gens "ring ok sum 10$" 40 ||
        return 1
    _fds=$(sed -n 's/^pmixhost: gen [0-9]* fds \([0-9]*\)$/\1/p' "$TMPD/gens.out" | sort -u)
    [ "$(echo "$_fds" | wc -l)" = 1 ] && [ -n "$_fds" ] || {
        echo "open fds after each generation differ:"
        grep "fds" "$TMPD/gens.out"
        return 1
    }
    [ -z "$(ls -A "$TMPD/gens")" ] || {
        echo "left in the server's directory:"
        ls -lA "$TMPD/gens"
        return 1
    }
    echo "10 generations x 4 ranks, $_fds fds open after each"
}
check "10 generations in one process: constant fds, nothing left" t_gens

# ---- a rank killed -------------------------------------------------------------------

# alive NAME: the pids NAME's host spawned that still run pmixworker
alive() {
    for _p in $(sed -n 's/^pmixhost: gen [0-9]* rank [0-9]* pid \([0-9]*\)$/\1/p' \
        "$TMPD/$1.out"); do
        ps -o comm= -p "$_p" 2>/dev/null | grep -q pmixworker && echo "$_p"
    done
}

# The grace period is how long the host lets the survivors of a failure
# take to leave on their own before it kills them: a deadline that only a
# failing run reaches, not a wait (a passing run ends when they have left).
# It runs from the notification, which for --notify-early comes before the
# ranks have even started, and sanitized ranks take seconds to get
# through MPI_Init: 50 s, under pmixhost's 60 s watchdog.
GRACE=50000

# t_kill NAME RANK: rank killed, the three others must report and exit 4
t_kill() {
    host "$1" $W --ranks 4 --kill "$2" --hold 30 --grace $GRACE
    _k=$2
    expect_rc "$1" 0 && has "$1" "ring ok sum 10$" 4 &&
        has "$1" "^pmixhost: gen 1 rank $_k exited 0 signal 9" 1 &&
        has "$1" "^pmixworker: rank [0-3] got failure of rank $_k after" 3 &&
        has "$1" "^pmixhost: gen 1 rank [0-3] exited 4 signal 0 after" 3 &&
        has "$1" "still running after the grace period" 0 || return 1
    _left=$(alive "$1")
    [ -z "$_left" ] || {
        echo "still running: $_left"
        return 1
    }
    [ -z "$(find "$TMPD/$1" -name '*vader*')" ] && [ -z "$(ls -A "$TMPD/$1")" ] || {
        echo "left behind:"
        find "$TMPD/$1"
        return 1
    }
    sed -n 's/^pmixhost: gen 1 ok: //p' "$TMPD/$1.out"
}
check "kill rank 1: survivors get the event in MPI_Barrier and exit 4" t_kill kill1 1
check "kill rank 0 (the one the others wait for)" t_kill kill0 0

t_early() {
    host early $W --ranks 3 --notify-early 2 --grace $GRACE
    _left=$(alive early)
    expect_rc early 0 && has early "^pmixworker: rank [01] got failure of rank 2 after" 2 &&
        has early "still running after the grace period" 0 && [ -z "$_left" ] &&
        sed -n 's/^pmixhost: gen 1 ok: //p' "$TMPD/early.out"
}
check "a failure notified before the ranks registered reaches them" t_early

# ---- a client that stalls in its handshake -------------------------------------------

t_stall_gen() {
    host stallg $W --ranks 2 --stall gen
    expect_rc stallg 0 && has stallg "ring ok sum 3$" 2 && has stallg "^pmixhost: gen 1 ok" 1 ||
        return 1
    _ms=$(sed -n 's/^pmixhost: stalled connection closed by the server after \([0-9]*\) ms$/\1/p' \
        "$TMPD/stallg.out")
    [ -n "$_ms" ] && [ "$_ms" -ge 4000 ] && [ "$_ms" -lt 10000 ] || {
        echo "closed after '$_ms' ms, want 5000:"
        grep stalled "$TMPD/stallg.out"
        return 1
    }
    echo "cut off after $_ms ms, both ranks ok"
}
check "a client silent in its handshake is cut off after 5 s; the ranks still start" t_stall_gen

t_stall_end() {
    host stalle $W --ranks 2 --stall end
    expect_rc stalle 0 && has stalle "^pmixhost: gen 1 ok" 1 &&
        has stalle "^pmixhost: dt_pmix_free returned after [0-9]+ ms, finalize abandoned$" 1 &&
        has stalle "^pmixhost: ok$" 1 || return 1
    grep -q "PMIx_server_finalize did not return in 5000 ms" "$TMPD/stalle.err" || {
        echo "no message on stderr:"
        cat "$TMPD/stalle.err"
        return 1
    }
    sed -n 's/^pmixhost: dt_pmix_free returned after //p' "$TMPD/stalle.out"
}
check "a client that keeps libpmix reading: dt_pmix_free gives up after 5 s, exit 0" t_stall_end

# ---- the workers' environment -------------------------------------------------------

t_env_one() {
    (
        PMIX_SERVER_URI4=bogus PMIX_RANK=9 OMPI_COMM_WORLD_RANK=9
        export PMIX_SERVER_URI4 PMIX_RANK OMPI_COMM_WORLD_RANK
        host env1 --ranks 2 --show-env 1
    )
    expect_rc env1 0 && has env1 "^env OMPI_MCA_schizo=\^orte$" 1 &&
        has env1 "^env OMPI_MCA_ess=pmi$" 1 && has env1 "^env OMPI_MCA_btl=self,vader$" 1 &&
        has env1 "^env OMPI_MCA_btl_vader_backing_directory=$TMPD/env1/gen\." 1 &&
        has env1 "^env PMIX_RANK=1$" 1 && has env1 "^env PMIX_NAMESPACE=" 1 &&
        has env1 "^env PMIX_SERVER_URI4=bogus" 0 && has env1 "OMPI_COMM_WORLD_RANK" 0 &&
        has env1 "^env PMIX_MCA_gds=hash$" 1
}
check "worker env: Open MPI settings, another launcher's identity dropped" t_env_one

t_env_two() {
    host env2 --ranks 4 --nodes n0,n1 --self n1 --show-env 3
    expect_rc env2 0 && has env2 "^env OMPI_MCA_btl=self,vader,tcp$" 1 &&
        has env2 "^env OMPI_MCA_btl_tcp_if_include=lo$" 1 && has env2 "^env PMIX_HOSTNAME=n1$" 1
}
check "worker env of a job on two nodes: tcp between agents, the agent's interface choice kept" t_env_two

# ---- refused from the command line ----------------------------------------------------

# refused NAME RC REGEX ARGS...: pmixhost ARGS exits RC and says REGEX
refused() {
    _r_name=$1 _r_rc=$2 _r_re=$3
    shift 3
    host "$_r_name" "$@"
    expect_rc "$_r_name" "$_r_rc" || return 1
    grep -q -E -e "$_r_re" "$TMPD/$_r_name.out" "$TMPD/$_r_name.err" || {
        echo "no message matching '$_r_re':"
        cat "$TMPD/$_r_name.out" "$TMPD/$_r_name.err"
        return 1
    }
    grep -h -E -e "$_r_re" "$TMPD/$_r_name.out" "$TMPD/$_r_name.err" | head -n 1
}
check "refused: --ranks 0" refused bad1 2 "--ranks 0: not a number from 1 to 64" $W --ranks 0
check "refused: --kill outside the job" refused bad2 2 "--kill 4: only ranks 0 to 3" \
    $W --ranks 4 --kill 4
check "refused: this node not in --nodes" refused bad3 1 \
    "this node \(nx\) is not among the job's nodes" $W --nodes n0,n1 --self nx
check "refused: unknown option" refused bad4 2 "unknown or incomplete option --frob" $W --frob
: >"$TMPD/afile"
t_baddir() {
    _o=$("$PMIXHOST" --tmpdir "$TMPD/afile/pmix" $W 2>&1)
    _rc=$?
    [ $_rc = 1 ] && echo "$_o" | grep -q "cannot start the PMIx server: .*afile.*Not a directory" ||
        {
            echo "exit $_rc: $_o"
            return 1
        }
    echo "$_o" | grep "cannot start"
}
check "refused: a server directory under a regular file" t_baddir

finish
