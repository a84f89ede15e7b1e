#!/bin/sh
# SPDX-License-Identifier: MIT
#
# The GPU path without a GPU: tests/gpu/dtengine-sim is dtengine built
# against the host simulator of the CUDA runtime, NCCL and the kernels
# (tests/gpu/sim: its kernels are the CPU reference computing on the
# bf16/fp16-rounded inputs the real kernels would see, its streams run in
# random legal orders, its NCCL joins the processes of one host over Unix
# sockets). It says so in every device name. Checked:
#   - `devices`: the simulated GPUs with their UUIDs, CUDA_VISIBLE_DEVICES
#     choosing among them by index and by UUID (as Slurm and dtagentd set
#     it), none at all;
#   - `attn --device cuda` on 1 rank and on 4 ranks under mpirun (the real
#     NCCL ring code, one rank per process), dense and dilated, forward and
#     backward, bf16 and fp16: within the dtype's tolerance of the CPU path
#     (`dtengine attn` in fp32 on the unrounded inputs);
#   - `dtctl run --local` of a device = cuda attn job on simulated GPUs:
#     agents register them, one worker per GPU; the outputs equal the direct
#     mpirun run's byte for byte; mid-attention, a worker killed, a worker
#     hung, an agent lost with a spare, the coordinator killed: recovered,
#     the same checksum; an agent lost without a spare: re-planned on 2
#     ranks, the checksum of a direct 2-rank run; a simulated uncorrectable
#     ECC error on one device: that worker exits 7 through the engine's
#     CUDA error path, its node is suspect, the spare takes over, the same
#     checksum; out of device memory: the job fails as deterministic, the
#     event naming the node, the GPU and the cause; CUDA_VISIBLE_DEVICES
#     naming a device the node lacks: agents refused, saying why;
#   - `prefill --device cuda` (the model's layers and head on the device:
#     casts, RMSNorm, RoPE, SwiGLU, linear layers as cuBLASLt, residual
#     adds, the ring) on 1 and 4 ranks: loss and logits within the dtype's
#     tolerance of the CPU path; a checkpoint written on GPUs resumes on
#     CPUs and the other way round; a device = cuda prefill job through
#     agents completes with the direct run's logits, also after a worker
#     is killed mid-run (it resumes at a committed layer);
#   - `dtctl run --local --device cuda`: the built-in job on simulated GPUs,
#     a worker killed, the fault-free checksum;
#   - `train --device cuda` (the whole step on the device: embedding,
#     layers and their backward, the ring's backward, the loss, the
#     gradient over NCCL, its norm, AdamW) on 1 and 4 ranks: every step's
#     loss and the trained parameters within the dtype's tolerance of the
#     CPU path; checkpoints copied off the device during the next step; a
#     GPU resume equal to the uninterrupted run to the bit; checkpoints
#     across devices both ways; a device = cuda train job through agents
#     with the direct run's parameters, also after a worker killed, a
#     worker hung, an agent lost (spare), the coordinator killed and an
#     uncorrectable ECC error; out of device memory fails it, naming the
#     node, the GPU and the cause; the planner's memory for it covers what
#     the engine allocates (the simulated device's peak), within 10 %.
# Skipped where the simulated build does not exist (configured without
# CUDA headers).
. "$(dirname "$0")/lib.sh"
need_mpirun

SIM=$DT_BUILDDIR/tests/gpu/dtengine-sim
DTCTL=$DT_BUILDDIR/cli/dtctl
DTAGENTD=$DT_BUILDDIR/agent/dtagentd
[ -x "$SIM" ] || skip "$SIM is not built (configure found no CUDA toolkit)"
[ -x "$DTAGENTD" ] && [ -x "$DTCTL" ] || die "dtagentd and dtctl are not built"
unset DT_COORDD DT_AGENTD DT_ENGINE DT_SOCKET DT_COORD CUDA_VISIBLE_DEVICES DT_SIM_GPUS

UUID1=GPU-d7510000-0000-0000-0000-000000000001

# ---- devices ---------------------------------------------------------------------
t_devices() {
    run_rc 0 env DT_SIM_GPUS=3 "$SIM" devices --json && out_has '"cuda": true' &&
        out_has '"uuid": "GPU-d7510000-0000-0000-0000-000000000002"' &&
        out_has '"memory_bytes": 85899345920' || return 1
    run_rc 0 env DT_SIM_GPUS=3 CUDA_VISIBLE_DEVICES=2,0 "$SIM" devices &&
        out_has "^0  GPU-d7510000-0000-0000-0000-000000000002  dt simulated GPU" &&
        out_has "^1  GPU-d7510000-0000-0000-0000-000000000000 " || return 1
    run_rc 0 env CUDA_VISIBLE_DEVICES="$UUID1" "$SIM" devices &&
        out_has "^0  $UUID1 " && [ "$(wc -l <"$TMPD/out")" = 1 ] || return 1
    run_rc 0 env DT_SIM_GPUS=0 "$SIM" devices && out_has "^no GPU: cudaGetDeviceCount"
}
check "devices: simulated GPUs, chosen by CUDA_VISIBLE_DEVICES (index, UUID), or none" t_devices

# ---- attn --device cuda against the CPU path --------------------------------------------
# vs R NAME DTYPE TOL ARGS...: dtengine-sim attn --device cuda --dtype DTYPE
# ARGS on R ranks and dtengine attn ARGS (CPU, fp32) on R ranks, both
# --out-dir; every shard within |a - b| <= TOL + TOL |b|
vs() {
    _r=$1 _n=$2 _dt=$3 _tol=$4
    shift 4
    mpirun_np "$_r" "$SIM" attn --device cuda --dtype "$_dt" "$@" --out-dir "$TMPD/$_n.gpu" \
        >"$TMPD/$_n.gpu.log" 2>&1 ||
        { cat "$TMPD/$_n.gpu.log"; return 1; }
    mpirun_np "$_r" "$DTENGINE" attn "$@" --out-dir "$TMPD/$_n.cpu" >"$TMPD/$_n.cpu.log" 2>&1 ||
        { cat "$TMPD/$_n.cpu.log"; return 1; }
    grep -q "device=cuda/" "$TMPD/$_n.gpu.log" || { cat "$TMPD/$_n.gpu.log"; return 1; }
    _worst=0
    for _f in "$TMPD/$_n.cpu"/*.npy; do
        case $_f in */pos.*) cmp "$_f" "$TMPD/$_n.gpu/${_f##*/}" || return 1; continue ;; esac
        "$NPYTOOL" cmp "$TMPD/$_n.gpu/${_f##*/}" "$_f" --atol "$_tol" --rtol "$_tol" \
            >"$TMPD/cmp.out" 2>&1 || { echo "${_f##*/}: $(cat "$TMPD/cmp.out")"; return 1; }
        _e=$(sed -n 's/^max_abs_err=\([^ ]*\) .*/\1/p' "$TMPD/cmp.out")
        _worst=$(awk -v a="$_worst" -v b="$_e" 'BEGIN { print (b + 0 > a + 0) ? b : a }')
    done
    echo "largest |gpu - cpu| $_worst (tolerance $_tol)"
}
check "attn --device cuda, 1 rank, causal, bf16: within 3e-2 of the CPU path" \
    vs 1 one bf16 3e-2 --generate 1024,4,2,64 --seed 3 --causal
