#!/bin/sh
# SPDX-License-Identifier: MIT
#
# `dtctl run --local`, `dtctl watch` and `dtctl checkpoint` as a user meets
# them. First what needs no working agent: mistakes refused before anything
# starts (a bad SPECFILE, --inject-failure, counts, no --local), a state
# directory that a running coordinator holds (pidfile locked, or only its
# socket answering), a coordinator that fails or never answers, agents that
# exit at once, a job the planner refuses, SIGTERM and a double SIGINT
# while stand-in agents run (the job is cancelled in the database), and
# after each that no process is left (stand-in agents that ignore SIGTERM,
# keep children, or leave a setsid orphan included); watch until a job is
# cancelled, and its errors. Then end to end with the real dtagentd and
# dtengine: the default job completes with a well-formed `result:` line,
# a small job completes, and with each injected failure (worker, hang,
# agent with a spare, coordinator) or a checkpoint requested while it runs
# it still completes, with the fault-free run's checksum; `dtctl plot` of
# the worker fault's run (valid SVG, rendered by rsvg-convert with drawn
# plot areas, the failure's cost labelled) and its refusals, through a
# state directory and through a running coordinator.
# Timings are never asserted.

. "$(dirname "$0")/lib.sh"
. "$DT_TESTDIR/coordlib.sh"

DTAGENTD=$DT_BUILDDIR/agent/dtagentd
unset DT_COORDD DT_AGENTD DT_ENGINE DT_SOCKET DT_COORD

# tmo SECONDS CMD...: CMD, killed (TERM) after SECONDS where timeout(1) exists
tmo() {
    if [ -n "$DT_TIMEOUT" ]; then
        "$DT_TIMEOUT" "$@"
    else
        shift
        "$@"
    fi
}

# nothing_left DIR [PIDFILE]: no live process has DIR in its command line,
# and none of the pids listed in PIDFILE is alive
nothing_left() {
    _nl_bad=0
    for _nl_d in /proc/[0-9]*; do
        _nl_cmd=$(tr '\0' ' ' 2>/dev/null <"$_nl_d/cmdline") || continue
        case $_nl_cmd in
        *"$1"*)
            if alive "${_nl_d#/proc/}"; then
                echo "left running: pid ${_nl_d#/proc/}: $_nl_cmd"
                _nl_bad=1
            fi
            ;;
        esac
    done
    if [ -n "${2:-}" ] && [ -f "$2" ]; then
        for _nl_p in $(cat "$2"); do
            if alive "$_nl_p"; then
                echo "left running: pid $_nl_p: $(tr '\0' ' ' <"/proc/$_nl_p/cmdline")"
                _nl_bad=1
            fi
        done
    fi
    return $_nl_bad
}

# stand-in programs for dtcoordd and dtagentd; each records its pid (and
# its children's) in $TMPD/pids
PIDS=$TMPD/pids
mkdir -p "$TMPD/bin"
cat >"$TMPD/bin/coordd-fails" <<EOF
#!/bin/sh
echo \$\$ >>"$PIDS"
echo "stand-in dtcoordd: refusing to start" >&2
exit 1
EOF
cat >"$TMPD/bin/coordd-silent" <<EOF
#!/bin/sh
echo \$\$ >>"$PIDS"
exec sleep 600
EOF
cat >"$TMPD/bin/agent-exits" <<EOF
#!/bin/sh
echo \$\$ >>"$PIDS"
echo "stand-in dtagentd: \$*" >&2
exit 1
EOF
# local1 ignores SIGTERM and has a child that does too; local2 has a child
# in its own session, orphaned when local2 ends
cat >"$TMPD/bin/agent-stubborn" <<EOF
#!/bin/sh
echo \$\$ >>"$PIDS"
case " \$* " in
*" local1 "*)
    trap '' TERM
    sleep 600 &
    echo \$! >>"$PIDS"
    while :; do sleep 1; done
    ;;
*)
    setsid sleep 601 &
    echo \$! >>"$PIDS"
    exec sleep 600
    ;;
esac
EOF
chmod +x "$TMPD/bin/"*

# ---- mistakes, found before anything starts --------------------------------

t_no_local() {
    run_rc 2 "$DTCTL" run --state-dir "$TMPD/s0" && out_has "only --local" &&
        [ ! -e "$TMPD/s0" ]
}
check "run without --local: exit 2, nothing created" t_no_local

t_bad_spec() {
    run_rc 2 "$DTCTL" run --local "$TMPD/missing.spec" --state-dir "$TMPD/s1" &&
        out_has "missing.spec" || return 1
    [ ! -e "$TMPD/s1" ] || { echo "the state directory was created"; return 1; }
    printf 'kind = train\ntokens = 1024\nfrobnicate = 1\n' >"$TMPD/bad.spec"
    run_rc 2 "$DTCTL" run --local "$TMPD/bad.spec" --state-dir "$TMPD/s1" &&
        out_has "bad.spec:3:.*frobnicate" && [ ! -e "$TMPD/s1" ] && head -n 1 "$TMPD/out"
}
check "a bad SPECFILE (missing, bad key): exit 2 naming the file" t_bad_spec

t_bad_inject() {
    for _v in disk worker@-1 worker@x worker@ hang@600 coordinator@1000; do
        run_rc 2 "$DTCTL" run --local --inject-failure "$_v" --state-dir "$TMPD/s2" &&
            out_has "inject-failure '$_v'" || return 1
    done
    [ ! -e "$TMPD/s2" ] && out_has "below 600" && head -n 1 "$TMPD/out"
}
check "bad --inject-failure values: exit 2 naming the value" t_bad_inject

