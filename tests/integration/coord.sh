#!/bin/sh
# SPDX-License-Identifier: MIT
#
# The coordinator end to end, as its users see it: a private munged and a
# real dtcoordd (foreground and daemonised), driven by dtctl on the Unix
# socket and by dtprobe over TCP with munge credentials as an agent would.
# It checks what a user would: ids, states and event histories printed by
# dtctl (text and --json), exit codes and error text, jobs and events
# surviving a SIGKILL, agents lost when they stop heartbeating, checkpoints
# recorded, hostile frames refused without harm, SIGHUP reloads, a second
# daemon refused, bad configurations and a newer database refused. It does
# not run workers or Slurm (see the agent's tests) and checks no timing
# beyond the agent timeout.

. "$(dirname "$0")/lib.sh"
. "$DT_TESTDIR/coordlib.sh"

munge_start
coord_setup

check "dtcoordd -D starts and answers PING" coord_start
coord_ping || finish

# ---- submitting and looking -------------------------------------------------

t_submit() {
    run_rc 0 ctl submit --kind attn --model tiny --tokens 4096 --ranks 2 --gpu cpu || return 1
    JOB1=$(cat "$TMPD/out")
    case $JOB1 in
    '' | *[!0-9]*) echo "submit printed '$JOB1', not a job id"; return 1 ;;
    esac
    echo "job $JOB1"
}
check "submit prints the new job's id" t_submit

t_list() {
    run_rc 0 ctl list && out_has "^ *$JOB1 .*queued"
}
check "list shows the job queued" t_list

t_list_json() {
    run_rc 0 ctl --json list && ids_are "$JOB1" || return 1
    [ "$(json_str state <"$TMPD/out")" = queued ] || {
        echo "state not queued"
        cat "$TMPD/out"
        return 1
    }
    cp "$TMPD/out" "$TMPD/list1.json"
    run_rc 0 ctl list --json && cmp "$TMPD/out" "$TMPD/list1.json"
}
check "list --json: the job's id and state (global and subcommand flag)" t_list_json

t_show() {
    run_rc 0 ctl show "$JOB1" && out_has "^job $JOB1" && out_has "state +queued" &&
        out_has "plan +ranks=2 " && out_has "kind = attn"
}
check "show: state, plan and spec" t_show

t_show_json() {
    run_rc 0 ctl --json show "$JOB1" || return 1
    [ "$(json_str state <"$TMPD/out" | head -n 1)" = queued ] &&
        [ "$(json_num ranks <"$TMPD/out" | head -n 1)" = 2 ] && return 0
    cat "$TMPD/out"
    return 1
}
check "show --json: state queued, plan of 2 ranks" t_show_json

t_events() {
    run_rc 0 ctl events "$JOB1" || return 1
    _k=$(awk 'NR > 1 { printf "%s ", $4 }' "$TMPD/out")
    [ "$_k" = "submitted planned queued " ] || { echo "kinds: $_k"; cat "$TMPD/out"; return 1; }
    run_rc 0 ctl events --json "$JOB1" || return 1
    _k=$(json_str kind <"$TMPD/out" | tr '\n' ' ')
    [ "$_k" = "submitted planned queued " ] || { echo "kinds: $_k"; cat "$TMPD/out"; return 1; }
    echo "$_k"
}
check "events: submitted, planned, queued in order (text and --json)" t_events

t_spec_file() {
    cat >"$TMPD/job.spec" <<EOF
# a spec file as a user writes it
name = fromfile
kind = attn
model = tiny
tokens = 8192
ranks = 2
gpu = cpu
EOF
    run_rc 0 ctl submit --json "$TMPD/job.spec" || return 1
    JOB2=$(json_num id <"$TMPD/out")
    [ -n "$JOB2" ] && [ "$JOB2" -gt "$JOB1" ] || { echo "no new id"; cat "$TMPD/out"; return 1; }
    run_rc 0 ctl list && out_has "^ *$JOB2 +fromfile .*queued" && echo "job $JOB2"
}
check "submit SPECFILE --json: a named job" t_spec_file