check "attn --device cuda, 4 ranks (NCCL between processes), zigzag, bf16, forward and backward" \
    vs 4 ring bf16 3e-2 --generate 2048,4,2,64 --seed 5 --causal --layout zigzag --backward
check "attn --device cuda, 4 ranks, dilated (segments cross ranks), fp16, backward: within 1e-2" \
    vs 4 dil fp16 1e-2 --generate 2048,8,2,128 --seed 7 --causal --layout zigzag \
    --segments 512,2048 --dilations 1,4 --backward

# ---- device = cuda jobs through the agents ------------------------------------------------
cat >"$TMPD/gpu.spec" <<SPEC
kind = attn
model = custom
dim = 256
layers = 1
heads = 4
kv_heads = 2
ffn = 128
vocab = 64
tokens = 8192
seed = 5
ranks = 4
device = cuda
SPEC

RESULT_RE='^result: job=1 state=completed loss=- checksum=[0-9a-f]{64}$'

# local NAME ARGS...: dtctl run --local on simulated GPUs (2 per agent); exit 0,
# a result line; sets SUM
local_run() {
    _lr=$TMPD/local-$1
    shift
    run_rc 0 env DT_ENGINE="$SIM" DT_SIM_GPUS=2 "$DTCTL" run --local "$TMPD/gpu.spec" \
        --state-dir "$_lr" --interval 250ms "$@" || return 1
    out_has "$RESULT_RE" || return 1
    SUM=$(sed -n 's/^result: .* checksum=\([0-9a-f]*\)$/\1/p' "$TMPD/out")
}

mpirun_np 4 env DT_SIM_GPUS=1 "$SIM" attn --spec "$TMPD/gpu.spec" --out-dir "$TMPD/direct" \
    >"$TMPD/direct.log" 2>&1
REF=$(sed -n 's/^output: .* sha256=\([0-9a-f]*\)$/\1/p' "$TMPD/direct.log")

t_local() {
    local_run plain || return 1
    [ -n "$REF" ] && [ "$SUM" = "$REF" ] || { echo "checksum $SUM, direct run '$REF'"; return 1; }
    for _f in "$TMPD/direct"/*; do
        cmp "$_f" "$TMPD/local-plain/jobs/1/output/${_f##*/}" || return 1
    done
    grep -q "gpus=2 " "$TMPD/local-plain/agents/local1.log" ||
        { echo "the agent did not register 2 GPUs"; return 1; }
    # one GPU each: the workers' logs name the device they ran on
    grep -l "device=cuda/bf16" "$TMPD/local-plain/jobs/1/logs"/rank-0.log >/dev/null ||
        { echo "rank 0 did not run on the device"; return 1; }
    echo "checksum $SUM"
}
check "run --local, device = cuda on simulated GPUs: completes as the direct run, byte for byte" \
    t_local

t_worker() {
    local_run worker --inject-failure worker@0 && out_has "^injected failure at step 0: " &&
        out_has "restarts +[1-9]" || return 1
    [ "$SUM" = "$REF" ] || { echo "checksum $SUM, fault-free $REF"; return 1; }
}
check "run --local, device = cuda: a worker killed during the attention, recovered, same checksum" \
    t_worker

t_agent() {
    local_run agent --inject-failure agent@0 --spares 1 && out_has "spare agent local3" &&
        out_has "restarts +[1-9]" || return 1
    [ "$SUM" = "$REF" ] || { echo "checksum $SUM, fault-free $REF"; return 1; }
}
check "run --local, device = cuda: an agent lost with a spare, recovered on its GPUs, same checksum" \
    t_agent

t_hang() {
    local_run hang --inject-failure hang@0 && out_has "SIGSTOP to the worker" &&
        out_has "restarts +[1-9]" || return 1
    [ "$SUM" = "$REF" ] || { echo "checksum $SUM, fault-free $REF"; return 1; }
}
check "run --local, device = cuda: a worker hung (no heartbeat), recovered, same checksum" t_hang

t_coordinator() {
    local_run coord --inject-failure coordinator@0 && out_has "dtcoordd started again" || return 1
    [ "$SUM" = "$REF" ] || { echo "checksum $SUM, fault-free $REF"; return 1; }
}
check "run --local, device = cuda: the coordinator killed and restarted, same checksum" \
    t_coordinator

# without a spare the job is re-planned on the 2 ranks left: it computes
# what a direct run on 2 ranks does
t_nospare() {
    mpirun_np 2 env DT_SIM_GPUS=1 "$SIM" attn --spec "$TMPD/gpu.spec" --out-dir "$TMPD/direct2" \
        >"$TMPD/direct2.log" 2>&1 || { cat "$TMPD/direct2.log"; return 1; }
    _r2=$(sed -n 's/^output: .* sha256=\([0-9a-f]*\)$/\1/p' "$TMPD/direct2.log")
    local_run nospare --inject-failure agent@0 && out_has "restarts +[1-9]" || return 1
    sqlite3 "$TMPD/local-nospare/dt.db" "SELECT detail FROM events WHERE kind = 'replanned'" |
        grep -q "ranks 4 -> 2" || { echo "not re-planned on 2 ranks"; return 1; }
    [ "$SUM" = "$_r2" ] || { echo "checksum $SUM, direct 2-rank run $_r2"; return 1; }
}
check "run --local, device = cuda: an agent lost without a spare, re-planned on 2 GPUs, as a 2-rank run" \
    t_nospare