t_bad_counts() {
    run_rc 2 "$DTCTL" run --local --agents 0 --state-dir "$TMPD/s3" && out_has "agents '0'" &&
        run_rc 2 "$DTCTL" run --local --workers x --state-dir "$TMPD/s3" &&
        out_has "workers 'x'" &&
        run_rc 2 "$DTCTL" run --local --steps -1 --state-dir "$TMPD/s3" && out_has "steps" &&
        run_rc 2 "$DTCTL" run --local --interval 1ms --state-dir "$TMPD/s3" &&
        out_has "interval" && [ ! -e "$TMPD/s3" ]
}
check "bad --agents, --workers, --steps, --interval: exit 2" t_bad_counts

# ---- a state directory that a coordinator holds ----------------------------

HELD=$TMPD/held
mkdir -p "$HELD"
printf 'state_dir = %s\nheartbeat = 200ms\nagent_timeout = 1s\n' "$HELD" >"$TMPD/held.conf"
"$DTCOORDD" -D -f "$TMPD/held.conf" >"$TMPD/held.log" 2>&1 &
HELD_PID=$!
track "$HELD_PID"
wait_for 10 "$DTCTL" --socket "$HELD/dtcoordd.sock" list || die "dtcoordd on $HELD did not start"

t_held() {
    run_rc 1 env DT_AGENTD="$TMPD/bin/agent-exits" "$DTCTL" run --local --state-dir "$HELD" &&
        out_has "coordinator \\(pid $HELD_PID\\) already runs in $HELD " || return 1
    alive "$HELD_PID" || { echo "the running coordinator was harmed"; return 1; }
    [ ! -e "$HELD/dt.conf" ] || { echo "dt.conf was written"; return 1; }
    [ "$(cat "$HELD/dtcoordd.pid")" = "$HELD_PID" ] && head -n 1 "$TMPD/out"
}
check "a state directory whose coordinator runs (pidfile locked): exit 1, untouched" t_held

HELD2=$TMPD/held2
mkdir -p "$HELD2"
printf 'state_dir = %s\npidfile = %s\n' "$HELD2" "$TMPD/held2.pid" >"$TMPD/held2.conf"
"$DTCOORDD" -D -f "$TMPD/held2.conf" >"$TMPD/held2.log" 2>&1 &
HELD2_PID=$!
track "$HELD2_PID"
wait_for 10 "$DTCTL" --socket "$HELD2/dtcoordd.sock" list || die "dtcoordd on $HELD2 did not start"

t_held_socket() {
    run_rc 1 env DT_AGENTD="$TMPD/bin/agent-exits" "$DTCTL" run --local --state-dir "$HELD2" &&
        out_has "already answers on $HELD2/dtcoordd.sock" && alive "$HELD2_PID" &&
        head -n 1 "$TMPD/out"
}
check "a state directory whose socket answers (pidfile elsewhere): exit 1" t_held_socket
stop_pid "$HELD2_PID"

# ---- watch and checkpoint, on the held coordinator ------------------------------

hctl() {
    "$DTCTL" --socket "$HELD/dtcoordd.sock" "$@"
}

t_watch_cancel() {
    run_rc 0 hctl submit --name w --kind train --model tiny --tokens 1024 --ranks 4 --gpu cpu \
        --steps 7 || return 1
    WJOB=$(cat "$TMPD/out")
    hctl watch --interval 100ms "$WJOB" >"$TMPD/watch.out" 2>&1 &
    _w_pid=$!
    track "$_w_pid"
    wait_for 10 grep -q "state queued" "$TMPD/watch.out" || {
        echo "no display line"
        cat "$TMPD/watch.out"
        stop_pid "$_w_pid"
        return 1
    }
    run_rc 0 hctl cancel --reason "by the test" "$WJOB" || return 1
    wait "$_w_pid"
    _w_rc=$?
    untrack "$_w_pid"
    cp "$TMPD/watch.out" "$TMPD/out"
    [ "$_w_rc" = 7 ] || { echo "watch exited $_w_rc, expected 7"; cat "$TMPD/out"; return 1; }
    out_has "^job $WJOB w  state queued  gen -  restarts 0  step 0/7  ETA -\$" &&
        out_has "^job $WJOB w cancelled\$" && out_has "reason +cancelled by uid [0-9]+: by the test" &&
        out_has "^result: job=$WJOB state=cancelled loss=- checksum=-\$" &&
        out_lacks "$(printf '\033')" && tail -n 1 "$TMPD/out"
}
check "watch: one line per change when not a tty; cancelled: summary, result, exit 7" \
    t_watch_cancel

t_watch_json() {
    run_rc 7 hctl watch --json "$WJOB" && [ "$(json_str state <"$TMPD/out")" = cancelled ] &&
        out_has '"checksum": null'
}
check "watch --json of an ended job: one object, exit 7" t_watch_json

t_watch_errors() {
    run_rc 4 hctl watch 999999 && out_has "not found" &&
        run_rc 2 hctl watch x && out_has "'x' is not a job id" &&
        run_rc 2 hctl watch --interval 5ms "$WJOB" && out_has "interval" &&
        run_rc 3 "$DTCTL" --socket "$TMPD/nothing.sock" watch 1 && out_has "nothing.sock"
}
check "watch: no such job 4, bad id 2, bad interval 2, no coordinator 3" t_watch_errors

