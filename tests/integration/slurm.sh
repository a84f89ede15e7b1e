#!/bin/sh
# SPDX-License-Identifier: MIT
#
# dt through a real Slurm cluster: munged, slurmctld and three slurmd on
# loopback (contrib/slurm/dt-cluster), a dtcoordd with slurm = yes that
# submits each job through libslurm as a batch job running one dtagentd
# per node under srun, each the PMIx server of 2 dtengine workers. Checks:
#   - configuration errors (slurm = yes without listen, a bad slurm_env, no
#     slurm.conf) stop dtcoordd with a message naming them;
#   - a job that cannot be planned is refused before it reaches Slurm, and
#     so is one whose warning signal NCCL would catch (this site's
#     slurm_env sets NCCL_PROXY_DUMP_SIGNAL=10: USR1) or that srun cannot
#     forward;
#   - --dry-run prints the batch script and submits nothing;
#   - submit -> runs -> completes with the checksum of `dtctl run --local`
#     on the same spec, and list/show give the Slurm state beside dt's;
#   - SIGKILL an agent with no spare: the job is requeued with that node
#     excluded, resumes from its checkpoint on the other nodes, and
#     completes with the same checksum;
#   - SIGKILL an agent with a spare node: the spare takes over, no requeue;
#   - USR2 to the batch shell (what --signal=B:USR2@lead, the default
#     warning signal, sends before the time limit): checkpoint, requeue at
#     no cost to the restart budget, same checksum; USR1 (NCCL's here)
#     before it is ignored;
#   - dtctl cancel cancels the Slurm job; cancel --checkpoint then
#     dtctl resume: a new Slurm job finishes the job, same checksum;
#   - a deterministic failure fails the job and is not requeued;
#   - SIGKILL dtcoordd mid-run and start it again: it follows the Slurm job
#     again, the agents reattach, same checksum;
#   - dtcoordd killed after slurmctld took a job but before it stored the
#     Slurm id (DT_TEST_CRASH_AFTER_SUBMIT): restarted, it finds that Slurm
#     job by name and adopts it: one Slurm job, the job completes;
#   - a job of 3 nodes on the 3-node cluster loses one: the requeue that
#     excludes it could never start, so the job fails at once with an
#     event naming the node, and its Slurm job is cancelled;
#   - every poll of slurmctld is one slurm_load_jobs for all the jobs, not
#     one slurm_load_job per job (sdiag's RPC counts);
#   - scontrol requeue (Slurm's own requeue, not dt's): one requeue, noticed from
#     the restart count (or joined, when the workers died of Slurm's SIGTERM
#     first), resumed, same checksum;
#   - a node set DOWN under the running job: requeued without it, same
#     checksum;
#   - a job of a higher-priority partition preempts the job: Slurm's USR2,
#     checkpoint, requeue, the preemptor runs, the job completes, same
#     checksum;
#   - a device = cuda job asks Slurm for GPUs and CPUs per GPU; where the
#     engine on simulated GPUs is built (tests/gpu/dtengine-sim, then the
#     engine of every job here) an attn job runs on the GPUs Slurm gives
#     and completes as `mpirun dtengine-sim` does, else the GPU-less agents
#     are refused and no worker starts;
#   - attn and prefill jobs complete as `mpirun dtengine KIND --spec` does,
#     their outputs named by dtctl show.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/coordlib.sh"
. "$(dirname "$0")/slurmlib.sh"
need_mpirun

DTAGENTD=$DT_BUILDDIR/agent/dtagentd
[ -x "$DTAGENTD" ] || die "$DTAGENTD is not built"

slurm_up 3 16900 --preempt --gpus 2
# the cluster's munged serves dt too: agents authenticate with it
MUNGE_SOCKET=$DT_MUNGE_SOCKET
# A batch job's environment is slurm_env, not this shell's: pass on this
# machine's OPENBLAS_* settings (OPENBLAS_CORETYPE picks the kernels, and
# so the last bits of a matrix product), or the jobs' checksums differ from
# that of `dtctl run --local`, which runs with them.
BLAS_ENV=$(env | grep -E '^OPENBLAS_[A-Z0-9_]+=[^ ]*$' | tr '\n' ' ')
# The engine on simulated GPUs where it is built (tests/gpu/sim): the CPU
# path is the real engine's, and a GPU job's workers see the GPUs Slurm
# gives them (CUDA_VISIBLE_DEVICES) as simulated devices; else the real
# one, whose agents have no GPU here
SIM=$DT_BUILDDIR/tests/gpu/dtengine-sim
JOB_ENGINE=$DTENGINE
[ -x "$SIM" ] && JOB_ENGINE=$SIM
COORD_CONF_EXTRA="slurm = yes
slurm_conf = $SLURM_CONF
slurm_agent = $DTAGENTD
slurm_engine = $JOB_ENGINE
slurm_poll = 300ms
slurm_hang_timeout = 10s
slurm_env = OMPI_MCA_btl_tcp_if_include=lo OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_PROXY_DUMP_SIGNAL=10 $BLAS_ENV"
coord_setup
coord_start || die "dtcoordd did not start"

STEPS=120
job_spec() { # NAME [extra lines]
    small_job_spec | sed "s/^steps = .*/steps = $STEPS/; s/^ckpt_every = .*/ckpt_every = 20/"
    echo "name = $1"
    echo "nodes = 2"
    echo "gpus_per_node = 2"
    echo "time_limit = 30m"
    shift
    for _l in "$@"; do echo "$_l"; done
}