t_cancel() {
    run_rc 0 ctl submit --kind attn --model tiny --tokens 2048 --ranks 2 --gpu cpu || return 1
    JOB3=$(cat "$TMPD/out")
    run_rc 0 ctl cancel --reason "test cancel" "$JOB3" && out_has "^job $JOB3 cancelled" &&
        run_rc 0 ctl --json show "$JOB3" &&
        [ "$(json_str state <"$TMPD/out" | head -n 1)" = cancelled ] &&
        run_rc 0 ctl events "$JOB3" &&
        out_has "cancelled +cancelled +cancelled by uid $(id -u): test cancel"
}
check "cancel moves a queued job to cancelled, with the reason" t_cancel

t_cancel_again() {
    run_rc 1 ctl cancel "$JOB3" && out_has "already cancelled"
}
check "a second cancel fails (exit 1, 'already cancelled')" t_cancel_again

t_cancel_missing() {
    run_rc 4 ctl cancel 999999 && out_has "not found"
}
check "cancel of a job that does not exist: exit 4" t_cancel_missing

njobs() {
    ctl --json list | json_num id | wc -l
}

t_refused() {
    _before=$(njobs)
    run_rc 6 ctl submit --kind train --model llama3-70b --tokens 1M --gpu cpu --ranks 1 || return 1
    out_has "." || return 1
    _after=$(njobs)
    [ "$_before" -gt 0 ] && [ "$_before" = "$_after" ] ||
        { echo "jobs before $_before, after $_after"; return 1; }
    head -n 1 "$TMPD/out"
}
check "a job that cannot be planned is refused (exit 6) and leaves no job" t_refused

# 64K tokens of tiny on one cpu rank (4 GiB) fit only with recompute: unset,
# the planner chooses it and the stored spec (what the agents hand dtengine
# train) says so; the user's none is honoured and refused
t_recompute() {
    run_rc 0 ctl submit --kind train --model tiny --tokens 64K --ranks 1 --gpu cpu || return 1
    _j=$(cat "$TMPD/out")
    run_rc 0 ctl show "$_j" && out_has "^recompute = layer$" &&
        out_has "note +recompute = layer: without it the activations need" || return 1
    run_rc 0 ctl --json show "$_j" && [ "$(json_str recompute <"$TMPD/out")" = layer ] ||
        { cat "$TMPD/out"; return 1; }
    run_rc 0 ctl cancel "$_j" >/dev/null || return 1
    _before=$(njobs)
    run_rc 6 ctl submit --kind train --model tiny --tokens 64K --ranks 1 --gpu cpu \
        --recompute none && out_has "memory: .* at R=1" || return 1
    [ "$(njobs)" = "$_before" ] || { echo "a job was created"; return 1; }
    # fits without: nothing is added to the spec
    run_rc 0 ctl submit --kind train --model tiny --tokens 4096 --ranks 1 --gpu cpu || return 1
    _j=$(cat "$TMPD/out")
    run_rc 0 ctl show "$_j" && out_lacks "recompute" && run_rc 0 ctl cancel "$_j" >/dev/null
}
check "recompute: chosen by the planner reaches the stored spec; the user's none is refused" \
    t_recompute

# dp = 2 rings of 2 ranks: the plan keeps ranks per ring and adds dp and
# the workers the job launches (show, text and --json); the cluster must
# hold every worker; attn has no gradient to reduce across rings
t_dp() {
    run_rc 0 ctl submit --kind train --model tiny --tokens 4096 --ranks 2 --dp 2 --gpu cpu ||
        return 1
    _j=$(cat "$TMPD/out")
    run_rc 0 ctl show "$_j" && out_has "plan +ranks=2 dp=2 workers=4 " && out_has "^dp = 2$" ||
        return 1
    run_rc 0 ctl --json show "$_j" && [ "$(json_num workers <"$TMPD/out")" = 4 ] &&
        [ "$(json_num dp <"$TMPD/out" | head -n 1)" = 2 ] || { cat "$TMPD/out"; return 1; }
    run_rc 0 ctl cancel "$_j" >/dev/null || return 1
    _before=$(njobs)
    run_rc 6 ctl submit --kind train --model tiny --tokens 4096 --ranks 2 --dp 2 --gpu cpu \
        --nodes 1 --gpus-per-node 2 && out_has "needs 4 workers \(dp=2 rings of 2 ranks" || return 1
    run_rc 2 ctl submit --kind attn --model tiny --tokens 4096 --ranks 2 --dp 2 --gpu cpu &&
        out_has "data parallel is for kind train" || return 1
    [ "$(njobs)" = "$_before" ] || { echo "a job was created"; return 1; }
}
check "dp: the plan's workers are dp x ranks; capacity counts them; attn refused" t_dp