t_checkpoint_errors() {
    run_rc 0 hctl submit --kind train --model tiny --tokens 1024 --ranks 4 --gpu cpu \
        --steps 7 || return 1
    _c_job=$(cat "$TMPD/out")
    run_rc 1 hctl checkpoint "$_c_job" && out_has "^dtctl checkpoint: " || return 1
    head -n 1 "$TMPD/out"
    run_rc 4 hctl checkpoint 999999 && out_has "not found" &&
        run_rc 2 hctl checkpoint 0 && run_rc 3 "$DTCTL" --socket "$TMPD/nothing.sock" checkpoint 1
}
check "checkpoint: a job with nothing running 1, no such job 4, bad id 2, no coordinator 3" \
    t_checkpoint_errors

t_plot_live() {
    run_rc 1 hctl plot "$WJOB" --svg "$TMPD/w.svg" &&
        out_has "^dtctl plot: job $WJOB has no steps recorded yet: nothing to plot\$" || return 1
    run_rc 4 hctl plot 999999 --svg "$TMPD/w.svg" && out_has "not found" &&
        run_rc 2 hctl plot "$WJOB" && out_has "--svg FILE is needed" &&
        run_rc 0 hctl --json plot "$WJOB" && [ "$(json_str state <"$TMPD/out" | head -n 1)" = cancelled ] &&
        [ ! -e "$TMPD/w.svg" ]
}
check "plot through a coordinator: no steps 1 (nothing to plot), no such job 4, no --svg 2, --json the data" \
    t_plot_live
stop_pid "$HELD_PID"

# ---- early failures leave nothing behind ----------------------------------------

t_coord_fails() {
    : >"$PIDS"
    run_rc 3 tmo 60 env DT_COORDD="$TMPD/bin/coordd-fails" "$DTCTL" run --local \
        --state-dir "$TMPD/s4" || return 1
    out_has "dtcoordd exited with status 1 at start-up; its log $TMPD/s4/dtcoordd.log" &&
        out_has "stand-in dtcoordd: refusing to start" && nothing_left "$TMPD/s4" "$PIDS"
}
check "a coordinator that fails to start: exit 3, its log quoted, nothing left" t_coord_fails

t_coord_silent() {
    : >"$PIDS"
    run_rc 3 tmo 60 env DT_COORDD="$TMPD/bin/coordd-silent" "$DTCTL" run --local \
        --state-dir "$TMPD/s5" || return 1
    out_has "did not answer on $TMPD/s5/dtcoordd.sock within" && nothing_left "$TMPD/s5" "$PIDS"
}
check "a coordinator that never answers: exit 3 after the timeout, nothing left" t_coord_silent

t_agents_exit() {
    : >"$PIDS"
    run_rc 1 tmo 120 env DT_AGENTD="$TMPD/bin/agent-exits" "$DTCTL" run --local --interval 100ms \
        --state-dir "$TMPD/s6" || return 1
    out_has "agent local1 \\(pid [0-9]+\\) exited with status 1; its log: $TMPD/s6/agents/local1.log" &&
        out_has "every agent has exited" && out_has "^job 1 cancelled" &&
        out_has "^result: job=1 state=cancelled loss=- checksum=-\$" &&
        out_has "state directory $TMPD/s6 kept" &&
        grep -q "stand-in dtagentd: --coord unix:$TMPD/s6/dtcoordd.sock --job 1 --node local1 --slots 2 --state-dir $TMPD/s6/agents/local1 --engine /" \
            "$TMPD/s6/agents/local1.log" && [ -f "$TMPD/s6/dt.db" ] &&
        nothing_left "$TMPD/s6" "$PIDS"
}
check "agents that exit at once: exit 1, the job cancelled, nothing left" t_agents_exit

t_refused() {
    : >"$PIDS"
    run_rc 6 tmo 60 env DT_AGENTD="$TMPD/bin/agent-exits" "$DTCTL" run --local --agents 3 \
        --state-dir "$TMPD/s7" && out_has "^dtctl run: " && [ ! -s "$PIDS" ] &&
        nothing_left "$TMPD/s7" && grep "^dtctl run: " "$TMPD/out" | head -n 1
}
check "a job the planner refuses (6 ranks over 1024 tokens): exit 6, no agent, nothing left" \
    t_refused

# npids N: $PIDS lists at least N pids
npids() {
    [ "$(wc -l <"$PIDS")" -ge "$1" ]
}

# run_bg DIR ARGS...: dtctl run --local in the background with stand-in
# agents; RUN_PID; waits until its agents have started
run_bg() {
    _rb_dir=$1
    shift
    : >"$PIDS"
    env DT_AGENTD="$TMPD/bin/agent-stubborn" "$DTCTL" run --local --interval 100ms \
        --state-dir "$_rb_dir" "$@" >"$TMPD/bg.out" 2>&1 &
    RUN_PID=$!
    track "$RUN_PID" # the exit trap stops it if a check gives up on it
    wait_for 20 grep -q "state queued" "$TMPD/bg.out" && wait_for 10 npids 4 && return 0
    echo "no display, or the stand-in agents did not start:"
    cat "$TMPD/bg.out"
    stop_pid "$RUN_PID"
    return 1
}