# A simulated uncorrectable ECC error on rank 3's device (once): the
# engine's CUDA error handling makes that worker exit 7, its node is
# suspect, the spare's GPUs take its ranks, and the result is unchanged.
t_device_fault() {
    DT_SIM_DEVICE_FAULT="3:$TMPD/ecc.mark" local_run ecc --spares 1 || return 1
    [ -f "$TMPD/ecc.mark" ] || { echo "the fault was not injected"; return 1; }
    [ "$SUM" = "$REF" ] || { echo "checksum $SUM, fault-free $REF"; return 1; }
    _db=$TMPD/local-ecc/dt.db
    sqlite3 "$_db" "SELECT detail FROM events WHERE kind = 'worker_failed'" |
        grep -q "exited with status 7 .*cudaErrorECCUncorrectable" ||
        { sqlite3 "$_db" "SELECT kind, detail FROM events"; return 1; }
    _bad=$(sqlite3 "$_db" "SELECT detail FROM events WHERE kind = 'device_fault'" |
        sed -n 's/.* on \([a-z0-9]*\): its GPU failed.*/\1/p' | head -n 1)
    _last=$(sqlite3 "$_db" "SELECT MAX(gen) FROM ranks")
    _nodes=$(sqlite3 "$_db" "SELECT DISTINCT a.node FROM ranks r JOIN agents a ON a.id = r.agent_id
        WHERE r.gen = $_last ORDER BY a.node" | tr '\n' ' ')
    [ -n "$_bad" ] || { echo "no device_fault event"; return 1; }
    case " $_nodes" in
    *" $_bad "*) echo "generation $_last ran on the suspect $_bad: $_nodes"; return 1 ;;
    esac
    echo "$_bad suspect; generation $_last on $_nodes"
}
check "run --local, device = cuda: an uncorrectable ECC error (exit 7): node suspect, spare, same checksum" \
    t_device_fault

# Out of device memory (a simulated GPU of 1 MB): every generation fails
# alike at its start, so the job fails as deterministic; the event names
# the node, the GPU and CUDA's words.
t_oom() {
    run_rc 7 env DT_ENGINE="$SIM" DT_SIM_GPUS=2 DT_SIM_GPU_MEMORY=1000000 "$DTCTL" run --local \
        "$TMPD/gpu.spec" --state-dir "$TMPD/local-oom" --interval 250ms || return 1
    out_has "^job 1 [a-z-]+ failed\$" || return 1
    sqlite3 "$TMPD/local-oom/dt.db" "SELECT detail FROM events WHERE kind = 'deterministic_failure'" |
        grep -E "on local[12] \(GPU-d7510000-[0-9a-f-]+\) exited with status 1 .*cudaMalloc.*out of memory" ||
        { sqlite3 "$TMPD/local-oom/dt.db" "SELECT kind, detail FROM events"; return 1; }
}
check "run --local, device = cuda: out of device memory fails the job, naming node, GPU and cause" \
    t_oom

# The agents' CUDA_VISIBLE_DEVICES names a device the node does not have:
# they find no GPU, and the coordinator refuses them, saying why; nothing
# starts.
t_missing_device() {
    run_rc 1 env DT_ENGINE="$SIM" DT_SIM_GPUS=2 CUDA_VISIBLE_DEVICES=7 "$DTCTL" run --local \
        "$TMPD/gpu.spec" --state-dir "$TMPD/local-cvd" --interval 250ms || return 1
    sqlite3 "$TMPD/local-cvd/dt.db" "SELECT detail FROM events WHERE kind = 'agent_refused'" |
        grep -m 1 "0 GPUs for 2 slots: cudaGetDeviceCount: no CUDA-capable device" ||
        { sqlite3 "$TMPD/local-cvd/dt.db" "SELECT kind, detail FROM events"; return 1; }
    [ -z "$(sqlite3 "$TMPD/local-cvd/dt.db" "SELECT 1 FROM events WHERE kind = 'generation_started'")" ] ||
        { echo "a generation started"; return 1; }
}
check "run --local, device = cuda: CUDA_VISIBLE_DEVICES naming a missing device: agents refused, why" \
    t_missing_device

# ---- prefill --device cuda ----------------------------------------------------------------
# a 3-layer model whose heads the CUDA kernels take (D = 64) over 1024
# tokens of the recall task, the last 8 logits
# on cpu|gpu R LOG COMMAND ARGS...: dtengine COMMAND ARGS on R ranks, on the
# CPU or on simulated GPUs (--device cuda), its output in LOG
on() {
    _dev=$1 _r=$2 _log=$3 _cmd=$4
    shift 4
    if [ "$_dev" = gpu ]; then
        set -- env DT_SIM_GPUS=1 "$SIM" "$_cmd" --device cuda "$@"
    else
        set -- "$DTENGINE" "$_cmd" "$@"
    fi
    mpirun_np "$_r" "$@" >"$_log" 2>&1 || { cat "$_log"; return 1; }
}
pf() { # cpu|gpu R DIR ARGS...: prefill on R ranks, logits to DIR/logits.npy, its log DIR.log
    _pd=$3
    _pa="$1 $2"
    shift 3
    # shellcheck disable=SC2086
    on $_pa "$_pd.log" prefill "$@" --model custom --dim 256 --layers 3 --heads 4 --kv-heads 2 \
        --ffn 512 --vocab 512 --data recall --seq-len 1024 --seed 5 --last 8 --out-dir "$_pd"
}
pf_loss() { sed -n 's/^prefill: tokens=.* loss \([-0-9.e+]*\)$/\1/p' "$1.log"; }

# pf_vs NAME R DTYPE TOL: the GPU prefill against the CPU one: loss within
# TOL (relative), logits within TOL absolute and relative
pf_vs() {
    pf cpu "$2" "$TMPD/pf-$1.cpu" || return 1
    pf gpu "$2" "$TMPD/pf-$1.gpu" --dtype "$3" || return 1
    grep -q "device=cuda/$3" "$TMPD/pf-$1.gpu.log" || { cat "$TMPD/pf-$1.gpu.log"; return 1; }
    _lc=$(pf_loss "$TMPD/pf-$1.cpu") _lg=$(pf_loss "$TMPD/pf-$1.gpu")
    awk -v a="$_lg" -v b="$_lc" -v t="$4" \
        'BEGIN { d = (a - b) / b; if (d < 0) d = -d; exit !(a != "" && d <= t) }' ||
        { echo "loss $_lg on the GPU, $_lc on the CPU"; return 1; }
    "$NPYTOOL" cmp "$TMPD/pf-$1.gpu/logits.npy" "$TMPD/pf-$1.cpu/logits.npy" --atol "$4" \
        --rtol "$4" || return 1
    echo "loss $_lg (GPU) vs $_lc (CPU)"
}
check "prefill --device cuda, 1 rank, bf16: loss and logits within 2e-2 of the CPU path" \
    pf_vs one 1 bf16 2e-2
check "prefill --device cuda, 4 ranks (NCCL between processes), fp16: within 5e-3 of the CPU path" \
    pf_vs four 4 fp16 5e-3