# the GPU engine runs every shard level and dp > 1 (a second NCCL
# communicator across the rings): the planner plans them, the one answer
# it and submit ask (spec/vocab.h) no longer refuses; dp x ranks workers
# on nodes of 8 GPUs keep each ring inside a node
t_cuda_shard() {
    run_rc 0 ctl plan --kind train --model tiny --tokens 4096 --ranks 2 --dp 2 --gpu h100-sxm \
        --shard parameters && out_has "^shard +parameters" && out_has "^dp +2" || return 1
    run_rc 0 ctl plan --kind train --model tiny --tokens 4096 --ranks 8 --dp 2 --gpu h100-sxm \
        --json && out_has '"nodes": 2' && out_has '"intra_node_frac": 1.0'
}
check "device = cuda: dp > 1 and shard = parameters planned (each ring inside a node)" \
    t_cuda_shard

# llama3-8b at 512K tokens on one H100 fits only with the optimizer and
# the layer inputs in host memory: unset, the planner chooses them and the
# stored spec says so (with the shard level and recompute that go with)
t_cuda_offload() {
    run_rc 0 ctl submit --kind train --model llama3-8b --tokens 512K --ranks 1 --gpu h100-sxm ||
        return 1
    _j=$(cat "$TMPD/out")
    run_rc 0 ctl show "$_j" && out_has "^offload = activations,optimizer$" &&
        out_has "^shard = gradients$" && out_has "^recompute = layer$" || return 1
    run_rc 0 ctl cancel "$_j" >/dev/null || return 1
    run_rc 0 ctl plan --kind train --model llama3-8b --tokens 4M --nodes 1 --gpu h100-sxm &&
        out_has "^offload +activations,optimizer \(chosen by the planner\)" &&
        out_has "^ckpt_dtype +bf16 \(chosen by the planner\)" || return 1
    _before=$(njobs)
    run_rc 6 ctl submit --kind train --model llama3-8b --tokens 512K --ranks 1 --gpu h100-sxm \
        --offload none && out_has "memory: " || return 1
    [ "$(njobs)" = "$_before" ] || { echo "a job was created"; return 1; }
}
check "device = cuda: offload chosen by the planner where it saves GPUs, stored in the spec" \
    t_cuda_offload

t_bad_key() {
    _before=$(njobs)
    run_rc 2 ctl submit --kind attn --tokens 4096 --frobnicate 3 && out_has "frobnicate" || return 1
    printf 'kind = attn\ntokens = 4096\nfrobnicate = 3\n' >"$TMPD/bad.spec"
    run_rc 2 ctl submit "$TMPD/bad.spec" && out_has "bad.spec:3:.*frobnicate" || return 1
    [ "$(njobs)" = "$_before" ] || { echo "a job was created"; return 1; }
}
check "a bad spec key exits 2 naming the key (flag and file:line)" t_bad_key

t_nocoord() {
    run_rc 3 "$DTCTL" --socket "$TMPD/nobody-here.sock" list && out_has "is dtcoordd running"
}
check "dtctl without a coordinator exits 3 with a hint" t_nocoord

t_bad_job_ids() {
    for _id in 99999999999999999999 9223372036854775808 0 +5 12x ' 7' ''; do
        for _c in show events cancel checkpoints watch; do
            run_rc 2 ctl "$_c" "$_id" && grep -qF "'$_id' is not a job id" "$TMPD/out" &&
                out_has "is not a job id \(1 to 9223372036854775807\)$" || { cat "$TMPD/out"; return 1; }
        done
    done
    run_rc 2 ctl events --since 99999999999999999999 "$JOB1" && out_has "is not an event id" ||
        return 1
    run_rc 4 ctl show 9223372036854775807 && out_has "not found"
}
check "job ids out of range or not digits exit 2 as bad usage (show, events, cancel, watch)" \
    t_bad_job_ids