# run_bg_end: wait for the background dtctl run; RUN_RC, its output in $TMPD/out
run_bg_end() {
    wait "$RUN_PID"
    RUN_RC=$?
    untrack "$RUN_PID"
    cp "$TMPD/bg.out" "$TMPD/out"
}

# job_state DIR JOB: the job's state, from a coordinator started on DIR's dt.conf
job_state() {
    "$DTCOORDD" -D -f "$1/dt.conf" >>"$TMPD/js.log" 2>&1 &
    _js_pid=$!
    track "$_js_pid"
    wait_for 10 "$DTCTL" --socket "$1/dtcoordd.sock" list >/dev/null
    "$DTCTL" --socket "$1/dtcoordd.sock" --json show "$2" | json_str state | head -n 1
    stop_pid "$_js_pid"
}

t_sigterm() {
    run_bg "$TMPD/s8" || return 1
    kill -TERM "$RUN_PID"
    run_bg_end
    [ "$RUN_RC" = 143 ] || { echo "exit $RUN_RC, expected 143"; cat "$TMPD/out"; return 1; }
    out_has "stopping" && out_has "did not stop within" &&
        out_has "^job 1 cancelled \\(dtctl run interrupted\\)" &&
        out_has "^result: job=1 state=cancelled" && nothing_left "$TMPD/s8" "$PIDS" || return 1
    _st_state=$(job_state "$TMPD/s8" 1)
    [ "$_st_state" = cancelled ] || { echo "job 1 is '$_st_state' in the database"; return 1; }
}
check "SIGTERM: exit 143, job cancelled in the database, stubborn agents and orphans killed" \
    t_sigterm

t_double_sigint() {
    run_bg "$TMPD/s9" || return 1
    kill -INT "$RUN_PID"
    wait_for 10 grep -q "stopping" "$TMPD/bg.out"
    sleep 0.5
    kill -INT "$RUN_PID"
    run_bg_end
    [ "$RUN_RC" = 130 ] || { echo "exit $RUN_RC, expected 130"; cat "$TMPD/out"; return 1; }
    out_has "killing everything now" || return 1
    # what was killed may take a moment to be gone; then say what is left
    wait_for 5 nothing_left "$TMPD/s9" "$PIDS" || nothing_left "$TMPD/s9" "$PIDS"
}
check "a second SIGINT kills everything at once: exit 130, nothing left" t_double_sigint

# ---- end to end: real agents and workers (needs agent/dtagentd) ---------------------

need_agent() {
    [ -x "$DTAGENTD" ] && return 0
    echo "$DTAGENTD is not built"
    return 1
}

RESULT_RE='^result: job=[0-9]+ state=completed loss=[0-9]+\.[0-9]{6} checksum=[0-9a-f]{16,}$'

# A job small enough to run many times here (as recovery.sh's), with a
# checkpoint every 10 steps; faults come at step 25.
{
    echo "name = small"
    small_job_spec
} >"$TMPD/small.spec"

# e2e NAME ARGS...: dtctl run --local ARGS on its own state directory
# $TMPD/e2e-NAME: exit 0, the job completed, a well-formed result line,
# nothing left running; sets CHECKSUM
e2e() {
    need_agent || return 1
    _e_dir=$TMPD/e2e-$1
    shift
    run_rc 0 tmo 600 "$DTCTL" run --local --state-dir "$_e_dir" --interval 250ms "$@" ||
        return 1
    out_has "$RESULT_RE" && out_has "^job 1 [a-z-]+ completed\$" && nothing_left "$_e_dir" ||
        return 1
    CHECKSUM=$(sed -n 's/^result: .* checksum=\([0-9a-f]*\)$/\1/p' "$TMPD/out")
    grep -E "$RESULT_RE" "$TMPD/out"
}

# private DIR: every file under DIR is its owner's alone (mode 0600: the
# logs of dtcoordd and the agents too)
private() {
    _pv=$(find "$1" -type f ! -perm 0600 -printf '%m %p\n')
    [ -z "$_pv" ] || { echo "not mode 0600: $_pv"; return 1; }
}

t_e2e_default() {
    e2e default --steps 4 && out_has "^job 1 local-recall completed\$" &&
        out_has "restarts +0" && out_has "state directory $TMPD/e2e-default kept" &&
        [ -f "$TMPD/e2e-default/dt.db" ] && [ -s "$TMPD/e2e-default/agents/local2.log" ] &&
        private "$TMPD/e2e-default"
}
check "run --local: the default job (4 steps) completes, result line, nothing left, every file 0600" t_e2e_default

# cpu_lines DIR: every rank's log of job 1 under state directory DIR has
# the cpu line; they are printed, and must all name the same core
cpu_lines() {
    _cl_n=0
    for _cl_r in 0 1 2 3; do
        _cl_f=$1/jobs/1/logs/rank-$_cl_r.log
        grep -m 1 "^dtengine: rank=$_cl_r info: cpu attn_kernel=[a-z0-9]* blas_core=[A-Za-z0-9_]* " \
            "$_cl_f" ||
            { echo "no cpu line in $_cl_f"; return 1; }
        _cl_n=$((_cl_n + 1))
    done
    [ "$(cat "$1"/jobs/1/logs/rank-[0-3].log | sed -n 's/^dtengine: rank=[0-9]* info: cpu //p' | sort -u |
        wc -l)" -eq 1 ] || { echo "the ranks report different cores"; return 1; }
}
t_cpu_reported() {
    [ -d "$TMPD/e2e-default/jobs/1/logs" ] || { echo "no default run to look at"; return 1; }
    # the core OpenBLAS itself says it runs (OPENBLAS_VERBOSE=2: "Core: X")
    _core=$(OPENBLAS_VERBOSE=2 "$DTENGINE" attn --generate 16,1,1,4 2>&1 | sed -n 's/^Core: //p' |
        tail -n 1)
    cpu_lines "$TMPD/e2e-default" &&
        grep -q "blas_core=$_core " "$TMPD/e2e-default/jobs/1/logs/rank-0.log" ||
        { echo "OpenBLAS says it runs '$_core'"; return 1; }
}
check "run --local: every worker reports its CPU, attention kernel and BLAS core" t_cpu_reported