# a checkpoint written on the GPU resumes on the CPU, and the other way round
t_pf_cross() {
    pf gpu 4 "$TMPD/x1" --ckpt-dir "$TMPD/x1.ck" --stop-after-layer 2 ||
        [ -d "$TMPD/x1.ck/step-00000002" ] || return 1
    pf cpu 4 "$TMPD/x1" --ckpt-dir "$TMPD/x1.ck" --resume || return 1
    grep -q "after layer 2 of 3" "$TMPD/x1.log" || { cat "$TMPD/x1.log"; return 1; }
    pf cpu 4 "$TMPD/x2" --ckpt-dir "$TMPD/x2.ck" --stop-after-layer 2 ||
        [ -d "$TMPD/x2.ck/step-00000002" ] || return 1
    pf gpu 4 "$TMPD/x2" --ckpt-dir "$TMPD/x2.ck" --resume || return 1
    grep -q "after layer 2 of 3" "$TMPD/x2.log" || { cat "$TMPD/x2.log"; return 1; }
    for _x in x1 x2; do
        "$NPYTOOL" cmp "$TMPD/$_x/logits.npy" "$TMPD/pf-four.cpu/logits.npy" --atol 2e-2 \
            --rtol 2e-2 || return 1
    done
}
check "prefill: a GPU checkpoint resumes on the CPU, a CPU one on the GPU (logits within 2e-2)" \
    t_pf_cross

cat >"$TMPD/pf.spec" <<SPEC
kind = prefill
model = custom
dim = 256
layers = 3
heads = 4
kv_heads = 2
ffn = 512
vocab = 512
tokens = 4096
seed = 3
ranks = 4
device = cuda
SPEC
mpirun_np 4 env DT_SIM_GPUS=1 "$SIM" prefill --spec "$TMPD/pf.spec" >"$TMPD/pf-direct.log" 2>&1
PF_REF=$(sed -n 's/^result: .* logits_sha256=\([0-9a-f]*\)$/\1/p' "$TMPD/pf-direct.log")

# job_local SPEC REF DIR ARGS...: the job of SPEC through agents on
# simulated GPUs (2 per agent), state in DIR; completes with checksum REF
# (the direct run's)
job_local() {
    _js=$1 _jr=$2 _jd=$3
    shift 3
    run_rc 0 env DT_ENGINE="$SIM" DT_SIM_GPUS=2 "$DTCTL" run --local "$_js" \
        --state-dir "$_jd" --interval 250ms "$@" || return 1
    [ -n "$_jr" ] && out_has "^result: job=1 state=completed loss=[0-9.]+ checksum=$_jr\$" ||
        { echo "direct run: '$_jr'"; return 1; }
}
# pf_local NAME ARGS...: the prefill job, with the direct run's digest
pf_local() {
    _pl=$TMPD/pfl-$1
    shift
    job_local "$TMPD/pf.spec" "$PF_REF" "$_pl" "$@"
}
check "run --local, prefill with device = cuda: completes with the direct run's logits" \
    pf_local plain
# (a GPU layer's checkpoint is written while the next layer runs and
# committed once the agents have read it back, so when the kill lands after
# layer 2 the last committed layer is usually 1 or 2, but may still be
# none: the second generation must resume at the last layer committed
# before it started, whichever that was)
t_pf_worker() {
    pf_local worker --inject-failure worker@2 && out_has "restarts +[1-9]" || return 1
    sqlite3 "$TMPD/pfl-worker/dt.db" "SELECT kind, detail FROM events ORDER BY id" | awk -F'|' '
        BEGIN { last = 0 }
        $1 == "checkpoint_committed" && !done { sub(/^step=/, "", $2); last = $2 + 0 }
        $1 == "generation_started" && $2 ~ /^gen=2 / && !done {
            done = 1; want = "resume_step=" last
            if ($2 !~ (" " want "$")) { print "gen 2: " $2 ", expected " want; bad = 1 }
            else print "gen 2 resumed at the last committed layer: " want }
        END { if (!done) print "no second generation"; exit (!done || bad) }'
}
check "run --local, prefill on GPUs: a worker killed after layer 2 resumes at a committed layer, same logits" \
    t_pf_worker

# ---- dtctl run --local --device cuda: the built-in job on simulated GPUs ------------------
t_builtin() {
    for _b in plain worker; do
        _x=
        [ "$_b" = worker ] && _x="--inject-failure worker@10"
        # shellcheck disable=SC2086
        run_rc 0 env DT_ENGINE="$SIM" DT_SIM_GPUS=2 "$DTCTL" run --local --device cuda \
            --steps 20 --state-dir "$TMPD/builtin-$_b" --interval 250ms $_x || return 1
        out_has "$RESULT_RE_TRAIN" || return 1
        eval "_sum_$_b=\$(sed -n 's/^result: .* checksum=\([0-9a-f]*\)\$/\1/p' \"\$TMPD/out\")"
    done
    out_has "restarts +[1-9]" || return 1
    grep -q "device=cuda/bf16" "$TMPD/builtin-plain/jobs/1/logs/rank-0.log" || return 1
    [ "$_sum_plain" = "$_sum_worker" ] ||
        { echo "checksum $_sum_worker after the fault, $_sum_plain without"; return 1; }
    echo "checksum $_sum_plain"
}
RESULT_RE_TRAIN='^result: job=1 state=completed loss=[0-9.]+ checksum=[0-9a-f]{64}$'
check "run --local --device cuda: the built-in job on simulated GPUs, a worker killed: the same checksum" \
    t_builtin

# ---- train --device cuda --------------------------------------------------------------------
# the same model as the prefill's, 2 layers, 1024 tokens of the recall task
# (TR_T others), 6 steps
tr() { # cpu|gpu R NAME ARGS...: train on R ranks; its log NAME.log, parameters NAME.npy
    _td=$TMPD/$3
    _ta="$1 $2"
    shift 3
    # shellcheck disable=SC2086
    on $_ta "$_td.log" train "$@" --model custom --dim 256 --layers 2 --heads 4 --kv-heads 2 \
        --ffn 512 --vocab 512 --data recall --seq-len "${TR_T:-1024}" --seed 3 --steps 6 \
        --params-out "$_td.npy"
}
# a run's parameters digest, and its largest simulated device or host
# memory peak over the ranks (DT_SIM_MEMSTAT), from its log
result_sha() { sed -n 's/^result: .*params_sha256=\([0-9a-f]*\) .*/\1/p' "$1"; }
peak_of() { sed -n "s/^sim: $1 memory peak \([0-9]*\) bytes\$/\1/p" "$2" | sort -n | tail -n 1; }
tr_sum() { result_sha "$TMPD/$1.log"; }