t_bad_coord() {
    for _a in 127.0.0.1:99999 127.0.0.1: 127.0.0.1:-5 127.0.0.1:0 127.0.0.1:5x :5412 127.0.0.1 \
        ::1:5412 '[::1]:'; do
        run_rc 2 "$DTCTL" --coord "$_a" list && grep -qF "dtctl: --coord '$_a': " "$TMPD/out" &&
            out_has '^usage: dtctl' || { head -n 1 "$TMPD/out"; return 1; }
    done
    run_rc 2 env DT_COORD=127.0.0.1:99999 "$DTCTL" list &&
        out_has "^dtctl: DT_COORD '127.0.0.1:99999': the port must be a number from 1 to 65535" ||
        return 1
    # well formed, nothing listening: cannot reach it (3), not bad usage
    _cp=$COORD_PORT
    pick_port 40000
    _free=$COORD_PORT
    COORD_PORT=$_cp
    run_rc 3 "$DTCTL" --coord "127.0.0.1:$_free" list && out_lacks usage || return 1
    run_rc 3 "$DTCTL" --coord "[::1]:$_free" list && out_lacks usage
}
check "--coord / DT_COORD with a bad port or no host exits 2 with a usage message" t_bad_coord

# ---- SIGKILL and restart on the same state ------------------------------------

ctl submit --kind attn --model tiny --tokens 16384 --ranks 4 --gpu cpu >/dev/null
JOB5=$(ctl submit --kind attn --model tiny --tokens 4096 --ranks 1 --gpu cpu --name five)

t_cancel_reason_after() {
    # the order dtctl's usage documents: cancel JOB [--reason TEXT]
    run_rc 0 ctl cancel "$JOB5" --reason "five is done" && out_has "^job $JOB5 cancelled" &&
        run_rc 0 ctl events "$JOB5" && out_has "cancelled by uid $(id -u): five is done"
}
check "cancel JOB --reason TEXT (options after the job id)" t_cancel_reason_after

# snapshot NAME: dtctl's view of every job and its events
snapshot() {
    ctl --json list >"$TMPD/$1.list" || return 1
    : >"$TMPD/$1.events"
    for _j in $(json_num id <"$TMPD/$1.list"); do
        ctl --json events "$_j" >>"$TMPD/$1.events" || return 1
    done
}

t_kill9() {
    snapshot before || { echo "cannot take the snapshot"; return 1; }
    coord_stop KILL
    _rc=$?
    [ "$_rc" -eq 137 ] || { echo "SIGKILL: exit $_rc, expected 137"; return 1; }
    run_rc 3 ctl list || return 1
    # this time daemonised: the parent returns once it is ready
    coord_start -d || return 1
    alive "$COORD_PID" || { echo "daemon pid $COORD_PID not running"; return 1; }
    grep -q "started pid=$COORD_PID" "$COORD_LOG" || {
        echo "no start line in $COORD_LOG"
        return 1
    }
    snapshot after || { echo "cannot take the snapshot after the restart"; return 1; }
    for _s in list events; do
        cmp "$TMPD/before.$_s" "$TMPD/after.$_s" || {
            diff "$TMPD/before.$_s" "$TMPD/after.$_s"
            return 1
        }
    done
    _nj=$(json_num id <"$TMPD/after.list" | wc -l)
    _ne=$(json_num id <"$TMPD/after.events" | wc -l)
    echo "$_nj jobs, $_ne events identical"
}
check "SIGKILL, restart daemonised: every job and event as before" t_kill9
coord_ping || finish

# ---- agents over TCP ------------------------------------------------------------

t_agent_heartbeat() {
    # 8 heartbeats 200 ms apart span 1.6 s, more than agent_timeout; one
    # slot of the 2 ranks the job needs, so nothing is started on it
    run_rc 0 probe_tcp --auth --pause 200 \
        REGISTER "{\"job\": $JOB1, \"node\": \"node-a\", \"slots\": 1}" \
        HEARTBEAT '{"agent":"$agent"}' HEARTBEAT '{"agent":"$agent"}' \
        HEARTBEAT '{"agent":"$agent"}' HEARTBEAT '{"agent":"$agent"}' \
        HEARTBEAT '{"agent":"$agent"}' HEARTBEAT '{"agent":"$agent"}' \
        HEARTBEAT '{"agent":"$agent"}' HEARTBEAT '{"agent":"$agent"}' || return 1
    [ "$(grep -c '^OK' "$TMPD/out")" -eq 9 ] || { cat "$TMPD/out"; return 1; }
    AGENT=$(sed -n 's/^OK .*"agent":\([0-9]*\).*/\1/p' "$TMPD/out" | head -n 1)
    out_has '"heartbeat_ms":200' || return 1
    run_rc 0 ctl events "$JOB1" && out_has agent_registered && out_lacks agent_lost &&
        echo "agent $AGENT alive after 1.6 s of heartbeats"
}
check "an agent registers over TCP and heartbeats keep it alive" t_agent_heartbeat