# The core dtengine asks for in place of one OpenBLAS picked too old
# (DT_TEST_BLAS_CORE stands in for an OpenBLAS that does not know this CPU):
# SkylakeX with AVX-512, Haswell with AVX2 and FMA, none below.
cpu_flags=$(sed -n 's/^flags[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
has_flags() {
    for _hf in "$@"; do
        case " $cpu_flags " in *" $_hf "*) ;; *) return 1 ;; esac
    done
}
if has_flags avx2 fma avx512f avx512cd avx512bw avx512dq avx512vl; then
    WANT_CORE=SkylakeX
elif has_flags avx2 fma; then
    WANT_CORE=Haswell
else
    WANT_CORE=
fi
t_blas_core() {
    # a core the user set is theirs to keep (the next check): none here,
    # whatever the environment this suite runs in says
    (
        unset OPENBLAS_CORETYPE
        DT_TEST_BLAS_CORE=Prescott OPENBLAS_VERBOSE=2 e2e blascore --steps 2
    ) || return 1
    cpu_lines "$TMPD/e2e-blascore" || return 1
    if [ -n "$WANT_CORE" ]; then
        for _r in 0 1 2 3; do
            _log=$TMPD/e2e-blascore/jobs/1/logs/rank-$_r.log
            grep -q "blas_core=$WANT_CORE blas_core_by=dtengine blas_core_was=Prescott " "$_log" ||
                { echo "rank $_r does not run $WANT_CORE, chosen by dtengine"; return 1; }
            # and OpenBLAS says so itself, last (the image dtengine started)
            [ "$(sed -n 's/^Core: //p' "$_log" | tail -n 1)" = "$WANT_CORE" ] ||
                { echo "rank $_r: OpenBLAS's own last word is not Core: $WANT_CORE"; return 1; }
        done
    else
        ! grep -q "blas_core_by=dtengine" "$TMPD/e2e-blascore/jobs/1/logs/rank-0.log"
    fi
}
check "run --local: an OpenBLAS core older than the CPU is replaced on every worker (${WANT_CORE:-none here})" \
    t_blas_core

# OPENBLAS_CORETYPE set by the user wins, even over a core older than the CPU
t_blas_core_user() {
    OPENBLAS_CORETYPE=Prescott DT_TEST_BLAS_CORE=Prescott "$DTENGINE" attn --generate 16,1,1,4 \
        >"$TMPD/core-user" 2>&1 || { cat "$TMPD/core-user"; return 1; }
    grep -q "info: cpu attn_kernel=[a-z0-9]* blas_core=Prescott blas_core_by=user " "$TMPD/core-user" ||
        { cat "$TMPD/core-user"; return 1; }
}
check "dtengine: a core the user set in OPENBLAS_CORETYPE is kept, and said to be theirs" t_blas_core_user

t_e2e_small() {
    e2e small "$TMPD/small.spec" || return 1
    BASE_SUM=$CHECKSUM
    out_has "restarts +0"
}
check "run --local SPECFILE: completes without a fault (the reference checksum)" t_e2e_small
: "${BASE_SUM:=none}"

# fault KIND [ARGS...]: the small job completes after the fault at step 25
# with the fault-free run's checksum
fault() {
    _f_kind=$1
    shift
    e2e "$_f_kind" "$TMPD/small.spec" --inject-failure "$_f_kind@25" "$@" || return 1
    out_has "^injected failure at step [0-9]+: " || return 1
    [ "$CHECKSUM" = "$BASE_SUM" ] || {
        echo "checksum $CHECKSUM, fault-free run $BASE_SUM"
        return 1
    }
}

t_worker() {
    fault worker && out_has "SIGKILL to the worker of rank 3" && out_has "restarts +[1-9]" &&
        out_has "^gen 2: resumed step (2[0-9]) from memory"
}
check "--inject-failure worker@25: recovers, says where it resumed, same checksum" t_worker

# ---- dtctl plot --state-dir, on the runs above: the picture of the worker
# fault's run, and refusals -------------------------------------------------------

PNGCOUNT=$DT_BUILDDIR/tests/tools/pngcount

# plot_area SVG NAME: "VIEW_W VIEW_H X Y W H", the viewBox's size and the
# box of the picture's plot area NAME (pngcount's arguments after the file)
plot_area() {
    sed -n 's/.*viewBox="0 0 \([0-9.]*\) \([0-9.]*\)".*/\1 \2/p' "$1" | head -n 1 | tr '\n' ' '
    sed -n "s/.*id=\"area-$2\" x=\"\([0-9.]*\)\" y=\"\([0-9.]*\)\" width=\"\([0-9.]*\)\" height=\"\([0-9.]*\)\".*/\1 \2 \3 \4/p" \
        "$1" | head -n 1
}

