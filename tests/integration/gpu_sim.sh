#!/bin/sh
# SPDX-License-Identifier: MIT
#
# The GPU path without a GPU: tests/gpu/dtengine-sim is dtengine built
# against the host simulator of the CUDA runtime, NCCL and the kernels
# (tests/gpu/sim: its kernels are the CPU reference computing on the
# bf16/fp16-rounded inputs the real kernels would see, its streams run in
# random legal orders, its NCCL joins the processes of one host over Unix
# sockets). It says so in every device name. Training is gpu_train.sh's
# (the two run side by side under make -j); what both use, gpulib.sh.
# Checked here:
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
#     a worker killed, the fault-free checksum.
# Skipped where the simulated build does not exist (configured without
# CUDA headers).
. "$(dirname "$0")/lib.sh"
. "$DT_TESTDIR/gpulib.sh"

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
        out_has "^0  $UUID1 " && [ "$(grep -c '^[0-9]' "$TMPD/out")" = 1 ] &&
        out_has "^cudnn 9.19.0$" || return 1
    run_rc 0 env DT_SIM_CUDNN=0 "$SIM" devices --json &&
        out_has '"cudnn": null' && out_has '"cudnn_error": "cuDNN cannot be loaded' || return 1
    run_rc 0 env DT_SIM_GPUS=0 "$SIM" devices && out_has "^no GPU: cudaGetDeviceCount"
}
check "devices: simulated GPUs, chosen by CUDA_VISIBLE_DEVICES (index, UUID), or none; the cuDNN version or why none" t_devices

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
# masks: documents crossing ranks (one of a token), a window not causal
check "attn --device cuda with documents crossing ranks (4 ranks, zigzag, bf16), forward and backward: within 3e-2 of the CPU path" \
    vs 4 docs bf16 3e-2 --generate 1024,4,2,64 --seed 5 --causal --layout zigzag --backward \
    --doc-lengths 100,1,300,123,500
check "attn --device cuda, a sliding window of 100, not causal, 3 ranks, fp16: within 1e-2" \
    vs 3 win fp16 1e-2 --generate 768,4,2,64 --seed 6 --layout contiguous --backward \
    --sliding-window 100 --no-causal
check "attn --device cuda, a block pattern (global, local, strided over blocks of 32), 4 ranks, zigzag, bf16, forward and backward: within 3e-2" \
    vs 4 pat bf16 3e-2 --generate 1024,4,2,64 --seed 5 --causal --layout zigzag --backward \
    --block-pattern global:1,local:2,strided:5 --block-size 32
# ---- the block kernel: cuDNN (the simulator's stand-in, version DT_SIM_CUDNN) or dt's -------
t_kernels() {
    # the checks above ran through cuDNN's stand-in (auto), and said so
    grep -q "gpu attn_kernel=cudnn 9.19.0 deterministic" "$TMPD/ring.gpu.log" ||
        { echo "ring: no attn_kernel=cudnn line"; cat "$TMPD/ring.gpu.log"; return 1; }
    grep -q "gpu attn_kernel=dt (masks" "$TMPD/docs.gpu.log" ||
        { echo "docs: masks not named as dt's"; cat "$TMPD/docs.gpu.log"; return 1; }
    (DT_ATTN_KERNEL=dt && export DT_ATTN_KERNEL &&
        vs 4 kdt bf16 3e-2 --generate 2048,4,2,64 --seed 5 --causal --layout zigzag --backward) ||
        return 1
    grep -q "gpu attn_kernel=dt$" "$TMPD/kdt.gpu.log" || { cat "$TMPD/kdt.gpu.log"; return 1; }
    # no cuDNN on the node: dt's kernels, saying why
    (DT_SIM_CUDNN=0 && export DT_SIM_CUDNN &&
        vs 2 knone bf16 3e-2 --generate 1024,4,2,64 --seed 5 --causal --backward) || return 1
    grep -q "gpu attn_kernel=dt (cuDNN cannot be loaded" "$TMPD/knone.gpu.log" ||
        { cat "$TMPD/knone.gpu.log"; return 1; }
    # cuDNN 9.25's backward with 64 mod 128 keys goes to dt's kernels: 2 ranks
    # of 192 rows, zigzag (pieces of 96 and 192 keys: both kinds)
    (DT_SIM_CUDNN=92500 && export DT_SIM_CUDNN &&
        vs 2 k925 bf16 3e-2 --generate 384,4,2,64 --seed 8 --causal --layout zigzag --backward) ||
        return 1
    grep -q "kernel=cudnn/9.25.0 pieces_cudnn=[1-9][0-9]* pieces_dt=[1-9]" "$TMPD/k925.gpu.log" ||
        { echo "9.25: not both kernels"; cat "$TMPD/k925.gpu.log"; return 1; }
    grep -q "kernel=cudnn/9.19.0 pieces_cudnn=[1-9][0-9]* pieces_dt=0" "$TMPD/ring.gpu.log" ||
        { echo "ring: dt's kernels ran"; cat "$TMPD/ring.gpu.log"; return 1; }
    # deterministic = no: cuDNN's backward with its dQ accumulator, said so
    vs 2 knd bf16 3e-2 --generate 1024,4,2,64 --seed 5 --causal --backward \
        --no-deterministic || return 1
    grep -q "gpu attn_kernel=cudnn 9.19.0 nondeterministic" "$TMPD/knd.gpu.log" ||
        { echo "deterministic = no: not said"; cat "$TMPD/knd.gpu.log"; return 1; }
}
check "attn --device cuda: blocks through cuDNN (auto, deterministic or not) or dt's kernels (DT_ATTN_KERNEL=dt), none without cuDNN, cuDNN 9.25's bad backward shapes routed to dt's: each within 3e-2 of the CPU path, the kernel named" \
    t_kernels