agent_lost() {
    ctl events "$JOB1" | grep -q agent_lost
}

t_agent_lost() {
    # agent_timeout = 1s: lost within 2 s of the last heartbeat
    wait_for 2 agent_lost || { ctl events "$JOB1"; return 1; }
    run_rc 0 ctl --json show "$JOB1" && out_has '"state": "lost"' || return 1
    grep -q "agent=$AGENT lost" "$COORD_LOG" || { echo "no 'lost' line in the log"; return 1; }
}
check "an agent that stops heartbeating is lost within agent_timeout + 1 s" t_agent_lost

SHA=0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
t_shard() {
    run_rc 0 probe_tcp --auth \
        REGISTER "{\"job\": $JOB1, \"node\": \"node-b\", \"slots\": 1}" \
        SHARD_WRITTEN "{\"agent\": \"\$agent\", \"step\": 100, \"rank\": 0,
                        \"path\": \"/ck/100/0\", \"bytes\": 4096, \"sha256\": \"$SHA\"}" ||
        return 1
    run_rc 0 ctl checkpoints "$JOB1" && out_has "^ *100 +partial +1 +4096 " &&
        run_rc 0 ctl --json checkpoints "$JOB1" && out_has '"step": 100'
}
check "SHARD_WRITTEN: dtctl checkpoints shows the step" t_shard

t_shard_bad() {
    run_rc 1 probe_tcp --auth \
        REGISTER "{\"job\": $JOB1, \"node\": \"node-b\", \"slots\": 1}" \
        SHARD_WRITTEN '{"agent": "$agent", "step": 200, "rank": 0, "path": "/x", "bytes": 1,
                        "sha256": "zz"}' &&
        out_has '^ERROR code=-22 .*sha256' &&
        run_rc 0 ctl checkpoints "$JOB1" && out_lacks "^ *200 "
}
check "a shard with a bad sha256 is refused and not recorded" t_shard_bad

t_register_cancelled() {
    run_rc 1 probe_tcp --auth REGISTER "{\"job\": $JOB3, \"node\": \"n\", \"slots\": 1}" &&
        out_has "is cancelled"
}
check "registering for a cancelled job is refused" t_register_cancelled

t_heartbeat_foreign() {
    # an agent id that this connection did not register
    run_rc 1 probe_tcp --auth HEARTBEAT "{\"agent\": ${AGENT:-1}}" && out_has "not registered"
}
check "a heartbeat for another connection's agent is refused" t_heartbeat_foreign

# ---- hostile frames -------------------------------------------------------------

t_garbage() {
    "$DTPROBE" --socket "$COORD_SOCK" --raw 'de ad be ef 00 01 00 0b 00 00 00 01 00 00 00 00' \
        >"$TMPD/out" 2>&1
    out_has '^(ERROR code=-4102 .*bad magic|CLOSED)' || return 1
    # a valid header whose payload is not JSON
    "$DTPROBE" --socket "$COORD_SOCK" --raw '44545031 0001 000b 00000001 00000003 7b787d' \
        >"$TMPD/out" 2>&1
    out_has '^(ERROR code=-4102 .*JSON|CLOSED)' || return 1
    # unauthenticated garbage over TCP
    "$DTPROBE" --tcp "127.0.0.1:$COORD_PORT" --raw 'ffffffff ffffffff ffffffff ffffffff' \
        >"$TMPD/out" 2>&1
    out_has '^(ERROR|CLOSED)' || return 1
    coord_ping && ctl list >/dev/null && alive "$COORD_PID"
}
check "malformed frames get ERROR or CLOSED; the coordinator keeps serving" t_garbage

rss_kib() {
    awk '$1 == "VmRSS:" { print $2 }' "/proc/$COORD_PID/status"
}