# what the picture's checks use: contrib/deps.sh installs them
plot_tools() {
    for _pt in xmllint rsvg-convert; do
        command -v "$_pt" >/dev/null ||
            { echo "$_pt is not installed (contrib/deps.sh: libxml2-utils, librsvg2-bin)"; return 1; }
    done
    [ -x "$PNGCOUNT" ] || { echo "$PNGCOUNT is not built (it needs libpng: contrib/deps.sh)"; return 1; }
}

# The picture is valid XML, renders, has coloured pixels (the generations'
# lines, the failure's marks) in each plot area, labels the failure with
# its cost and marks the checkpoints; the same on stdout with --svg -.
t_plot() {
    plot_tools || return 1
    _pd=$TMPD/e2e-worker
    _svg=$TMPD/plot.svg
    [ -f "$_pd/dt.db" ] || { echo "no worker run to plot"; return 1; }
    run_rc 0 "$DTCTL" plot 1 --svg "$_svg" --state-dir "$_pd" &&
        out_has "^job 1: [0-9]+ steps, 1 failure drawn in $_svg\$" || return 1
    xmllint --noout "$_svg" || return 1
    _label=$(grep -o 'F1 gen 1 worker: detect [0-9.]* s, restart [0-9.]* s, load [0-9.]* s, redo [0-9]* steps* [0-9.]* s' \
        "$_svg" | head -n 1)
    [ -n "$_label" ] || { echo "no label of the failure's cost"; return 1; }
    grep -q '<path class="checkpoint"' "$_svg" || { echo "no checkpoint commit marked"; return 1; }
    rsvg-convert -w 800 "$_svg" -o "$TMPD/plot.png" || return 1
    for _pa in loss rate progress; do
        # shellcheck disable=SC2046 # the box's numbers, one argument each
        _px=$("$PNGCOUNT" "$TMPD/plot.png" $(plot_area "$_svg" "$_pa")) || return 1
        [ "${_px#*coloured=}" -ge 300 ] || { echo "plot area $_pa: $_px"; return 1; }
    done
    "$DTCTL" plot 1 --svg - --state-dir "$_pd" | cmp -s - "$_svg" ||
        { echo "--svg - wrote another picture"; return 1; }
    nothing_left "$_pd" && echo "$_label"
}
check "plot --state-dir of the worker fault's run: valid SVG, renders, drawn plot areas, the cost labelled" \
    t_plot

t_plot_refused() {
    mkdir -p "$TMPD/nodb"
    run_rc 2 "$DTCTL" plot 1 --svg "$TMPD/x.svg" --state-dir "$TMPD/nowhere" &&
        out_has "^dtctl plot: state directory $TMPD/nowhere: " &&
        run_rc 2 "$DTCTL" plot 1 --svg "$TMPD/x.svg" --state-dir "$TMPD/nodb" &&
        out_has "state directory $TMPD/nodb has no database dt.db: not the --state-dir of a dtctl run --local" ||
        return 1
    # s6: the run whose agents exited at once, its job cancelled before a step
    run_rc 1 "$DTCTL" plot 1 --svg "$TMPD/x.svg" --state-dir "$TMPD/s6" &&
        out_has "^dtctl plot: job 1 has no steps recorded yet: nothing to plot\$" &&
        run_rc 4 "$DTCTL" plot 9 --svg "$TMPD/x.svg" --state-dir "$TMPD/e2e-worker" &&
        out_has "job 9 not found" &&
        run_rc 1 "$DTCTL" plot 1 --svg "$TMPD/no/such/x.svg" --state-dir "$TMPD/e2e-worker" &&
        out_has "^dtctl plot: .*$TMPD/no/such/" || return 1
    [ ! -e "$TMPD/x.svg" ] && [ ! -e "$TMPD/nodb/dt.conf" ] && nothing_left "$TMPD/s6" &&
        nothing_left "$TMPD/e2e-worker"
}
check "plot refused: no such state dir or no dt.db 2, no steps 1 (nothing to plot), no such job 4, unwritable FILE 1" \
    t_plot_refused

t_hang() {
    fault hang && out_has "SIGSTOP to the worker of rank 3" && out_has "restarts +[1-9]"
}
check "--inject-failure hang@25: the hang is detected, recovers, same checksum" t_hang

t_agent() {
    fault agent --spares 1 && out_has "SIGKILL to agent local[12] " &&
        out_has "spare agent local3" && out_has "restarts +[1-9]" || return 1
    # the killed agent's generation directory is gone too
    _ga=$(find "$TMPD/e2e-agent/agents" -name 'gen-*')
    [ -z "$_ga" ] || { echo "left behind: $_ga"; return 1; }
}
check "--inject-failure agent@25 with a spare: recovers on it, same checksum, no generation directory left" t_agent

t_coordinator() {
    fault coordinator && out_has "SIGKILL to dtcoordd" && out_has "dtcoordd started again"
}
check "--inject-failure coordinator@25: restarted, agents reattach, same checksum" t_coordinator