# tr_vs NAME R DTYPE TOL [ARGS...]: every step's loss within TOL (relative)
# of the CPU path's, the trained parameters within TOL (absolute and
# relative)
tr_vs() {
    _tn=$1 _tr=$2 _tt=$3
    shift 3
    _tol=$1
    shift
    tr cpu "$_tr" "tr-$_tn.cpu" "$@" || return 1
    tr gpu "$_tr" "tr-$_tn.gpu" --dtype "$_tt" "$@" || return 1
    set -- "$_tn" "$_tr" "$_tt" "$_tol"
    grep -q "device=cuda/$3" "$TMPD/tr-$1.gpu.log" || { cat "$TMPD/tr-$1.gpu.log"; return 1; }
    grep '^step ' "$TMPD/tr-$1.cpu.log" >"$TMPD/tr-$1.cpu.steps"
    grep '^step ' "$TMPD/tr-$1.gpu.log" >"$TMPD/tr-$1.gpu.steps"
    [ "$(wc -l <"$TMPD/tr-$1.gpu.steps")" = 6 ] || { cat "$TMPD/tr-$1.gpu.log"; return 1; }
    # the two step lines side by side (a tab between: fp16's GPU line has
    # its loss scale at the end)
    paste "$TMPD/tr-$1.gpu.steps" "$TMPD/tr-$1.cpu.steps" | awk -F '\t' -v t="$4" '
        { split($1, a, " "); split($2, b, " "); g = a[4]; c = b[4]; d = (g - c) / c
          if (d < 0) d = -d
          if (d > w) w = d; if (d > t) { print "step " a[2] ": loss " g " on the GPU, " c " on the CPU"; bad = 1 } }
        END { printf "largest relative loss difference %.2e (tolerance %s)\n", w, t; exit bad }' ||
        return 1
    "$NPYTOOL" cmp "$TMPD/tr-$1.gpu.npy" "$TMPD/tr-$1.cpu.npy" --atol "$4" --rtol "$4"
}
check "train --device cuda, 1 rank, bf16: losses and parameters within 1e-2 of the CPU path" \
    tr_vs one 1 bf16 1e-2
check "train --device cuda, 4 ranks (gradients summed over NCCL between processes), fp16: within 5e-3" \
    tr_vs four 4 fp16 5e-3
check "train --device cuda, 2 ranks, dilated attention (segments cross ranks), bf16: within 1e-2" \
    tr_vs dil 2 bf16 1e-2 --segments 256,1024 --dilations 1,4
# 3072 tokens on one GPU: its MLP in three 1024-token tiles (DT_GPU_MLP_ROWS)
t_tr_tiled() {
    TR_T=3072
    tr_vs tiled 1 bf16 1e-2
    _rt=$?
    TR_T=
    return $_rt
}
check "train --device cuda, 1 rank, T = 3072 (every token-local part in 1024-token tiles), bf16: within 1e-2" \
    t_tr_tiled

# checkpoints: copied off the device while the next step runs; a resume on
# the GPU repeats the uninterrupted run to the bit; a GPU checkpoint resumes
# on the CPU, a CPU one on the GPU
t_tr_ckpt() {
    tr gpu 2 tr-ck --ckpt-dir "$TMPD/tr-ck.d" --ckpt-every 2 || return 1
    grep -q "^checkpoint step 2 bytes 17316864 seconds [0-9.]* copy_stall [0-9.]*$" \
        "$TMPD/tr-ck.log" || { cat "$TMPD/tr-ck.log"; return 1; }
    [ -f "$TMPD/tr-ck.d/step-00000004/manifest.json" ] || return 1
    tr gpu 2 tr-re --ckpt-dir "$TMPD/tr-re.d" --ckpt-every 2 \
        --resume-from "$TMPD/tr-ck.d/step-00000002" || return 1
    grep -q "start=2 device=cuda/bf16" "$TMPD/tr-re.log" || return 1
    [ "$(tr_sum tr-re)" = "$(tr_sum tr-ck)" ] ||
        { echo "resumed on the GPU: $(tr_sum tr-re), uninterrupted: $(tr_sum tr-ck)"; return 1; }
    tr cpu 2 tr-gc --ckpt-dir "$TMPD/tr-gc.d" --ckpt-every 2 \
        --resume-from "$TMPD/tr-ck.d/step-00000004" || return 1
    grep -q "start=4 device=cpu" "$TMPD/tr-gc.log" || return 1
    tr cpu 2 tr-c --ckpt-dir "$TMPD/tr-c.d" --ckpt-every 2 || return 1
    tr gpu 2 tr-cg --ckpt-dir "$TMPD/tr-cg.d" --ckpt-every 2 \
        --resume-from "$TMPD/tr-c.d/step-00000002" || return 1
    for _x in tr-gc tr-cg; do
        "$NPYTOOL" cmp "$TMPD/$_x.npy" "$TMPD/tr-c.npy" --atol 1e-2 --rtol 1e-2 || return 1
    done
}
check "train --device cuda: checkpoints copied during the next step; GPU resume bit-identical; GPU <-> CPU" \
    t_tr_ckpt

# the planner's memory for a cuda train job (dtctl plan: its total less the
# cluster's fixed allowance for the CUDA context and libraries) against what
# the engine allocates on the simulated device (its peak): never below it,
# at most 10 % above; and its host memory per rank against the simulator's
# page-locked peak, the same way
t_tr_memory() { # [none|layer [SHARD [OFFLOAD [CKPT_DTYPE]]]]: the settings of both
    _rc=${1:-none}
    _sh=${2:-none}
    _of=${3:-none}
    _ck=${4:-fp32}
    DTCTL_PLAN="$DTCTL plan --tokens 4096 --kind train --model custom --dim 256 --layers 2"
    DTCTL_PLAN="$DTCTL_PLAN --heads 4 --kv-heads 2 --ffn 512 --vocab 512 --tied no"
    DTCTL_PLAN="$DTCTL_PLAN --device cuda --causal --json --recompute $_rc --shard $_sh"
    DTCTL_PLAN="$DTCTL_PLAN --offload $_of --ckpt-dtype $_ck"
    for _r in 1 2; do
        # shellcheck disable=SC2086
        run_rc 0 $DTCTL_PLAN --ranks "$_r" || return 1
        _total=$(sed -n 's/.*"memory_per_rank_bytes": *\([0-9]*\).*/\1/p' "$TMPD/out")
        _fixed=$(sed -n 's/.*"fixed": *\([0-9]*\).*/\1/p' "$TMPD/out" | head -n 1)
        mpirun_np "$_r" env DT_SIM_GPUS=1 DT_SIM_MEMSTAT=1 "$SIM" train --device cuda \
            --model custom --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --vocab 512 \
            --seq-len 4096 --steps 1 --recompute "$_rc" --shard "$_sh" --offload "$_of" \
            --ckpt-dtype "$_ck" >"$TMPD/mem.log" 2>&1 ||
            { cat "$TMPD/mem.log"; return 1; }
        _peak=$(peak_of device "$TMPD/mem.log")
        _host=$(sed -n 's/.*"host_memory_per_rank_bytes": *\([0-9]*\).*/\1/p' "$TMPD/out")
        _hpeak=$(peak_of host "$TMPD/mem.log")
        awk -v p="$_total" -v f="$_fixed" -v e="$_peak" -v r="$_r" -v h="$_host" \
            -v hp="$_hpeak" 'BEGIN {
            q = (p - f) / e; qh = hp > 0 ? h / hp : 0
            printf "R=%d: planned %d bytes, allocated %d (x%.3f); host planned %d, page-locked %d (x%.3f)\n",
                r, p - f, e, q, h, hp, qh
            exit !(e > 0 && q >= 1 && q <= 1.1 && qh >= 1 && qh <= 1.1) }' || return 1
    done
}
check "plan: a cuda train job's memory per GPU covers the engine's, within 10 % (1 and 2 ranks)" \
    t_tr_memory