submit() { # SPEC: prints the job id
    ctl submit "$1" --json | json_num id | head -n 1
}
step_of() { ctl show "$1" --json | json_num step | sort -n | tail -n 1; }
step_at_least() {
    _sa=$(step_of "$1")
    [ -n "$_sa" ] && [ "$_sa" -ge "$2" ]
}
checksum_of() { ctl show "$1" --json | json_str checksum | head -n 1; }
slurm_id_of() { ctl show "$1" --json | sed -n '/"slurm": {/,/}/p' | json_num id | head -n 1; }
slurm_state_of() { ctl show "$1" --json | sed -n '/"slurm": {/,/}/p' | json_str state | head -n 1; }
events_of() { ctl events "$1"; }
# agents of dt JOB running on this host: "PID NODE" lines (dtagentd
# processes only: srun's command line names dtagentd too)
agents_of() {
    for _p in $(pgrep -x dtagentd 2>/dev/null); do
        tr '\0' ' ' <"/proc/$_p/cmdline" 2>/dev/null |
            grep -q -- "--coord 127.0.0.1:$COORD_PORT --job $1 " || continue
        _n=$(tr '\0' '\n' <"/proc/$_p/environ" 2>/dev/null | sed -n 's/^SLURMD_NODENAME=//p')
        [ -n "$_n" ] && echo "$_p $_n"
    done
}
agent_count() { [ "$(agents_of "$1" | wc -l)" -eq "$2" ]; }
no_workers_of() { ! pgrep -f "dtengine(-sim)? train .*jobs/$1/ckpt" >/dev/null 2>&1; }
squeue_empty() { [ -z "$(squeue -h -o %i 2>/dev/null)" ]; }
slurm_recorded() { [ "$(slurm_state_of "$1")" = "$2" ]; }
slurm_final() { # SLURMID STATE: scontrol says STATE (an ERE: A|B for either)
    scontrol show job "$1" 2>/dev/null | grep -Eq "JobState=($2) "
}

# run_until SPECFILE STEP: submit it and wait (60 s at most) until a rank
# reached STEP; sets J (the job) and SID (its Slurm job)
run_until() {
    J=$(submit "$1")
    [ -n "$J" ] || { echo "submit $1 failed"; return 1; }
    wait_for 60 step_at_least "$J" "$2" || {
        echo "job $J never reached step $2"
        events_of "$J" | tail -n 20 | sed 's/^/  | /'
        return 1
    }
    SID=$(slurm_id_of "$J")
}

# events_have ERE WHAT: the job's events match ERE, else say WHAT is missing
events_have() {
    events_of "$J" >"$TMPD/ev"
    grep -q -E -e "$1" "$TMPD/ev" && return 0
    echo "no $2 in the events of job $J:"
    sed 's/^/  | /' "$TMPD/ev"
    return 1
}

# wait_done JOB SECONDS: the job reached a final state
wait_done() {
    wait_for "$2" terminal "$1" && return 0
    echo "job $1 still $(state_of "$1") after $2 s; events:"
    events_of "$1" | tail -n 25 | sed 's/^/  | /'
    return 1
}

completed_with() { # JOB CHECKSUM
    _st=$(state_of "$1")
    _cs=$(checksum_of "$1")
    if [ "$_st" = completed ] && [ "$_cs" = "$2" ]; then
        return 0
    fi
    echo "job $1: state $_st checksum $_cs, expected completed $2"
    events_of "$1" | tail -n 25 | sed 's/^/  | /'
    return 1
}

# DT_SLURM_CHECKS="name ..." runs only those checks (t_NAME), for debugging
only() {
    [ -z "${DT_SLURM_CHECKS:-}" ] || echo " $DT_SLURM_CHECKS " | grep -q " $1 "
}

# ---- configuration errors ----------------------------------------------------

t_conf_errors() {
    mkdir -p "$TMPD/bad" || return 1
    printf 'state_dir = %s\nslurm = yes\n' "$TMPD/bad/state" >"$TMPD/bad/nolisten.conf"
    run_rc 2 "$DTCOORDD" -D -f "$TMPD/bad/nolisten.conf" || return 1
    out_has "nolisten.conf: slurm = yes needs listen" || return 1
    printf 'state_dir = %s\nslurm = yes\nlisten = 127.0.0.1:1\nslurm_env = A=1 junk\n' \
        "$TMPD/bad/state" >"$TMPD/bad/env.conf"
    run_rc 2 "$DTCOORDD" -D -f "$TMPD/bad/env.conf" || return 1
    out_has "slurm_env: 'junk' is not NAME=VALUE" || return 1
    printf 'state_dir = %s\nslurm = yes\nlisten = 127.0.0.1:0\nslurm_conf = %s\n' \
        "$TMPD/bad/state" "$TMPD/bad/none.conf" >"$TMPD/bad/noslurm.conf"
    run_rc 1 "$DTCOORDD" -D -f "$TMPD/bad/noslurm.conf" || return 1
    out_has "$TMPD/bad/none.conf" && out_has "No such file"
}
only conf_errors && check "slurm = yes without listen, a bad slurm_env, a missing slurm.conf: refused, named" \
    t_conf_errors

# ---- refused before Slurm, dry run -----------------------------------------

t_refused() {
    job_spec toobig | sed 's/^tokens = .*/tokens = 64M/; s/^ranks = .*/ranks = 1/' >"$TMPD/big.spec"
    run_rc 6 ctl submit "$TMPD/big.spec" || return 1
    out_has "refused|does not fit|memory" || return 1
    squeue_empty || { echo "something reached Slurm:"; squeue; return 1; }
    run_rc 0 ctl list || return 1
    out_lacks toobig
}
only refused && check "a job that cannot be planned is refused before it reaches Slurm" t_refused

