#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Recovery, hang detection and checkpoint throughput of jobs on agents, with
# their baselines measured in the same run:
#   1. worker death -> the next generation running again. A private
#      dtcoordd and 2 dtagentd x 2 dtengine workers train the tiny model;
#      one worker is SIGKILLed. From the agents' logs (one clock, ms):
#      detection, abort on the other agent, the new generation spawned,
#      every rank past MPI_Init (hello), every rank stepping again (after
#      loading the checkpoint and one step). Baseline: the cold start of
#      generation 1 in the same run (agent start to hello), and the step
#      time. Target: < 2 s to every rank running again, plus the load.
#   2. hang: SIGSTOP a worker; the detection time against the configured
#      --hang-timeout.
#   3. checkpoints: write (all ranks, fsynced) and the agents' read-back
#      verify, against `dd conv=fsync` and `openssl dgst -sha256` (the same
#      libcrypto) on a file of the same size on the same disk. The agents
#      verify while the workers train on the same cores.
#   4. goodput, from the coordinator's step history (dtctl show, events):
#      a fault-free run's ETTR (productive step time over wall time from
#      the first step; target >= 0.95) with in-memory checkpoints every
#      step (the default) and without them (the baseline), and what a worker death costs:
#      steps and wall time lost, disk checkpoints only (mem_ckpt_every =
#      0) against in-memory ones (part 1's job: the default, every step).
# Usage: bench/recovery.sh [HANG_TIMEOUT (default 2s)]. Timings are what
# this machine gave; nothing is asserted.
set -u
B=$(cd "$(dirname "$0")/.." && pwd)
HANG=${1:-2s}
D=$(mktemp -d "${TMPDIR:-/tmp}/dt-bench-recovery.XXXXXX")
trap 'pkill -f "$D" 2>/dev/null; sleep 1; pkill -KILL -f "$D" 2>/dev/null; rm -rf "$D"' EXIT
export OMPI_MCA_btl_tcp_if_include=lo
CTL="$B/cli/dtctl --socket $D/state/sock"

cat >"$D/dt.conf" <<EOF
state_dir = $D/state
socket = $D/state/sock
heartbeat = 200ms
agent_timeout = 2s
EOF
cat >"$D/job.spec" <<EOF
kind = train
model = tiny
tokens = 1024
steps = 40
ranks = 4
nodes = 2
gpus_per_node = 2
gpu = cpu
ckpt_every = 10
seed = 1
EOF
"$B/coordinator/dtcoordd" -D -f "$D/dt.conf" >"$D/coord.log" 2>&1 &
for _ in 1 2 3 4 5 6 7 8 9 10; do [ -S "$D/state/sock" ] && break; sleep 0.2; done

# iso ms -> ms since midnight (one clock for every log here)
ms() { awk -F'[T:.]' '{ printf "%d\n", (($2 * 60 + $3) * 60 + $4) * 1000 + $5 }'; }
first() { grep -E "$2" "$1" | head -n 1 | cut -d' ' -f1 | ms; }
last() { grep -hE "$2" $1 | cut -d' ' -f1 | sort | tail -n 1 | ms; }

run_job() { # NAME [SPEC [SLOTS [SPARE]]]: a job and its two agents (a third, a2, with SPARE); sets J
    J=$($CTL submit "${2:-$D/job.spec}" --json | sed -n 's/^ *"id": \([0-9]*\),*$/\1/p' | head -n 1)
    for n in a0 a1 ${4:+a2}; do
        "$B/agent/dtagentd" --coord "unix:$D/state/sock" --job "$J" --node "$n" --slots "${3:-2}" \
            --state-dir "$D/$1-$n" --hang-timeout "$HANG" --grace 1s >"$D/$1-$n.log" 2>&1 &
    done
}
step_at() { # JOB N: wait until some rank reports step >= N
    for _ in $(seq 1 1200); do
        s=$($CTL show "$1" --json | sed -n 's/^ *"step": \([0-9]*\),*$/\1/p' | sort -n | tail -n 1)
        [ -n "$s" ] && [ "$s" -ge "$2" ] && return 0
        sleep 0.1
    done
    return 1
}
wait_end() {
    for _ in $(seq 1 1200); do
        case $($CTL show "$1" --json | sed -n 's/^ *"state": "\(.*\)",*$/\1/p' | head -n 1) in
        completed | failed | cancelled) break ;;
        esac
        sleep 0.2
    done
    sleep 1
}