check "plan, recompute = layer: a cuda train job's memory covers the engine's, within 10 %" \
    t_tr_memory layer
check "plan, shard = gradients: a cuda train job's memory covers the engine's, within 10 %" \
    t_tr_memory none gradients
check "plan, offload = optimizer, shard = parameters: the GPU's memory covers the engine's, within 10 %" \
    t_tr_memory none parameters optimizer
check "plan, recompute = layer, offload = activations,optimizer, ckpt_dtype = bf16: device and host within 10 %" \
    t_tr_memory layer optimizer activations,optimizer bf16

# offload = activations and ckpt_dtype = bf16 (recompute = layer) on
# simulated GPUs: the kept layer inputs go to page-locked host memory
# through two device slots and come back a layer ahead of their backward
# (copies on their own stream, events between, under the simulator's
# random interleaving): in fp32 the same parameters to the bit as keeping
# them on the device, in bf16 the same bits offloaded or not, and within
# 1e-2 of fp32; less device memory each; refused without recompute
t_tr_offload_act() {
    for _r in 1 2; do
        for _m in "none fp32" "activations fp32" "none bf16" "activations bf16"; do
            set -- $_m
            mpirun_np "$_r" env DT_SIM_GPUS=1 DT_SIM_MEMSTAT=1 "$SIM" train --device cuda \
                --model custom --dim 256 --layers 4 --heads 4 --kv-heads 2 --ffn 512 \
                --vocab 512 --seq-len 2048 --steps 2 --recompute layer --offload "$1" \
                --ckpt-dtype "$2" >"$TMPD/oa-$1-$2.log" 2>&1 ||
                { cat "$TMPD/oa-$1-$2.log"; return 1; }
        done
        for _d in fp32 bf16; do
            _a=$(result_sha "$TMPD/oa-none-$_d.log")
            _b=$(result_sha "$TMPD/oa-activations-$_d.log")
            _pa=$(peak_of device "$TMPD/oa-none-$_d.log")
            _pb=$(peak_of device "$TMPD/oa-activations-$_d.log")
            echo "R=$_r $_d: offloaded $_b (on the device $_a), device peak $_pb (on the device $_pa)"
            [ -n "$_a" ] && [ "$_a" = "$_b" ] && [ "$_pb" -lt "$_pa" ] || return 1
        done
        grep -q ' offload=activations ckpt_dtype=bf16' "$TMPD/oa-activations-bf16.log" || return 1
        _l32=$(sed -n 's/^result: .* loss=\([0-9.]*\).*/\1/p' "$TMPD/oa-none-fp32.log")
        _l16=$(sed -n 's/^result: .* loss=\([0-9.]*\).*/\1/p' "$TMPD/oa-none-bf16.log")
        awk -v a="$_l32" -v b="$_l16" 'BEGIN { d = (a - b) / a; if (d < 0) d = -d
            printf "loss fp32 %s, bf16 inputs %s (relative %.1e)\n", a, b, d; exit !(a > 0 && d <= 1e-2) }' ||
            return 1
    done
    run_rc 2 "$SIM" train --device cuda --model custom --dim 256 --layers 2 --heads 4 \
        --kv-heads 2 --ffn 512 --vocab 512 --seq-len 1024 --steps 1 --offload activations
    grep -q 'offload = activations concerns the layer inputs recompute = layer keeps' \
        "$TMPD/out" || { cat "$TMPD/out"; return 1; }
}
check "train --device cuda --offload activations / --ckpt-dtype bf16: fp32 bit-identical, bf16 close, less device memory" \
    t_tr_offload_act

# offload = optimizer on simulated GPUs: the fp32 parameters and AdamW
# moments stay in host memory, AdamW runs on the host with the GPU
# kernel's arithmetic (kernels/adamw.h): the same parameters to the bit as
# the same job without offload, unsharded on 1 GPU and sharded on 2, in
# less device memory (sharded gradients stream to the host as each unit is
# done, and with 2 sequences a step the second is added there; clipped,
# the norm is the host's); the planner's host memory grows by the
# gradient's slice; a checkpoint written with offload resumes without it,
# to the bit
t_tr_offload() {
    for _rs in "1 gradients 2" "2 parameters 2" "1 none 1" "2 optimizer 1"; do
        set -- $_rs
        for _of in none optimizer; do
            rm -rf "$TMPD/gof-$_of.d"
            mpirun_np "$1" env DT_SIM_GPUS=1 DT_SIM_MEMSTAT=1 "$SIM" train --device cuda \
                --model custom --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 \
                --vocab 512 --seq-len 2048 --steps 4 --shard "$2" --offload "$_of" \
                --batch "$3" --clip 0.5 --ckpt-dir "$TMPD/gof-$_of.d" --ckpt-every 2 \
                >"$TMPD/gof-$_of.log" 2>&1 || { cat "$TMPD/gof-$_of.log"; return 1; }
        done
        grep -q ' offload=optimizer' "$TMPD/gof-optimizer.log" ||
            { grep -i offload "$TMPD/gof-optimizer.log"; return 1; }
        _a=$(result_sha "$TMPD/gof-none.log")
        _b=$(result_sha "$TMPD/gof-optimizer.log")
        _pa=$(peak_of device "$TMPD/gof-none.log")
        _pb=$(peak_of device "$TMPD/gof-optimizer.log")
        echo "R=$1 shard=$2: $_b (no offload $_a), device peak $_pb bytes (no offload $_pa)"
        [ -n "$_a" ] && [ "$_a" = "$_b" ] && [ "$_pb" -lt "$_pa" ] || return 1
    done
    # the planner: less on the device, more on the host
    for _of in none optimizer; do
        run_rc 0 "$DTCTL" plan --tokens 2048 --kind train --model custom --dim 256 --layers 2 \
            --heads 4 --kv-heads 2 --ffn 512 --vocab 512 --device cuda --ranks 2 \
            --shard optimizer --offload "$_of" --json || return 1
        sed -n 's/.*"memory_per_rank_bytes": *\([0-9]*\).*/\1/p' "$TMPD/out" >"$TMPD/gof-dev-$_of"
        sed -n 's/.*"host_memory_per_rank_bytes": *\([0-9]*\).*/\1/p' "$TMPD/out" \
            >"$TMPD/gof-host-$_of"
    done
    [ "$(cat "$TMPD/gof-dev-optimizer")" -lt "$(cat "$TMPD/gof-dev-none")" ] &&
        [ "$(cat "$TMPD/gof-host-optimizer")" -gt "$(cat "$TMPD/gof-host-none")" ] ||
        { echo "planned device/host: none $(cat "$TMPD/gof-dev-none")/$(cat "$TMPD/gof-host-none")," \
            "optimizer $(cat "$TMPD/gof-dev-optimizer")/$(cat "$TMPD/gof-host-optimizer")"; return 1; }
    # the sharded, offloaded checkpoint of step 2 resumed on 2 GPUs without offload
    rm -rf "$TMPD/gof-back.d"
    mpirun_np 2 env DT_SIM_GPUS=1 "$SIM" train --device cuda --model custom --dim 256 \
        --layers 2 --heads 4 --kv-heads 2 --ffn 512 --vocab 512 --seq-len 2048 --steps 4 \
        --shard optimizer --clip 0.5 --ckpt-dir "$TMPD/gof-back.d" --ckpt-every 2 \
        --resume-from "$TMPD/gof-optimizer.d/step-00000002" >"$TMPD/gof-back.log" 2>&1 ||
        { cat "$TMPD/gof-back.log"; return 1; }
    grep -q "params_sha256=$_a" "$TMPD/gof-back.log" ||
        { echo "resumed without offload: $(grep result: "$TMPD/gof-back.log")"; return 1; }
}
check "train --device cuda --offload optimizer: bit-identical, less device memory, resumes without offload" \
    t_tr_offload