# This site's slurm_env sets NCCL_PROXY_DUMP_SIGNAL=10: a USR1 job is
# refused (exit 6, as the planner's refusals), the default USR2 is not;
# a signal srun cannot forward is a spec error (exit 2, dtctl's own check).
t_signal_refused() {
    job_spec nccl "signal = USR1" >"$TMPD/nccl.spec"
    run_rc 6 ctl submit "$TMPD/nccl.spec" || return 1
    out_has "signal = USR1: the job's environment sets NCCL_PROXY_DUMP_SIGNAL=10 \(slurm_env in" ||
        return 1
    out_has "use signal = USR2" || return 1
    run_rc 6 ctl submit "$TMPD/nccl.spec" --dry-run || return 1
    job_spec term "signal = TERM" >"$TMPD/term.spec"
    run_rc 2 ctl submit "$TMPD/term.spec" || return 1
    out_has "key 'signal': unknown value 'TERM' \(expected USR1 or USR2\)" || return 1
    squeue_empty || { echo "something reached Slurm:"; squeue; return 1; }
    run_rc 0 ctl list || return 1
    out_lacks ' nccl ' && out_lacks ' term '
}
only signal_refused && check "a warning signal NCCL would catch, or srun cannot forward: refused" \
    t_signal_refused

t_dry_run() {
    job_spec dry >"$TMPD/dry.spec"
    run_rc 0 ctl submit "$TMPD/dry.spec" --dry-run || return 1
    for want in '^#!/bin/sh' '^#SBATCH --signal=B:USR2@' '^#SBATCH --requeue' \
        '^#SBATCH --open-mode=append' '^#SBATCH --nodes=2' '^srun ' '--kill-on-bad-exit=0' \
        'dtagentd' ' --signal USR2' '^trap forward_warning USR2' '^#SBATCH --job-name=dt-0\.0-dry$'; do
        out_has "$want" || return 1
    done
    cp "$TMPD/out" "$TMPD/dry.sh"
    sh -n "$TMPD/dry.sh" || { echo "the script does not parse"; return 1; }
    squeue_empty || { echo "a dry run reached Slurm:"; squeue; return 1; }
    run_rc 0 ctl list || return 1
    out_lacks ' dry '
}
only dry_run && check "submit --dry-run prints the batch script and submits nothing" t_dry_run

# ---- fault-free, against dtctl run --local ---------------------------------

job_spec clean >"$TMPD/clean.spec"
REF=
t_local() {
    run_rc 0 "$DTCTL" run --local "$TMPD/clean.spec" --state-dir "$TMPD/local" || return 1
    REF=$(sed -n 's/.*state=completed .*checksum=\([0-9a-f]*\).*/\1/p' "$TMPD/out" | tail -n 1)
    [ -n "$REF" ] || { echo "no checksum from dtctl run --local"; tail -n 5 "$TMPD/out"; return 1; }
}
check "dtctl run --local on the spec gives the reference checksum" t_local

t_clean() {
    J=$(submit "$TMPD/clean.spec")
    [ -n "$J" ] || { echo "submit failed"; return 1; }
    wait_done "$J" 180 || return 1
    completed_with "$J" "$REF" || return 1
    SID=$(slurm_id_of "$J")
    [ -n "$SID" ] || { echo "job $J has no Slurm job id"; return 1; }
    wait_for 20 slurm_final "$SID" COMPLETED || { scontrol show job "$SID"; return 1; }
    wait_for 10 slurm_recorded "$J" COMPLETED ||
        { echo "dt recorded slurm state $(slurm_state_of "$J")"; return 1; }
    run_rc 0 ctl list || return 1
    out_has "^ *$J +clean .*completed +$SID COMPLETED" || return 1
    run_rc 0 ctl show "$J" || return 1
    out_has "slurm +job $SID +COMPLETED" && out_has "output .*dt-$J\\.out" || return 1
    # the batch job's output file, appended by the agents' runs
    grep -q "agents ended with status 0" "$COORD_STATE/jobs/$J/dt-$J.out" ||
        { echo "output:"; sed 's/^/  | /' "$COORD_STATE/jobs/$J/dt-$J.out" | tail; return 1; }
    # dtctl logs: the batch output without --rank, a rank's log with it
    run_rc 0 ctl logs "$J" && out_has "agents ended with status 0" || return 1
    run_rc 0 ctl logs "$J" --rank 0 && out_has "dtagentd: job=$J gen=1 rank=0 " || return 1
    events_have slurm_submitted "submission" && events_have 'slurm_state .*RUNNING' "RUNNING"
}
only clean && check "submit: runs under Slurm and completes with the run --local checksum" t_clean

# ---- one slurm_load_jobs per poll ----------------------------------------

# sdiag's count of RPC TYPE since slurmctld started (0 when none yet)
rpc_count() {
    _rc=$(sdiag 2>/dev/null | sed -n "s/^[[:space:]]*$1[[:space:]][^:]*count:\\([0-9]*\\).*/\\1/p")
    echo "${_rc:-0}"
}