# the same matrix for a sharded job: shard = parameters with recompute =
# layer (every rank keeps a quarter of the parameters, gradient and
# moments, and each layer's input only), checkpoints of slices: after
# each fault the checksum of its own fault-free run
{
    cat "$TMPD/small.spec"
    echo "shard = parameters"
    echo "recompute = layer"
} >"$TMPD/sharded.spec"
t_sharded_base() {
    e2e sharded "$TMPD/sharded.spec" || return 1
    SHARD_SUM=$CHECKSUM
    out_has "restarts +0" || return 1
    grep -q '"shard": "parameters"' "$TMPD/e2e-sharded/jobs/1/ckpt/step-00000040/manifest.json" ||
        { echo "the last checkpoint's manifest does not say shard = parameters"; return 1; }
}
check "run --local, shard = parameters, recompute = layer: completes (its reference checksum)" \
    t_sharded_base
: "${SHARD_SUM:=none}"
sharded_fault() { # KIND [ARGS...]
    _sf_kind=$1
    shift
    e2e "sharded-$_sf_kind" "$TMPD/sharded.spec" --inject-failure "$_sf_kind@25" "$@" || return 1
    out_has "^injected failure at step [0-9]+: " && out_has "restarts +[1-9]|dtcoordd started again" ||
        return 1
    [ "$CHECKSUM" = "$SHARD_SUM" ] || {
        echo "checksum $CHECKSUM, fault-free sharded run $SHARD_SUM"
        return 1
    }
}
check "sharded: --inject-failure worker@25 recovers, same checksum" sharded_fault worker
check "sharded: --inject-failure agent@25 with a spare recovers on it, same checksum" \
    sharded_fault agent --spares 1
check "sharded: --inject-failure coordinator@25: same checksum" sharded_fault coordinator

t_checkpoint_running() {
    need_agent || return 1
    _cr_dir=$TMPD/e2e-ckpt
    "$DTCTL" run --local "$TMPD/small.spec" --state-dir "$_cr_dir" --interval 100ms \
        >"$TMPD/bg.out" 2>&1 &
    RUN_PID=$!
    track "$RUN_PID"
    wait_for 120 grep -q "state running  gen 1  restarts 0  step [1-9]" "$TMPD/bg.out" || {
        echo "the job did not start running:"
        cat "$TMPD/bg.out"
        stop_pid "$RUN_PID"
        return 1
    }
    "$DTCTL" --socket "$_cr_dir/dtcoordd.sock" checkpoint 1 >"$TMPD/ck.out" 2>&1
    _cr_rc=$?
    run_bg_end
    [ "$_cr_rc" = 0 ] && grep -q "^job 1: checkpoint requested (generation 1)\$" "$TMPD/ck.out" ||
        { echo "checkpoint exited $_cr_rc:"; cat "$TMPD/ck.out"; return 1; }
    [ "$RUN_RC" = 0 ] || { echo "run exited $RUN_RC"; cat "$TMPD/out"; return 1; }
    out_has "$RESULT_RE" && out_has "checksum=$BASE_SUM\$" && nothing_left "$_cr_dir" &&
        cat "$TMPD/ck.out"
}
check "checkpoint JOB while it runs: requested, and the result is unchanged" t_checkpoint_running

# A worker whose GPU fails (dtengine's exit 7, here from a wrapper that
# kills the real engine two seconds in and exits 7 with a CUDA error's
# words, once): its node is suspect, the spare takes its ranks, and the job
# completes with the fault-free checksum; no later generation runs there.
t_device_fault() {
    need_agent || return 1
    _df=$TMPD/devfault
    mkdir -p "$_df"
    cat >"$_df/dtengine" <<EOF
#!/bin/sh
if [ "\$1" = train ] && mkdir "$_df/failed" 2>/dev/null; then
    "$DTENGINE" "\$@" &
    sleep 2
    kill -9 \$! 2>/dev/null
    echo "dtengine: CUDA error: an illegal memory access was encountered (test)" >&2
    exit 7
fi
exec "$DTENGINE" "\$@" --device cpu
EOF
    chmod +x "$_df/dtengine"
    DT_ENGINE=$_df/dtengine e2e devfault "$TMPD/small.spec" --spares 1 || return 1
    [ "$CHECKSUM" = "$BASE_SUM" ] || { echo "checksum $CHECKSUM, fault-free run $BASE_SUM"; return 1; }
    _db=$TMPD/e2e-devfault/dt.db
    _bad=$(sqlite3 "$_db" "SELECT detail FROM events WHERE kind = 'device_fault'" |
        sed -n 's/.* on \([a-z0-9]*\): its GPU failed.*/\1/p' | head -n 1)
    [ -n "$_bad" ] || { sqlite3 "$_db" "SELECT kind, detail FROM events"; return 1; }
    _last=$(sqlite3 "$_db" "SELECT MAX(gen) FROM ranks")
    _nodes=$(sqlite3 "$_db" "SELECT DISTINCT a.node FROM ranks r JOIN agents a ON a.id = r.agent_id
        WHERE r.gen = $_last ORDER BY a.node" | tr '\n' ' ')
    case " $_nodes" in
    *" $_bad "*) echo "generation $_last ran on the suspect $_bad: $_nodes"; return 1 ;;
    esac
    sqlite3 "$_db" "SELECT detail FROM events WHERE kind = 'worker_failed'" |
        grep -q "exited with status 7 at step [0-9]*: dtengine: CUDA error" || return 1
    echo "$_bad suspect; generation $_last on $_nodes"
}
check "a worker's GPU fails (exit 7): its node suspect, the spare takes over, same checksum" \
    t_device_fault

# ---- device = cuda: the agents' GPUs -------------------------------------------

sed 's/^gpu = cpu$/device = cuda/' "$TMPD/small.spec" >"$TMPD/cuda.spec"