# the shard levels on simulated GPUs. optimizer: each GPU keeps the AdamW
# moments of its slice, updates that slice and the slices are gathered
# (NCCL sends and receives in one group); gradients: each unit's gradient
# reduce-scattered into the slices (sums in rank order, as the
# simulator's all-reduce) while the next unit's backward runs;
# parameters: each unit's weights gathered a unit ahead, forward and
# backward. The same losses and parameters to the bit as unsharded, on 2
# ranks and on 3 (unequal slices, a tied head); less device memory for
# optimizer and parameters; a sharded checkpoint resumes unsharded and at
# another level, to the bit
t_tr_shard() {
    for _case in "2 2048 no none optimizer gradients" "3 2052 yes none parameters"; do
        # shellcheck disable=SC2086
        set -- $_case
        _r=$1 _t=$2 _tied=$3
        shift 3
        for _s; do
            rm -rf "$TMPD/gsh-$_s.d"
            mpirun_np "$_r" env DT_SIM_GPUS=1 DT_SIM_MEMSTAT=1 "$SIM" train --device cuda \
                --model custom --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 \
                --vocab 512 --tied "$_tied" --seq-len "$_t" --steps 4 --shard "$_s" \
                --ckpt-dir "$TMPD/gsh-$_s.d" --ckpt-every 2 >"$TMPD/gsh-$_s.log" 2>&1 ||
                { cat "$TMPD/gsh-$_s.log"; return 1; }
        done
        _a=$(result_sha "$TMPD/gsh-none.log")
        _pa=$(peak_of device "$TMPD/gsh-none.log")
        shift
        for _s; do
            _b=$(result_sha "$TMPD/gsh-$_s.log")
            _pb=$(peak_of device "$TMPD/gsh-$_s.log")
            echo "R=$_r $_s: $_b (none $_a), device peak $_pb bytes (none $_pa)"
            [ -n "$_a" ] && [ "$_a" = "$_b" ] || return 1
            [ "$_s" = gradients ] || [ "$_pb" -lt "$_pa" ] || return 1
        done
    done
    # the R=3 parameters checkpoint of step 2, resumed unsharded and at
    # shard = gradients
    for _s in none gradients; do
        rm -rf "$TMPD/gsh-back.d"
        mpirun_np 3 env DT_SIM_GPUS=1 "$SIM" train --device cuda --model custom --dim 256 \
            --layers 2 --heads 4 --kv-heads 2 --ffn 512 --vocab 512 --tied yes \
            --seq-len 2052 --steps 4 --shard "$_s" --ckpt-dir "$TMPD/gsh-back.d" \
            --ckpt-every 2 --resume-from "$TMPD/gsh-parameters.d/step-00000002" \
            >"$TMPD/gsh-back.log" 2>&1 || { cat "$TMPD/gsh-back.log"; return 1; }
        grep -q "params_sha256=$_a" "$TMPD/gsh-back.log" ||
            { echo "resumed at $_s: $(grep result: "$TMPD/gsh-back.log")"; return 1; }
    done
}
check "train --device cuda --shard optimizer|gradients|parameters: bit-identical, resumes across levels" \
    t_tr_shard

# fp16 on simulated GPUs: dynamic loss scaling from 2^16, checkpointed.
# A checkpoint whose scale is made 2^100 resumes into overflowing steps:
# each is skipped (the parameters stay those of the checkpoint, to the
# bit), halves the scale and still counts; one whose clean count is made
# 1999 doubles the scale after its next step
t_tr_fp16_scale() {
    _f16="--device cuda --dtype fp16 --model custom --dim 256 --layers 2 --heads 4 --kv-heads 2"
    _f16="$_f16 --ffn 512 --vocab 512 --seq-len 2048"
    rm -rf "$TMPD/f16.d"
    # shellcheck disable=SC2086
    mpirun_np 2 env DT_SIM_GPUS=1 "$SIM" train $_f16 --steps 2 --ckpt-dir "$TMPD/f16.d" \
        --ckpt-every 2 >"$TMPD/f16.log" 2>&1 || { cat "$TMPD/f16.log"; return 1; }
    grep -q "^step 0 .* loss_scale 65536$" "$TMPD/f16.log" || { cat "$TMPD/f16.log"; return 1; }
    _m="$TMPD/f16.d/step-00000002/manifest.json"
    grep -q '"clean": 2' "$_m" || { cat "$_m"; return 1; }
    for _case in "1267650600228229401496703205376 0" "65536 1999"; do
        # shellcheck disable=SC2086
        set -- $_case
        rm -rf "$TMPD/f16b.d" "$TMPD/f16c.d"
        cp -R "$TMPD/f16.d" "$TMPD/f16b.d"
        sed "s/\"scale\": 65536.0/\"scale\": $1.0/; s/\"clean\": 2/\"clean\": $2/" "$_m" \
            >"$TMPD/f16b.d/step-00000002/manifest.json"
        # shellcheck disable=SC2086
        mpirun_np 2 env DT_SIM_GPUS=1 "$SIM" train $_f16 --steps 4 --ckpt-dir "$TMPD/f16c.d" \
            --resume-from "$TMPD/f16b.d/step-00000002" >"$TMPD/f16r.log" 2>&1 ||
            { cat "$TMPD/f16r.log"; return 1; }
        grep '^step' "$TMPD/f16r.log"
        if [ "$2" = 0 ]; then
            grep -q "^step 2 .* loss_scale 633825300114114700748351602688 skipped$" \
                "$TMPD/f16r.log" &&
                grep -q "^step 3 .* loss_scale 316912650057057350374175801344 skipped$" \
                    "$TMPD/f16r.log" &&
                [ "$(result_sha "$TMPD/f16r.log")" = "$(result_sha "$TMPD/f16.log")" ] ||
                return 1
        else
            grep -q "^step 2 .* loss_scale 131072$" "$TMPD/f16r.log" || return 1
        fi
    done
}
check "train --device cuda --dtype fp16: loss scale 2^16, overflowed steps skipped and halve it, checkpointed" \
    t_tr_fp16_scale