# Two jobs that pend (4 nodes on 3): their Slurm state is followed, and
# for 3 s of polls (every 300 ms) slurmctld gets no slurm_load_job
# (REQUEST_JOB_INFO_SINGLE) and about one slurm_load_jobs (REQUEST_JOB_INFO)
# a poll. No scontrol or squeue runs in between.
t_poll() {
    job_spec poll1 | sed 's/^nodes = .*/nodes = 4/; s/^gpus_per_node = .*/gpus_per_node = 1/' \
        >"$TMPD/poll1.spec"
    sed 's/^name = .*/name = poll2/' "$TMPD/poll1.spec" >"$TMPD/poll2.spec"
    _j1=$(submit "$TMPD/poll1.spec")
    _j2=$(submit "$TMPD/poll2.spec")
    [ -n "$_j1" ] && [ -n "$_j2" ] || { echo "submit failed"; return 1; }
    wait_for 20 slurm_recorded "$_j1" PENDING && wait_for 20 slurm_recorded "$_j2" PENDING ||
        { echo "jobs $_j1 $_j2: $(slurm_state_of "$_j1") $(slurm_state_of "$_j2")"; return 1; }
    _s0=$(rpc_count REQUEST_JOB_INFO_SINGLE)
    _a0=$(rpc_count REQUEST_JOB_INFO)
    sleep 3
    _s1=$(rpc_count REQUEST_JOB_INFO_SINGLE)
    _a1=$(rpc_count REQUEST_JOB_INFO)
    run_rc 0 ctl cancel "$_j1" && run_rc 0 ctl cancel "$_j2" || return 1
    _single=$((_s1 - _s0)) _all=$((_a1 - _a0))
    [ "$_single" -eq 0 ] && [ "$_all" -ge 3 ] && [ "$_all" -le 14 ] ||
        { echo "in 3 s: $_all slurm_load_jobs, $_single slurm_load_job for 2 jobs"; return 1; }
    wait_for 20 squeue_empty || { squeue; return 1; }
    echo "in 3 s of polls every 300 ms for 2 jobs: $_all slurm_load_jobs, $_single slurm_load_job"
}
only poll && check "one slurm_load_jobs per poll for every job, no slurm_load_job" t_poll

# ---- an agent lost, no spare: requeue with the node excluded ---------------

t_requeue_exclude() {
    job_spec nospare >"$TMPD/nospare.spec"
    run_until "$TMPD/nospare.spec" 30 || return 1
    set -- $(agents_of "$J" | head -n 1)
    [ -n "${1:-}" ] || { echo "no agent of job $J found"; return 1; }
    _victim=$2
    kill -KILL "$1"
    wait_done "$J" 240 || return 1
    completed_with "$J" "$REF" || return 1
    events_have "requeued .*excluding $_victim" "requeue excluding $_victim" || return 1
    scontrol show job "$SID" >"$TMPD/sj"
    grep -q "ExcNodeList=$_victim" "$TMPD/sj" && grep -q "Restarts=1" "$TMPD/sj" ||
        { echo "slurm job:"; sed 's/^/  | /' "$TMPD/sj"; return 1; }
    _nodes=$(sed -n 's/^ *NodeList=\([^ ]*\).*/\1/p' "$TMPD/sj" | head -n 1)
    case $_nodes in *"$_victim"*) echo "reran on $_nodes, which has $_victim"; return 1 ;; esac
    events_have 'generation_started.*resume_step=[1-9]' "resume from a checkpoint"
}
only requeue_exclude && check "SIGKILL an agent, no spare: requeued without its node, resumed, same checksum" \
     t_requeue_exclude

# ---- an agent lost with a spare node: no requeue ----------------------------

t_spare() {
    job_spec spare "spares = 2" | sed 's/^nodes = .*/nodes = 3/' >"$TMPD/spare.spec"
    run_until "$TMPD/spare.spec" 30 || return 1
    wait_for 10 agent_count "$J" 3 || { echo "expected 3 agents (one spare)"; agents_of "$J"; return 1; }
    # an agent that hosts ranks (its workers are its children), not the
    # spare
    _v=
    for _p in $(agents_of "$J" | cut -d' ' -f1); do
        pgrep -P "$_p" >/dev/null && { _v=$_p; break; }
    done
    [ -n "$_v" ] || { echo "no agent of job $J runs a worker"; agents_of "$J"; return 1; }
    kill -KILL "$_v"
    wait_done "$J" 180 || return 1
    completed_with "$J" "$REF" || return 1
    run_rc 0 ctl show "$J" --json || return 1
    out_has '"requeues": 0' || return 1
    events_of "$J" >"$TMPD/ev"
    ! grep -q ' requeued ' "$TMPD/ev" || { echo "requeued despite a spare"; return 1; }
    # its ranks' in-memory copies, replicated over the agents' TCP peer
    # channel (munge), fetched by the spare
    events_have 'resumed_step .*gen=2: resumed step [1-9][0-9]* from memory' \
        "a resume from the replicas"
}
only spare && check "SIGKILL an agent with a spare node: the spare takes over from the replicas, no requeue" t_spare

# ---- the warning signal before the time limit --------------------------------

warned_of() { grep -q "$2" "$COORD_STATE/jobs/$1/dt-$1.out"; }