t_oversize() {
    _r0=$(rss_kib)
    [ -n "$_r0" ] || { echo "no VmRSS for pid $COORD_PID"; return 1; }
    for _t in SUBMIT PING; do
        "$DTPROBE" --socket "$COORD_SOCK" --oversize "$_t" >"$TMPD/out" 2>&1
        out_has '^(ERROR code=-4102 .*exceeds|CLOSED)' || return 1
        probe_tcp --auth --oversize "$_t" >"$TMPD/out" 2>&1
        out_has '^(ERROR code=-4102 .*exceeds|CLOSED)' || return 1
    done
    _r1=$(rss_kib)
    coord_ping || { echo "no PING reply after the oversize headers"; return 1; }
    [ $((_r1 - _r0)) -lt 4096 ] || { echo "RSS grew from $_r0 to $_r1 KiB"; return 1; }
    echo "RSS $_r0 -> $_r1 KiB"
}
check "an oversize header is refused without growing; PING still answers" t_oversize

t_not_request() {
    run_rc 1 "$DTPROBE" --socket "$COORD_SOCK" OK '{}' && out_has "is not a request" &&
        run_rc 1 "$DTPROBE" --socket "$COORD_SOCK" 999 && out_has "unknown message type" &&
        coord_ping
}
check "a reply type or unknown type sent as a request is refused" t_not_request

# ---- SIGHUP, a second daemon, bad configurations ----------------------------------

# log_count ERE: lines of the coordinator's log matching ERE
log_count() {
    grep -c -E -e "$1" "$COORD_LOG"
}
# log_more N ERE: more than N lines match now (for wait_for)
log_more() {
    [ "$(log_count "$2")" -gt "$1" ]
}

t_sighup() {
    _n=$(log_count 'configuration reloaded')
    cp "$COORD_CONF" "$COORD_DIR/dt.conf.orig"
    sed "s|^socket = .*|socket = $COORD_STATE/other.sock|" "$COORD_DIR/dt.conf.orig" >"$COORD_CONF"
    echo "log_level = debug" >>"$COORD_CONF"
    kill -s HUP "$COORD_PID"
    wait_for 5 log_more "$_n" 'configuration reloaded' || {
        echo "no 'configuration reloaded' in $COORD_LOG"
        tail "$COORD_LOG"
        return 1
    }
    grep -q 'socket changed' "$COORD_LOG" || { echo "no warning about the socket"; return 1; }
    [ ! -e "$COORD_STATE/other.sock" ] && coord_ping || { echo "the socket moved"; return 1; }
    # debug is applied: authentication is logged at debug level only
    probe_tcp --auth PING >/dev/null 2>&1
    wait_for 2 grep -q "authenticated uid=$(id -u)" "$COORD_LOG" || {
        echo "log_level=debug not applied"
        return 1
    }
    cp "$COORD_DIR/dt.conf.orig" "$COORD_CONF"
}
check "SIGHUP applies log_level and warns that socket needs a restart" t_sighup

t_sighup_bad() {
    _n=$(log_count 'reload refused')
    echo "frobnicate = 1" >>"$COORD_CONF"
    kill -s HUP "$COORD_PID"
    wait_for 5 log_more "$_n" 'reload refused' ||
        { echo "no 'reload refused' in the log"; tail "$COORD_LOG"; return 1; }
    cp "$COORD_DIR/dt.conf.orig" "$COORD_CONF"
    coord_ping && alive "$COORD_PID"
}
check "SIGHUP with a bad file keeps the running configuration" t_sighup_bad

t_second() {
    run_rc 1 "$DTCOORDD" -f "$COORD_CONF" && out_has "another dtcoordd" || return 1
    run_rc 1 "$DTCOORDD" -D -f "$COORD_CONF" && out_has "another dtcoordd" || return 1
    [ "$(cat "$COORD_STATE/dtcoordd.pid")" = "$COORD_PID" ] || {
        echo "the pidfile changed"
        return 1
    }
    coord_ping && alive "$COORD_PID"
}
check "a second dtcoordd on the same state dir exits 1 ('another dtcoordd')" t_second

t_unknown_key() {
    printf 'state_dir = %s\n# a comment\nfrobnicate = yes\n' "$TMPD/unused" >"$TMPD/bad.conf"
    run_rc 2 "$DTCOORDD" -D -f "$TMPD/bad.conf" && out_has "bad.conf:3:.*frobnicate" &&
        [ ! -e "$TMPD/unused" ]
}
check "a config with an unknown key exits 2 naming the key and line" t_unknown_key