t_gpu_mask_refused() {
    "$NPYTOOL" blocks --blocks 16 --heads 4 --seed 6 "$TMPD/perhead.npy" || return 1
    run_rc 2 "$SIM" attn --device cuda --generate 1024,4,2,64 --seed 1 --block-mask \
        "$TMPD/perhead.npy" --mask-block 64 && out_has "a block pattern per head does not run" &&
        run_rc 2 "$SIM" attn --device cuda --generate 1024,4,2,64 --seed 1 --sliding-window 64 \
            --segments 256,1024 --dilations 1,4 && out_has "masks on dilated attention run on" &&
        run_rc 2 "$SIM" attn --device cuda --generate 1024,4,2,64 --seed 1 --layout balanced &&
        out_has "layout = balanced runs on device = cpu"
}
check "attn --device cuda refuses a pattern per head, masks on dilated attention and the balanced layout, naming them (exit 2)" \
    t_gpu_mask_refused

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
tokens = 6144
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
t_oom() { oom_local "$TMPD/gpu.spec" "$TMPD/local-oom" 1000000; }
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
# none; every layer's hidden state is also copied into the agents' memory
# (mem_ckpt_every = auto: 1): the second generation must resume from the
# memory copy of a layer no older than the last committed one, as its
# resumed_step event says, or else at the last committed layer)
t_pf_worker() {
    pf_local worker --inject-failure worker@2 && out_has "restarts +[1-9]" || return 1
    sqlite3 "$TMPD/pfl-worker/dt.db" "SELECT kind, detail FROM events ORDER BY id" | awk -F'|' '
        BEGIN { last = 0 }
        $1 == "checkpoint_committed" && !started { sub(/^step=/, "", $2); last = $2 + 0 }
        $1 == "generation_started" && $2 ~ /^gen=2 / && !started {
            started = 1; at = $2; sub(/.* resume_step=/, "", at); at += 0 }
        $1 == "resumed_step" && $2 ~ /^gen=2: resumed step [0-9]+ from memory$/ { mem = 1 }
        END {
            if (!started) { print "no second generation"; exit 1 }
            if (mem && at >= last) { print "gen 2 resumed from memory at layer " at " (committed: " last ")"; exit 0 }
            if (!mem && at == last) { print "gen 2 resumed at the last committed layer " at; exit 0 }
            print "gen 2 resumed at " at (mem ? " from memory" : " from disk") ", last committed " last
            exit 1 }'
}
check "run --local, prefill on GPUs: a worker killed after layer 2 resumes from memory or a committed layer, same logits" \
    t_pf_worker

# ---- dtctl run --local --device cuda: the built-in job on simulated GPUs ------------------
t_builtin() {
    for _b in plain worker; do
        _x=
        [ "$_b" = worker ] && _x="--inject-failure worker@6"
        # shellcheck disable=SC2086
        run_rc 0 env DT_ENGINE="$SIM" DT_SIM_GPUS=2 "$DTCTL" run --local --device cuda \
            --steps 12 --state-dir "$TMPD/builtin-$_b" --interval 250ms $_x || return 1
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

finish