t_warning() {
    job_spec warn >"$TMPD/warn.spec"
    run_until "$TMPD/warn.spec" 30 || return 1
    # USR1 is NCCL's here: to the batch shell and to every process of the
    # step (agents, workers), it is no warning and kills nothing
    scancel --full --signal=USR1 "$SID" || return 1
    wait_for 10 warned_of "$J" "USR1 received and ignored: the warning signal is USR2" || {
        echo "the batch shell did not ignore USR1:"
        tail -n 5 "$COORD_STATE/jobs/$J/dt-$J.out"
        return 1
    }
    _s=$(step_of "$J")
    wait_for 30 step_at_least "$J" $((_s + 5)) ||
        { echo "the job stopped at step $_s after USR1"; events_of "$J" | tail -n 8; return 1; }
    ! events_of "$J" | grep -q -E 'preempt_requested|worker_exit|agent_lost' ||
        { echo "USR1 stopped something:"; events_of "$J" | tail -n 8; return 1; }
    # what --signal=B:USR2@lead does at the lead: USR2 to the batch shell only
    scancel --signal=USR2 --batch "$SID" || return 1
    wait_done "$J" 240 || return 1
    completed_with "$J" "$REF" || return 1
    events_have 'preempt_requested .*SIGUSR2 from Slurm' "stop for the signal" &&
        events_have ' requeued ' "requeue" || return 1
    run_rc 0 ctl show "$J" --json || return 1
    out_has '"restarts": 0' && out_has '"requeues": 1' || return 1
    warned_of "$J" "USR2 received, forwarding it to srun" ||
        { echo "the batch output does not mention USR2"; return 1; }
}
only warning && check "USR1 (NCCL's) ignored; USR2 to the batch shell: checkpoint, requeue, same checksum" \
    t_warning

# ---- cancel, cancel --checkpoint and resume ---------------------------------

t_cancel() {
    job_spec cancel >"$TMPD/cancel.spec"
    run_until "$TMPD/cancel.spec" 5 || return 1
    run_rc 0 ctl cancel "$J" || return 1
    wait_for 30 slurm_final "$SID" CANCELLED || { scontrol show job "$SID"; return 1; }
    [ "$(state_of "$J")" = cancelled ] || return 1
    wait_for 30 agent_count "$J" 0 || { agents_of "$J"; return 1; }
    wait_for 30 no_workers_of "$J" || { echo "workers left"; return 1; }
}
only cancel && check "dtctl cancel cancels the Slurm job, nothing left running" t_cancel

t_resume() {
    job_spec resume >"$TMPD/resume.spec"
    run_until "$TMPD/resume.spec" 30 || return 1
    run_rc 0 ctl cancel "$J" --checkpoint || return 1
    wait_done "$J" 60 || return 1
    [ "$(state_of "$J")" = cancelled ] || return 1
    run_rc 0 ctl resume "$J" || return 1
    out_has "resumes from the checkpoint at step [1-9]" || return 1
    wait_done "$J" 180 || return 1
    completed_with "$J" "$REF" || return 1
    SID2=$(slurm_id_of "$J")
    [ -n "$SID2" ] && [ "$SID2" != "$SID" ] ||
        { echo "resume did not submit a new Slurm job ($SID -> $SID2)"; return 1; }
    run_rc 1 ctl resume "$J" || return 1
    out_has "only a failed or cancelled job resumes"
}
only resume && check "cancel --checkpoint, then dtctl resume: a new Slurm job completes it, same checksum" \
     t_resume

# ---- a deterministic failure is not requeued --------------------------------

t_deterministic() {
    job_spec det "ckpt_dir = /dev/null/ckpt" "max_restarts = 3" >"$TMPD/det.spec"
    J=$(submit "$TMPD/det.spec")
    wait_done "$J" 120 || return 1
    [ "$(state_of "$J")" = failed ] || return 1
    SID=$(slurm_id_of "$J")
    wait_for 30 slurm_final "$SID" FAILED || { scontrol show job "$SID"; return 1; }
    scontrol show job "$SID" | grep -q "Restarts=0" || { echo "requeued"; return 1; }
    events_of "$J" | grep -q deterministic_failure || return 1
}
only deterministic && check "a deterministic failure fails the job and its Slurm job, no requeue" t_deterministic

# ---- the coordinator restarted, Slurm's own requeue, preemption ----------

t_coord_restart() {
    job_spec restart >"$TMPD/restart.spec"
    run_until "$TMPD/restart.spec" 30 || return 1
    coord_stop KILL
    sleep 1
    coord_start || return 1
    wait_done "$J" 180 || return 1
    completed_with "$J" "$REF" || return 1
    run_rc 0 ctl show "$J" --json || return 1
    out_has '"requeues": 0' && out_has '"restarts": 0' || return 1
    wait_for 10 slurm_recorded "$J" COMPLETED ||
        { echo "slurm state $(slurm_state_of "$J") after the restart"; return 1; }
}
only coord_restart && check "SIGKILL dtcoordd mid-run, start it again: same Slurm job, same checksum" \
    t_coord_restart

# dtcoordd dies after slurmctld took the job, before the Slurm id is
# stored; started again, it must find that Slurm job by its name, not
# submit a second one.
job_named() { ctl list | awk -v n="$1" '$2 == n { print $1 }' | tail -n 1; }
slurm_jobs_named() { squeue -h -t all -o %j 2>/dev/null | grep -c "^dt-$1\\."; }