# No GPU here (no driver): the agents register none, the coordinator
# refuses them for a cuda job, saying why, and nothing starts.
t_cuda_no_gpu() {
    need_agent || return 1
    run_rc 1 tmo 120 "$DTCTL" run --local --state-dir "$TMPD/cuda0" --interval 250ms \
        "$TMPD/cuda.spec" || return 1
    out_has "every agent has exited and job 1 has not ended" &&
        out_has "the coordinator refused the agents: node local[12]: device = cuda needs a GPU per slot" ||
        return 1
    sqlite3 "$TMPD/cuda0/dt.db" "SELECT kind || ' ' || detail FROM events" >"$TMPD/ev" &&
        grep -q "^agent_refused node local1: device = cuda needs a GPU per slot: 0 GPUs for 2 slots: " \
            "$TMPD/ev" && ! grep -q "^starting\|^worker_exit" "$TMPD/ev" ||
        { cat "$TMPD/ev"; return 1; }
    grep -q "gpus=0 (" "$TMPD/cuda0/agents/local1.log" && nothing_left "$TMPD/cuda0"
}
check "device = cuda with no GPU: agents refused naming the cause, nothing started" t_cuda_no_gpu

# A node with two GPUs, as `dtengine devices` reports them (a wrapper
# answers for the real engine, which has no driver to ask here): each
# agent's two workers get one GPU each by UUID and the CPUs near it. The
# wrapper then runs the real engine with --device cpu (there is no GPU to
# train on; gpu_sim.sh trains on simulated ones), and the job completes.
t_cuda_binding() {
    need_agent || return 1
    _cb=$TMPD/fakegpu
    mkdir -p "$_cb"
    cat >"$_cb/dtengine" <<EOF
#!/bin/sh
if [ "\$1" = devices ]; then
    cat <<'JSON'
{"cuda": true, "driver": 12040, "devices": [
 {"index": 0, "name": "test", "uuid": "GPU-00000000-0000-0000-0000-00000000000a",
  "memory_bytes": 85899345920, "pci_bus_id": "0000:01:00.0", "cpus": "0"},
 {"index": 1, "name": "test", "uuid": "GPU-00000000-0000-0000-0000-00000000000b",
  "memory_bytes": 85899345920, "pci_bus_id": "0000:02:00.0", "cpus": "1"}]}
JSON
    exit 0
fi
echo "\$PMIX_RANK \$CUDA_VISIBLE_DEVICES \$DT_CPUS" >>"$_cb/bindings"
exec "$DTENGINE" "\$@" --device cpu
EOF
    chmod +x "$_cb/dtengine"
    DT_ENGINE=$_cb/dtengine run_rc 0 tmo 300 "$DTCTL" run --local --state-dir "$_cb/st" \
        --interval 250ms "$TMPD/cuda.spec" || return 1
    out_has "^result: job=1 state=completed " || return 1
    sort -u "$_cb/bindings" >"$TMPD/bind"
    printf '%s\n' "0 GPU-00000000-0000-0000-0000-00000000000a 0" \
        "1 GPU-00000000-0000-0000-0000-00000000000b 1" \
        "2 GPU-00000000-0000-0000-0000-00000000000a 0" \
        "3 GPU-00000000-0000-0000-0000-00000000000b 1" | cmp -s - "$TMPD/bind" ||
        { echo "bindings:"; cat "$TMPD/bind"; return 1; }
    grep -q "gpus=2 " "$_cb/st/agents/local1.log" ||
        { sqlite3 "$_cb/st/dt.db" "SELECT kind, detail FROM events"; return 1; }
    nothing_left "$_cb/st"
}
check "device = cuda: one worker per GPU, bound by UUID and to its CPUs" t_cuda_binding

t_one_agent() {
    e2e one "$TMPD/small.spec" --agents 1 --workers 2 && out_has "2 ranks on 1 agent of 2 workers, 0 spares"
}
check "run --local SPECFILE --agents 1 --workers 2: 2 ranks on one agent" t_one_agent


# The planner and the engine agree on the defaults (one key table): a
# non-causal job of 258 tokens on 2 ranks is planned contiguous (2R = 4
# does not divide 258: zigzag could not run it) and runs so, through the
# agents and under plain mpirun alike, with the same result.
cat >"$TMPD/noncausal.spec" <<SPEC
kind = train
model = tiny
tokens = 258
ranks = 2
causal = no
steps = 2
SPEC
t_noncausal() {
    e2e noncausal "$TMPD/noncausal.spec" --agents 1 --workers 2 || return 1
    _nc=$CHECKSUM
    mpirun_np 2 "$DTENGINE" train --spec "$TMPD/noncausal.spec" >"$TMPD/noncausal.mpirun" 2>&1 ||
        { cat "$TMPD/noncausal.mpirun"; return 1; }
    grep -q "layout=contiguous" "$TMPD/noncausal.mpirun" || { cat "$TMPD/noncausal.mpirun"; return 1; }
    _mp=$(sed -n 's/^result: .*params_sha256=\([0-9a-f]*\).*/\1/p' "$TMPD/noncausal.mpirun")
    [ -n "$_nc" ] && [ "$_nc" = "$_mp" ] || { echo "run --local $_nc, mpirun $_mp"; return 1; }
    echo "checksum $_nc both ways, contiguous"
}
check "a non-causal 258-token job on 2 ranks: planned, run and equal under run --local and mpirun" \
    t_noncausal

finish