# recompute = layer on simulated GPUs: every layer's input kept, the layer
# made again before its backward: the same losses and parameters to the
# bit, on 1 and 2 ranks, in less device memory
t_tr_recompute() {
    for _r in 1 2; do
        for _rc in none layer; do
            mpirun_np "$_r" env DT_SIM_GPUS=1 DT_SIM_MEMSTAT=1 "$SIM" train --device cuda \
                --model custom --dim 256 --layers 4 --heads 4 --kv-heads 2 --ffn 512 \
                --vocab 512 --seq-len 2048 --steps 2 --recompute "$_rc" >"$TMPD/rc-$_rc.log" 2>&1 ||
                { cat "$TMPD/rc-$_rc.log"; return 1; }
        done
        _a=$(result_sha "$TMPD/rc-none.log")
        _b=$(result_sha "$TMPD/rc-layer.log")
        _pa=$(peak_of device "$TMPD/rc-none.log")
        _pb=$(peak_of device "$TMPD/rc-layer.log")
        echo "R=$_r: $_b (none $_a), device peak $_pb bytes (none $_pa)"
        [ -n "$_a" ] && [ "$_a" = "$_b" ] && [ "$_pb" -lt "$_pa" ] || return 1
    done
}
check "train --device cuda --recompute layer: bit-identical, less device memory (1 and 2 ranks)" \
    t_tr_recompute

cat >"$TMPD/tr.spec" <<SPEC
kind = train
model = custom
dim = 256
layers = 2
heads = 4
kv_heads = 2
ffn = 512
vocab = 512
tokens = 2048
seed = 3
steps = 8
ckpt_every = 2
ranks = 4
device = cuda
SPEC
mpirun_np 4 env DT_SIM_GPUS=1 "$SIM" train --spec "$TMPD/tr.spec" >"$TMPD/tr-direct.log" 2>&1
TR_REF=$(result_sha "$TMPD/tr-direct.log")

# tr_local NAME ARGS...: the train job, with the direct run's parameters
tr_local() {
    _tl=$TMPD/trl-$1
    shift
    job_local "$TMPD/tr.spec" "$TR_REF" "$_tl" "$@"
}
t_tr_local() {
    tr_local plain || return 1
    grep -q "device=cuda/bf16" "$TMPD/trl-plain/jobs/1/logs/rank-0.log" ||
        { echo "rank 0 did not train on the device"; return 1; }
}
check "run --local, train with device = cuda: completes with the direct run's parameters" t_tr_local
check "run --local, train on GPUs: a worker killed at step 3, resumed, the same parameters" \
    tr_local worker --inject-failure worker@3
check "run --local, train on GPUs: a worker hung, resumed, the same parameters" \
    tr_local hang --inject-failure hang@3
check "run --local, train on GPUs: an agent lost with a spare, the same parameters" \
    tr_local agent --inject-failure agent@3 --spares 1
check "run --local, train on GPUs: the coordinator killed and restarted, the same parameters" \
    tr_local coord --inject-failure coordinator@3
# with the layer inputs and the optimizer in host memory and the
# gradients streaming there: a worker killed at step 3 resumes to the
# direct run's parameters
t_tr_local_offload() {
    { cat "$TMPD/tr.spec"; printf 'recompute = layer\nshard = gradients\n'
      printf 'offload = activations,optimizer\nckpt_dtype = bf16\n'; } >"$TMPD/tr-off.spec"
    mpirun_np 4 env DT_SIM_GPUS=1 "$SIM" train --spec "$TMPD/tr-off.spec" \
        >"$TMPD/tr-off-direct.log" 2>&1 || { cat "$TMPD/tr-off-direct.log"; return 1; }
    job_local "$TMPD/tr-off.spec" "$(result_sha "$TMPD/tr-off-direct.log")" "$TMPD/trl-off" \
        --inject-failure worker@3
}
check "run --local, train on GPUs with offload = activations,optimizer: a worker killed, the same parameters" \
    t_tr_local_offload
t_tr_ecc() {
    DT_SIM_DEVICE_FAULT="2:$TMPD/tr-ecc.mark" tr_local ecc --spares 1 || return 1
    [ -f "$TMPD/tr-ecc.mark" ] || { echo "the fault was not injected"; return 1; }
    sqlite3 "$TMPD/trl-ecc/dt.db" "SELECT detail FROM events WHERE kind = 'device_fault'" |
        grep -q "its GPU failed; local[0-9] is suspect" || { sqlite3 "$TMPD/trl-ecc/dt.db" "SELECT kind, detail FROM events"; return 1; }
}
check "run --local, train on GPUs: an uncorrectable ECC error, node suspect, spare, the same parameters" \
    t_tr_ecc
t_tr_oom() {
    run_rc 7 env DT_ENGINE="$SIM" DT_SIM_GPUS=2 DT_SIM_GPU_MEMORY=20000000 "$DTCTL" run --local \
        "$TMPD/tr.spec" --state-dir "$TMPD/trl-oom" --interval 250ms || return 1
    out_has "^job 1 [a-z-]+ failed\$" || return 1
    sqlite3 "$TMPD/trl-oom/dt.db" "SELECT detail FROM events WHERE kind = 'deterministic_failure'" |
        grep -E "on local[12] \(GPU-d7510000-[0-9a-f-]+\) exited with status 1 .*cudaMalloc.*out of memory" ||
        { sqlite3 "$TMPD/trl-oom/dt.db" "SELECT kind, detail FROM events"; return 1; }
}
check "run --local, train on GPUs: out of device memory fails the job, naming node, GPU and cause" \
    t_tr_oom

finish