t_adopt() {
    coord_stop || :
    DT_TEST_CRASH_AFTER_SUBMIT=1
    export DT_TEST_CRASH_AFTER_SUBMIT
    coord_start
    _rc=$?
    unset DT_TEST_CRASH_AFTER_SUBMIT
    [ "$_rc" -eq 0 ] || return 1
    job_spec adopt >"$TMPD/adopt.spec"
    J=$(submit "$TMPD/adopt.spec")
    if ! wait_for 30 dead "$COORD_PID"; then
        echo "dtcoordd did not die after the submission (DT_TEST_CRASH_AFTER_SUBMIT)"
        coord_stop
        coord_start
        return 1
    fi
    coord_stop 2>/dev/null
    grep -q "DT_TEST_CRASH_AFTER_SUBMIT is set: dying before it is recorded" "$COORD_LOG" ||
        { echo "no crash in the log:"; tail -n 5 "$COORD_LOG"; return 1; }
    coord_start || return 1
    [ -n "$J" ] || J=$(job_named adopt) # the reply may not have left
    [ -n "$J" ] || { echo "no job named adopt"; ctl list; return 1; }
    wait_done "$J" 180 || return 1
    _n=$(slurm_jobs_named "$J")
    [ "$_n" -eq 1 ] || { echo "$_n Slurm jobs named dt-$J.*:"; squeue -t all; return 1; }
    completed_with "$J" "$REF" || return 1
    events_have "slurm_adopted .*was submitted before dtcoordd stopped, but not recorded" \
        "adoption"
}
only adopt && check "dtcoordd killed between Slurm's answer and the database: one Slurm job, adopted" \
    t_adopt

t_scontrol_requeue() {
    job_spec outside >"$TMPD/outside.spec"
    run_until "$TMPD/outside.spec" 40 || return 1
    scontrol requeue "$SID" || return 1
    wait_done "$J" 240 || return 1
    completed_with "$J" "$REF" || return 1
    # the workers may die of Slurm's SIGTERM before dt sees the new run:
    # either way one requeue, noticed or joined, and a resume
    events_have ' requeued ' "requeue" || return 1
    events_have 'generation_started.*resume_step=[1-9]' "resume from a checkpoint" || return 1
    scontrol show job "$SID" | grep -q "Restarts=1 " ||
        { echo "slurm job $SID:"; scontrol show job "$SID" | sed 's/^/  | /'; return 1; }
}
only scontrol_requeue && check "scontrol requeue (Slurm's, not dt's): one requeue, resumed, same checksum" \
    t_scontrol_requeue

t_preempt() {
    job_spec victim >"$TMPD/victim.spec"
    run_until "$TMPD/victim.spec" 30 || return 1
    # every CPU of every node, in the partition that preempts "debug"
    _u=$(sbatch --parsable -p urgent -N 3 --ntasks-per-node=4 -o "$TMPD/urgent.out" \
        --wrap 'sleep 3') || return 1
    wait_done "$J" 240 || return 1
    completed_with "$J" "$REF" || return 1
    slurm_final "$_u" COMPLETED || { echo "the preempting job:"; scontrol show job "$_u"; return 1; }
    events_have preempt_requested "stop for the signal" &&
        events_have ' requeued ' "requeue" || return 1
    run_rc 0 ctl show "$J" --json || return 1
    out_has '"restarts": 0' || return 1
}
only preempt && check "preempted by a higher-priority job: USR2, checkpoint, requeue, same checksum" \
    t_preempt

# A node set DOWN under the job (what slurmctld does to a node that stops
# answering, without waiting SlurmdTimeout): the job keeps its other nodes
# (--no-kill), dt loses that node's agent and requeues without it.
t_node_down() {
    job_spec nodedown >"$TMPD/nodedown.spec"
    run_until "$TMPD/nodedown.spec" 30 || return 1
    _victim=$(agents_of "$J" | head -n 1 | cut -d' ' -f2)
    [ -n "$_victim" ] || { echo "no agent of job $J found"; return 1; }
    scontrol update nodename="$_victim" state=down reason="dt test: node failure" || return 1
    wait_done "$J" 240
    _rc=$?
    # ReturnToService=2 may have brought it back already
    scontrol update nodename="$_victim" state=resume 2>/dev/null || :
    [ "$_rc" -eq 0 ] || return 1
    completed_with "$J" "$REF" || return 1
    events_have " requeued " "requeue" || return 1
    _nodes=$(job_field "$SID" NodeList)
    case $_nodes in *"$_victim"*) echo "reran on $_nodes, which has $_victim"; return 1 ;; esac
}
only node_down && check "a node set DOWN under the job: requeued without it, same checksum" \
    t_node_down

# A job of 3 nodes loses one on the 3-node cluster: a requeue without it
# would pend for ever. It fails at once, saying why, and its Slurm job is
# cancelled.
t_no_room() {
    job_spec wide | sed 's/^nodes = .*/nodes = 3/; s/^gpus_per_node = .*/gpus_per_node = 1/;
        s/^ranks = .*/ranks = 3/; s/^tokens = .*/tokens = 384/' >"$TMPD/wide.spec"
    run_until "$TMPD/wide.spec" 5 || return 1
    wait_for 10 agent_count "$J" 3 || { echo "expected 3 agents"; agents_of "$J"; return 1; }
    set -- $(agents_of "$J" | head -n 1)
    _victim=$2
    kill -KILL "$1"
    wait_done "$J" 60 ||
        { echo "slurm job $SID: $(job_field "$SID" JobState) ($(job_field "$SID" Reason))"; return 1; }
    [ "$(state_of "$J")" = failed ] || { echo "job $J is $(state_of "$J")"; return 1; }
    _why="slurm job $SID needs 3 nodes, but partition debug has only 2 usable with $_victim"
    events_have "slurm_no_nodes .*$_why excluded \\(3 nodes in it\\)" "the reason" || return 1
    # dt cancels it; or the batch script ends first (srun's 137 for the
    # killed agent, once the other agents have stopped) and Slurm says
    # FAILED: either way it has ended and is not pending
    wait_for 30 slurm_final "$SID" "CANCELLED|FAILED" || { scontrol show job "$SID"; return 1; }
    sed -n 's/.* slurm_no_nodes *[a-z]* *//p' "$TMPD/ev" | head -n 1
}
only no_room && check "3 nodes needed, one lost on a 3-node cluster: failed at once, not pending for ever" \
    t_no_room