# ---- 1. worker death ------------------------------------------------------------------
run_job kill
step_at "$J" 15 || echo "job $J never reached step 15"
victim=$(pgrep -f "$D/kill-a1/gen-1" | head -n 1)
kill -KILL "$victim"
wait_end "$J"
L="$D/kill-a0.log $D/kill-a1.log"
t_start=$(first "$D/kill-a0.log" "started$")
t_hello1=$(last "$L" "gen=1 rank=.* hello")
t_exit=$(first "$D/kill-a1.log" "gen=1 rank=.*exited .*signal=9")
t_abort=$(first "$D/kill-a0.log" "gen=1 aborting")
t_spawn=$(last "$L" "gen=2 rank=.* started")
t_hello2=$(last "$L" "gen=2 rank=.* hello")
t_run2=$(last "$L" "gen=2 rank=.* running")
step_s=$(grep -h '^step ' "$D/kill-a0.log" "$D/kill-a1.log" | awk '{ s += 1024 / $6; n++ } END { if (n) printf "%.3f", s / n }')
echo "## worker death -> next generation (tiny model, T=1024, 4 ranks on 2 agents, 2 cores)"
echo
echo "| phase | ms after the SIGKILL was seen |"
echo "|---|---:|"
echo "| the other agent aborts its workers | $((t_abort - t_exit)) |"
echo "| generation 2 spawned on both agents | $((t_spawn - t_exit)) |"
echo "| every rank past MPI_Init (hello) | $((t_hello2 - t_exit)) |"
echo "| every rank stepping again (checkpoint load + 1 step) | $((t_run2 - t_exit)) |"
echo
echo "baseline, same run: cold start of generation 1 (agent start to every hello) $((t_hello1 - t_start)) ms; one training step ${step_s} s"
echo

J_KILL=$J

# ---- 2. hang ---------------------------------------------------------------------------
run_job hang
step_at "$J" 15 || echo "job $J never reached step 15"
victim=$(pgrep -f "$D/hang-a0/gen-1" | head -n 1)
kill -STOP "$victim"
wait_end "$J"
det=$(grep -h "silent for" "$D/hang-a0.log" "$D/hang-a1.log" | sort | head -n 1 | sed 's/.*silent for \([0-9]*\) ms (hang timeout \([0-9]*\) ms).*/\1 \2/')
echo "## hang detection"
echo
echo "(the first agent to see silence; with one rank stopped, its peers block in the ring and"
echo "go silent at the same step, so the first report may name a blocked peer)"
echo
echo "| hang timeout ms | detected after ms (last frame to kill) | over the timeout ms |"
echo "|---:|---:|---:|"
echo "$det" | awk '{ printf "| %d | %d | %d |\n", $2, $1, $1 - $2 }'
echo

# ---- 3. checkpoints --------------------------------------------------------------------
# one rank per core here (2 agents x 1 worker): with more ranks than cores,
# ranks that wait in a collective spin and take the core from those writing
sed -e 's/^ranks = 4$/ranks = 2/' -e 's/^gpus_per_node = 2$/gpus_per_node = 1/' \
    -e 's/^ckpt_every = 10$/ckpt_every = 4/' "$D/job.spec" >"$D/ckpt.spec"
run_job ckpt "$D/ckpt.spec" 1
wait_end "$J"
echo "## checkpoint write and verify vs the disk (2 ranks on 2 agents, one per core; filesystem of $D)"
echo
C="$D/ckpt-a0.log $D/ckpt-a1.log"
bytes=$(grep -h '^checkpoint step' $C | head -n 1 | awk '{ print $5 }')
grep -h '^checkpoint step' $C |
    awk '{ b += $5; t += $7; n++ } END { if (n) printf "%d %.6f %d\n", b, t, n }' >"$D/w.txt"
grep -h 'shard verified' $C | sed 's/.*: \([0-9]*\) bytes in \([0-9.]*\) ms/\1 \2/' |
    awk '{ b += $1; t += $2; n++ } END { if (n) printf "%d %.3f %d\n", b, t / 1000, n }' >"$D/v.txt"
mb=$(( (bytes + 1048575) / 1048576 ))
t0=$(date +%s.%N)
dd if=/dev/urandom of="$D/dd.bin" bs=1M count="$mb" 2>/dev/null
t1=$(date +%s.%N)
dd if="$D/dd.bin" of="$D/dd2.bin" bs=1M conv=fsync 2>/dev/null
t2=$(date +%s.%N)
openssl dgst -sha256 "$D/dd2.bin" >/dev/null
t3=$(date +%s.%N)
awk -v w="$(cat "$D/w.txt")" -v v="$(cat "$D/v.txt")" -v mb="$mb" -v t1="$t1" -v t2="$t2" -v t3="$t3" 'BEGIN {
    split(w, W, " "); split(v, V, " ");
    ddw = mb / (t2 - t1); sha = mb / (t3 - t2);
    cw = W[1] / 1048576 / W[2]; cv = V[1] / 1048576 / V[2];
    print "| what | MiB/s | baseline MiB/s | fraction |"
    print "|---|---:|---:|---:|"
    printf "| checkpoint write, %d checkpoints of %.1f MiB (2 shards, fsync) | %.0f | dd conv=fsync %.0f | %.0f%% |\n", W[3], W[1] / W[3] / 1048576, cw, ddw, 100 * cw / ddw
    printf "| agent read-back + sha256, %d shards | %.0f | openssl dgst -sha256 %.0f | %.0f%% |\n", V[3], cv, sha, 100 * cv / sha
}'