t_limit_keys() {
    # the example's limit keys with their defaults, uncommented, start a
    # coordinator (checked with -D and stopped at once: any key error exits 2)
    _ex=$DT_SRCDIR/etc/dt.conf.example
    _keys='max_connections|max_connections_per_user|auth_timeout|idle_timeout|output_soft_limit|output_hard_limit|output_timeout'
    _n=$(grep -c -E "^#($_keys) = " "$_ex")
    [ "$_n" -eq 7 ] || { echo "$_n limit keys in $_ex, expected 7"; return 1; }
    mkdir -p "$TMPD/lim" || return 1
    { printf 'state_dir = %s\n' "$TMPD/lim/state"
      grep -E "^#($_keys) = " "$_ex" | sed 's/^#//'; } >"$TMPD/lim/dt.conf"
    "$DTCOORDD" -D -f "$TMPD/lim/dt.conf" >"$TMPD/lim/log" 2>&1 &
    _lp=$!
    wait_for 10 test -S "$TMPD/lim/state/dtcoordd.sock" || { cat "$TMPD/lim/log"; kill "$_lp"; return 1; }
    stop_pid "$_lp"
    # soft at or above hard is refused, naming both
    printf 'state_dir = %s\noutput_soft_limit = 64M\noutput_hard_limit = 32M\n' \
        "$TMPD/lim/state" >"$TMPD/lim/bad.conf"
    run_rc 2 "$DTCOORDD" -D -f "$TMPD/lim/bad.conf" &&
        out_has "output_soft_limit \(67108864 bytes\) must be below output_hard_limit" || return 1
    printf 'state_dir = %s\nidle_timeout = 0s\n' "$TMPD/lim/state" >"$TMPD/lim/bad.conf"
    run_rc 2 "$DTCOORDD" -D -f "$TMPD/lim/bad.conf" && out_has "bad.conf:2:.*idle_timeout"
}
check "the limit keys of dt.conf.example are accepted; soft >= hard and 0s are refused" \
    t_limit_keys

# ---- clean stop, restart, newer database ---------------------------------------------

t_stop() {
    coord_stop TERM
    [ ! -e "$COORD_SOCK" ] || { echo "socket left behind"; return 1; }
    [ ! -e "$COORD_STATE/dtcoordd.pid" ] || { echo "pidfile left behind"; return 1; }
    tail -n 1 "$COORD_LOG" | grep -q 'stopped' || { tail -n 3 "$COORD_LOG"; return 1; }
}
check "SIGTERM stops the daemon; socket and pidfile removed" t_stop

t_restart_fg() {
    coord_start || return 1
    snapshot again || return 1
    # agents came and went since the first snapshot: compare ids and states
    for _s in after again; do
        json_num id <"$TMPD/$_s.list" >"$TMPD/$_s.ids"
        json_str state <"$TMPD/$_s.list" >"$TMPD/$_s.states"
    done
    cmp "$TMPD/after.ids" "$TMPD/again.ids" && cmp "$TMPD/after.states" "$TMPD/again.states" ||
        { diff "$TMPD/after.list" "$TMPD/again.list"; return 1; }
    coord_stop TERM
    _rc=$?
    [ "$_rc" -eq 0 ] || { echo "SIGTERM: exit $_rc"; return 1; }
}
check "restart after a clean stop keeps every job; SIGTERM exits 0" t_restart_fg

t_newer_db() {
    _nd=$TMPD/newer
    mkdir -p "$_nd/state" && cp "$COORD_STATE/dt.db" "$_nd/state/dt.db" || return 1
    sqlite3 "$_nd/state/dt.db" 'PRAGMA user_version = 99' || return 1
    cp "$_nd/state/dt.db" "$_nd/dt.db.orig"
    printf 'state_dir = %s\n' "$_nd/state" >"$_nd/dt.conf"
    run_rc 1 "$DTCOORDD" -D -f "$_nd/dt.conf" && out_has "99" || return 1
    cmp "$_nd/state/dt.db" "$_nd/dt.db.orig" || { echo "the database was changed"; return 1; }
    head -n 1 "$TMPD/out"
}
if command -v sqlite3 >/dev/null 2>&1; then
    check "a database of a newer schema is refused and left untouched" t_newer_db
else
    echo "skip a database of a newer schema: the sqlite3 CLI is not installed (not counted)"
fi

munge_stop
check "no process left behind" none_left

finish