# A real time limit (1 minute, the least Slurm has) and Slurm's own warning
# signal. Slow and timing-dependent (when the warning comes depends on
# slurmctld's timers), so only when asked: DT_SLURM_CHECKS=time_limit.
t_time_limit() {
    job_spec limited "signal_lead = 40s" | sed 's/^time_limit = .*/time_limit = 1m/' \
        >"$TMPD/limited.spec"
    run_until "$TMPD/limited.spec" 1 || return 1
    _t0=$(date +%s)
    wait_done "$J" 600 || return 1
    completed_with "$J" "$REF" || return 1
    events_have preempt_requested "stop for the time-limit signal" || return 1
    events_have ' requeued ' "requeue" || return 1
    ! grep -q TIMEOUT "$TMPD/ev" || { echo "a run reached its time limit"; return 1; }
    echo "completed $(($(date +%s) - _t0)) s after it started:" \
        "$(grep -c preempt_requested "$TMPD/ev") warnings, resumed at steps" \
        "$(sed -n 's/.*generation_started.*resume_step=\([0-9]*\).*/\1/p' "$TMPD/ev" | tr '\n' ' ')"
}
echo " ${DT_SLURM_CHECKS:-} " | grep -q " time_limit " &&
    check "a real 1-minute time limit: Slurm's USR2, checkpoint, requeue until done" t_time_limit

# ---- device = cuda: GPUs asked of Slurm ---------------------------------------

# The cluster declares 2 GPUs per node (dt-cluster --gpus 2: Slurm counts
# them, none is there). A cuda job asks Slurm for a GPU per rank and
# cpus_per_gpu cores each; Slurm gives them; the agents find no GPU
# (dtengine devices: no driver) and are refused saying so; the job fails
# without a worker started, and its Slurm job ends.
t_cuda() {
    if [ -x "$SIM" ]; then
        # an attention whose head dimension the CUDA kernels take (64)
        job_spec gpus "device = cuda" "cpus_per_gpu = 2" "kind = attn" "dim = 256" \
            "tokens = 2048" | sed '/^gpu = cpu$/d; /^kind = train$/d; /^dim = 64$/d;
            /^tokens = 256$/d' >"$TMPD/gpus.spec"
    else
        job_spec gpus "device = cuda" "cpus_per_gpu = 2" "max_restarts = 1" |
            sed '/^gpu = cpu$/d' >"$TMPD/gpus.spec"
    fi
    J=$(submit "$TMPD/gpus.spec")
    [ -n "$J" ] || { echo "submit failed"; return 1; }
    wait_for 30 eval '[ -n "$(slurm_id_of "$J")" ]' || { echo "no Slurm job"; return 1; }
    SID=$(slurm_id_of "$J")
    scontrol show job "$SID" >"$TMPD/sjob"
    grep -q "TresPerNode=gres:gpu:2" "$TMPD/sjob" && grep -q "CpusPerTres=gres:gpu:2" "$TMPD/sjob" ||
        { echo "Slurm job $SID:"; cat "$TMPD/sjob"; return 1; }
    wait_done "$J" 180 || return 1
    if [ -x "$SIM" ]; then
        # on the GPUs Slurm gave each node, as the direct run computes
        mpirun_np 4 "$SIM" attn --spec "$TMPD/gpus.spec" --out-dir "$TMPD/gpus-direct" \
            >"$TMPD/gpus-direct.log" 2>&1 || { cat "$TMPD/gpus-direct.log"; return 1; }
        _sg=$(sed -n 's/^output: .* sha256=\([0-9a-f]*\)$/\1/p' "$TMPD/gpus-direct.log")
        completed_with "$J" "$_sg" || return 1
        grep -q "device=cuda/bf16" "$COORD_STATE/jobs/$J/logs/rank-0.log" ||
            { echo "rank 0 did not run on a (simulated) GPU"; return 1; }
        # each agent found the 2 GPUs Slurm gave its node (its log, in the
        # batch job's output)
        [ "$(grep -c "slots=2 gpus=2 " "$COORD_STATE/jobs/$J/dt-$J.out")" -ge 2 ] ||
            { echo "the agents did not register 2 GPUs each:"; grep "gpus=" \
                "$COORD_STATE/jobs/$J/dt-$J.out"; return 1; }
        echo "completed on simulated GPUs, checksum $_sg"
        return 0
    fi
    events_have "agent_refused .*device = cuda needs a GPU per slot: 0 GPUs for 2 slots: " \
        "the refusal with its cause" || return 1
    [ "$(state_of "$J")" = failed ] || { echo "job $J is $(state_of "$J")"; return 1; }
    ! grep -q "worker_exit\|generation_started" "$TMPD/ev" ||
        { echo "a worker was started"; return 1; }
    grep -m 1 agent_refused "$TMPD/ev" | sed 's/^ *//'
}
only cuda && check "device = cuda: GPUs and cores per GPU asked of Slurm; on simulated GPUs the job completes as mpirun's (without them: refused, no worker)" t_cuda