# ---- 4. goodput ---------------------------------------------------------------------------
sed -e 's/^steps = 40$/steps = 120/' -e 's/^ckpt_every = 10$/ckpt_every = 40/' "$D/job.spec" \
    >"$D/free.spec"
run_job free "$D/free.spec"
wait_end "$J"
J_FREE=$J
# the same without in-memory checkpoints: what the copies cost a step
sed 's/^ckpt_every = 40$/ckpt_every = 40\nmem_ckpt_every = 0/' "$D/free.spec" >"$D/free0.spec"
run_job free0 "$D/free0.spec"
wait_end "$J"
J_FREE0=$J
# part 1's worker death again, with disk checkpoints only; and an agent
# (a node) lost with a spare present, both ways
sed 's/^ckpt_every = 10$/ckpt_every = 10\nmem_ckpt_every = 0/' "$D/job.spec" >"$D/disk.spec"
run_job killdisk "$D/disk.spec"
step_at "$J" 15 || echo "job $J never reached step 15"
kill -KILL "$(pgrep -f "$D/killdisk-a1/gen-1" | head -n 1)"
wait_end "$J"
J_DISK=$J
agent_kill() { # NAME SPEC: SIGKILL agent a1 at step 15, a2 spare; sets J
    run_job "$1" "$2" 2 spare
    step_at "$J" 15 || echo "job $J never reached step 15"
    pkill -KILL -f -- "--state-dir $D/$1-a1 "
    wait_end "$J"
}
agent_kill agentdisk "$D/disk.spec"
J_ADISK=$J
agent_kill agentmem "$D/job.spec"
J_AMEM=$J
goodput() { # JOB: "ETTR productive wall recomputed stall" from dtctl show's goodput line
    $CTL show "$1" | sed -n 's/^  goodput   ETTR \([0-9.]*\)  productive \([0-9.]*\) s of \([0-9.]*\) s  recomputed \([0-9.]*\) s  checkpoint stall \([0-9.]*\) s$/\1 \2 \3 \4 \5/p'
}
cost() { # JOB FAILURE LABEL: its failure_cost as a table row
    $CTL events "$1" | grep failure_cost | head -n 1 | sed 's/.*{\(.*\)}.*/\1/' | tr ',' '\n' |
        sed 's/"//g' | awk -F: -v f="$2" -v l="$3" '{ v[$1] = $2 } END {
            printf "| %s | %s | %d | %.3f | %.3f | %.3f | %.3f | %.3f |\n",
                f, l, v["recomputed_steps"], v["detect_s"], v["restart_s"], v["load_s"],
                v["recomputed_s"], v["detect_s"] + v["restart_s"] + v["load_s"] + v["recomputed_s"] }'
}
echo
echo "## goodput (the coordinator's step history; ETTR = productive step time / wall time from the first step)"
echo
echo "| run | steps | checkpoints | ETTR | productive s | wall s | recomputed s | checkpoint stall s |"
echo "|---|---:|---|---:|---:|---:|---:|---:|"
goodput "$J_FREE0" | awk '{ printf "| fault-free | 120 | disk every 40 | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }'
goodput "$J_FREE" | awk '{ printf "| fault-free | 120 | disk every 40, memory every step | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }'
goodput "$J_DISK" | awk '{ printf "| one worker SIGKILLed | 40 | disk every 10 | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }'
goodput "$J_KILL" | awk '{ printf "| one worker SIGKILLed (part 1) | 40 | disk every 10, memory every step | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }'
goodput "$J_ADISK" | awk '{ printf "| one agent SIGKILLed, a spare | 40 | disk every 10 | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }'
goodput "$J_AMEM" | awk '{ printf "| one agent SIGKILLed, a spare | 40 | disk every 10, memory every step | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }'
echo
echo "| failure | checkpoints | steps lost | detect s | restart s | load s | recomputed s | wall lost s |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"
cost "$J_DISK" "worker SIGKILL at step 15" "disk only (ckpt_every 10)"
cost "$J_KILL" "worker SIGKILL at step 15" "in memory (mem_ckpt_every 1)"
cost "$J_ADISK" "agent SIGKILL at step 15, a spare" "disk only (ckpt_every 10)"
cost "$J_AMEM" "agent SIGKILL at step 15, a spare" "in memory: fetched from its replicas"