# attn and prefill jobs through Slurm: each completes, its outputs in the job
# directory are named by dtctl show, and its checksum is that of `mpirun
# -np 4 dtengine KIND --spec` on the same spec (the manifest's SHA-256;
# the last logits' digest)
t_kinds() {
    for _k in attn prefill; do
        {
            echo "kind = $_k"
            echo "name = $_k"
            echo "tokens = 1024"
            echo "seed = 5"
            echo "ranks = 4"
            echo "gpu = cpu"
            echo "nodes = 2"
            echo "gpus_per_node = 2"
            echo "time_limit = 30m"
        } >"$TMPD/$_k.spec"
    done
    _ja=$(submit "$TMPD/attn.spec")
    _jp=$(submit "$TMPD/prefill.spec")
    [ -n "$_ja" ] && [ -n "$_jp" ] || { echo "submit failed"; return 1; }
    mpirun_np 4 "$DTENGINE" attn --spec "$TMPD/attn.spec" --out-dir "$TMPD/attn-direct" \
        >"$TMPD/attn-direct.log" 2>&1 || { cat "$TMPD/attn-direct.log"; return 1; }
    mpirun_np 4 "$DTENGINE" prefill --spec "$TMPD/prefill.spec" >"$TMPD/prefill-direct.log" 2>&1 ||
        { cat "$TMPD/prefill-direct.log"; return 1; }
    _sa=$(sed -n 's/^output: .* sha256=\([0-9a-f]*\)$/\1/p' "$TMPD/attn-direct.log")
    _sp=$(sed -n 's/^result: .* logits_sha256=\([0-9a-f]*\)$/\1/p' "$TMPD/prefill-direct.log")
    wait_done "$_ja" 180 && completed_with "$_ja" "$_sa" || return 1
    wait_done "$_jp" 180 && completed_with "$_jp" "$_sp" || return 1
    run_rc 0 ctl show "$_ja" && out_has "^  outputs   $COORD_STATE/jobs/$_ja/output/attn\.json\$" &&
        run_rc 0 ctl show "$_jp" &&
        out_has "^  outputs   $COORD_STATE/jobs/$_jp/output/logits\.npy\$" || return 1
    SID=$(slurm_id_of "$_jp")
    wait_for 20 slurm_final "$SID" COMPLETED || { scontrol show job "$SID"; return 1; }
    echo "attn $_sa, prefill $_sp"
}
only kinds && check "attn and prefill jobs under Slurm complete as mpirun's, outputs named" t_kinds

# device = cuda train and prefill jobs through Slurm on simulated GPUs:
# each completes with the checksum of the direct mpirun run of the same
# spec on simulated GPUs (train: the parameters' digest; prefill: the last
# logits')
t_cuda_kinds() {
    for _k in train prefill; do
        {
            echo "kind = $_k"
            echo "name = cuda-$_k"
            echo "model = custom"
            echo "dim = 256"
            echo "layers = 2"
            echo "heads = 4"
            echo "kv_heads = 2"
            echo "ffn = 512"
            echo "vocab = 512"
            echo "tokens = 1024"
            echo "seed = 3"
            echo "ranks = 4"
            echo "device = cuda"
            echo "nodes = 2"
            echo "gpus_per_node = 2"
            echo "time_limit = 30m"
            [ "$_k" = train ] && printf 'steps = 4\nckpt_every = 2\n'
        } >"$TMPD/cuda-$_k.spec"
    done
    _jt=$(submit "$TMPD/cuda-train.spec")
    _jp=$(submit "$TMPD/cuda-prefill.spec")
    [ -n "$_jt" ] && [ -n "$_jp" ] || { echo "submit failed"; return 1; }
    mpirun_np 4 env DT_SIM_GPUS=1 "$SIM" train --spec "$TMPD/cuda-train.spec" \
        >"$TMPD/cuda-train-direct.log" 2>&1 || { cat "$TMPD/cuda-train-direct.log"; return 1; }
    mpirun_np 4 env DT_SIM_GPUS=1 "$SIM" prefill --spec "$TMPD/cuda-prefill.spec" \
        >"$TMPD/cuda-prefill-direct.log" 2>&1 || { cat "$TMPD/cuda-prefill-direct.log"; return 1; }
    _ts=$(sed -n 's/^result: .*params_sha256=\([0-9a-f]*\) .*/\1/p' "$TMPD/cuda-train-direct.log")
    _sp=$(sed -n 's/^result: .* logits_sha256=\([0-9a-f]*\)$/\1/p' "$TMPD/cuda-prefill-direct.log")
    wait_done "$_jt" 240 && completed_with "$_jt" "$_ts" || return 1
    wait_done "$_jp" 240 && completed_with "$_jp" "$_sp" || return 1
    for _j in "$_jt" "$_jp"; do
        grep -q "device=cuda/bf16" "$COORD_STATE/jobs/$_j/logs/rank-0.log" ||
            { echo "job $_j: rank 0 did not run on a (simulated) GPU"; return 1; }
    done
    echo "train $_ts, prefill $_sp"
}
# (where the simulated-GPU engine is built: configured with CUDA headers)
[ -x "$SIM" ] && only cuda_kinds && check "device = cuda train and prefill jobs under Slurm on simulated GPUs complete as mpirun's" \
    t_cuda_kinds

# this coordinator's agents and workers only (other tests may run beside)
nothing_of_ours() {
    [ -z "$(agents_of '[0-9]*')" ] &&
        ! pgrep -f "dtengine(-sim)? (train|attn|prefill) .*$COORD_STATE/jobs" >/dev/null 2>&1
}
check "no agents or workers left" wait_for 30 nothing_of_ours
coord_stop
finish
