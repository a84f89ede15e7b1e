#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Training on simulated GPUs (tests/gpu/dtengine-sim; gpulib.sh, and
# gpu_sim.sh for the simulator and the other kinds):
#   - `train --device cuda` (the whole step on the device: embedding,
#     layers and their backward in 1024-token tiles, the ring's backward,
#     the loss, the gradient over NCCL, its norm, AdamW) on 1 to 4 ranks:
#     every step's loss and the trained parameters within the dtype's
#     tolerance of the CPU path; checkpoints copied off the device during
#     the next step; a GPU resume equal to the uninterrupted run to the
#     bit; checkpoints across devices both ways;
#   - the planner's device and host memory for it against what the engine
#     allocates (the simulated device's and page-locked peaks), within
#     10 %, for recompute, the shard levels, offload and ckpt_dtype;
#   - recompute, offload (activations, optimizer), ckpt_dtype, the shard
#     levels and dp: bit-identical where they promise it, resumes across
#     levels; fp16's dynamic loss scale;
#   - a device = cuda train job through agents with the direct run's
#     parameters, also after a worker killed, a worker hung, an agent lost
#     (spare), the coordinator killed and an uncorrectable ECC error, and
#     with dp and offload; out of device memory fails it, naming the node,
#     the GPU and the cause.
# Skipped where the simulated build does not exist (configured without
# CUDA headers).
. "$(dirname "$0")/lib.sh"
. "$DT_TESTDIR/gpulib.sh"

# ---- train --device cuda --------------------------------------------------------------------
# the same model as the prefill's, 2 layers, 1024 tokens of the recall task
# (TR_T others), 6 steps
tr() { # cpu|gpu R NAME ARGS...: train on R ranks; its log NAME.log, parameters NAME.npy
    _td=$TMPD/$3
    _ta="$1 $2"
    shift 3
    # shellcheck disable=SC2086
    on $_ta "$_td.log" train "$@" --model custom --dim 256 --layers 2 --heads 4 --kv-heads 2 \
        --ffn 512 --vocab 512 --data recall --seq-len "${TR_T:-1024}" --seed 3 --steps "${TR_STEPS:-6}" \
        --params-out "$_td.npy"
}
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
    [ "$(wc -l <"$TMPD/tr-$1.gpu.steps")" = "${TR_STEPS:-6}" ] || { cat "$TMPD/tr-$1.gpu.log"; return 1; }
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
# masks on the GPU: packed documents with positions reset, a window on
# every other layer, a block pattern; train and prefill within bf16 of the
# CPU path, and not the unmasked losses
t_tr_masks() {
    "$NPYTOOL" tokbin "$TMPD/docs.bin" --docs 300,1,200,523 --eot 3 --vocab 512 --seed 4 ||
        return 1
    _mk="--doc-mask eot --eot-token 3 --doc-positions reset --sliding-window 64"
    _mk="$_mk --sliding-window-layers every:2 --block-pattern global:1,local:4 --block-size 64"
    _m="--model custom --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --vocab 512"
    _m="$_m --data $TMPD/docs.bin --seq-len 1024 --seed 3"
    for _d in cpu gpu; do
        # shellcheck disable=SC2086
        on $_d 2 "$TMPD/trm.$_d.log" train $_m --steps 3 $_mk &&
            on $_d 2 "$TMPD/pfm.$_d.log" prefill $_m $_mk || return 1
    done
    # shellcheck disable=SC2086
    on gpu 2 "$TMPD/trm.plain.log" train $_m --steps 3 || return 1
    for _f in trm.cpu trm.gpu trm.plain; do
        sed -n 's/^step \([0-9]*\) loss \([0-9.]*\) .*/\2/p' "$TMPD/$_f.log" >"$TMPD/$_f.loss"
    done
    sed -n 's/^prefill: tokens=.* loss \([0-9.]*\)$/\1/p' "$TMPD/pfm.cpu.log" >>"$TMPD/trm.cpu.loss"
    sed -n 's/^prefill: tokens=.* loss \([0-9.]*\)$/\1/p' "$TMPD/pfm.gpu.log" >>"$TMPD/trm.gpu.loss"
    paste "$TMPD/trm.gpu.loss" "$TMPD/trm.cpu.loss" "$TMPD/trm.plain.loss" | awk '
        { d = ($1 - $2) / $2; if (d < 0) d = -d; if (d > w) w = d; n++
          if ($3 != "") { e = ($3 - $2) / $2; if (e < 0) e = -e; if (e > far) far = e } }
        END { printf "GPU vs CPU, 3 steps and the prefill: largest relative difference %.2e; unmasked %.2e\n", w, far
              exit !(n == 4 && w < 1e-2 && far > 10 * w) }'
}
check "train and prefill --device cuda with packed documents (positions reset), an every:2 window and a block pattern: within 1e-2 of the CPU path" \
    t_tr_masks

# 2048 tokens on one GPU: every token-local part in two 1024-token tiles
# (DT_GPU_ROWS); 3 steps (two updates seen by a forward, a third's
# gradient: what the tiles touch) keep its minute in CI down
t_tr_tiled() {
    TR_T=2048 TR_STEPS=3
    tr_vs tiled 1 bf16 1e-2
    _rt=$?
    TR_T= TR_STEPS=
    return $_rt
}
check "train --device cuda, 1 rank, T = 2048 (every token-local part in 1024-token tiles), 3 steps, bf16: within 1e-2" \
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
# the engine allocates on the simulated device (its peak): at most 10 %
# above, and below only by the simulator's per-allocation rounding (256
# bytes each, a few hundred bytes in all: 0.1 %); and its host memory per
# rank against the simulator's page-locked peak, the same way
t_tr_memory() { # [none|layer [SHARD [OFFLOAD [CKPT_DTYPE [DP]]]]]: the settings of both
    _rc=${1:-none}
    _sh=${2:-none}
    _of=${3:-none}
    _ck=${4:-fp32}
    _dp=${5:-1}
    DTCTL_PLAN="$DTCTL plan --tokens 2048 --kind train --model custom --dim 256 --layers 2"
    DTCTL_PLAN="$DTCTL_PLAN --heads 4 --kv-heads 2 --ffn 512 --vocab 512 --tied no"
    DTCTL_PLAN="$DTCTL_PLAN --device cuda --causal --json --recompute $_rc --shard $_sh"
    DTCTL_PLAN="$DTCTL_PLAN --offload $_of --ckpt-dtype $_ck"
    for _r in 1 2; do
        # the second run's two GPUs one ring, or with DP = 2 two rings of one
        _rr=$_r _rd=1
        [ "$_r" = 2 ] && [ "$_dp" = 2 ] && _rr=1 _rd=2
        # shellcheck disable=SC2086
        run_rc 0 $DTCTL_PLAN --ranks "$_rr" --dp "$_rd" || return 1
        _total=$(sed -n 's/.*"memory_per_rank_bytes": *\([0-9]*\).*/\1/p' "$TMPD/out")
        _fixed=$(sed -n 's/.*"fixed": *\([0-9]*\).*/\1/p' "$TMPD/out" | head -n 1)
        mpirun_np "$_r" env DT_SIM_GPUS=1 DT_SIM_MEMSTAT=1 "$SIM" train --device cuda \
            --model custom --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --vocab 512 \
            --seq-len 2048 --steps 1 --recompute "$_rc" --shard "$_sh" --offload "$_of" \
            --ckpt-dtype "$_ck" --dp "$_rd" >"$TMPD/mem.log" 2>&1 ||
            { cat "$TMPD/mem.log"; return 1; }
        _peak=$(peak_of device "$TMPD/mem.log")
        _host=$(sed -n 's/.*"host_memory_per_rank_bytes": *\([0-9]*\).*/\1/p' "$TMPD/out")
        _hpeak=$(peak_of host "$TMPD/mem.log")
        awk -v p="$_total" -v f="$_fixed" -v e="$_peak" -v r="$_r" -v h="$_host" \
            -v hp="$_hpeak" 'BEGIN {
            q = (p - f) / e; qh = hp > 0 ? h / hp : 0
            printf "R=%d: planned %d bytes, allocated %d (x%.3f); host planned %d, page-locked %d (x%.3f)\n",
                r, p - f, e, q, h, hp, qh
            exit !(e > 0 && q >= 0.999 && q <= 1.1 && qh >= 0.999 && qh <= 1.1) }' || return 1
    done
}
check "plan: a cuda train job's memory per GPU covers the engine's, within 10 % (1 and 2 ranks)" \
    t_tr_memory
check "plan, recompute = layer: a cuda train job's memory covers the engine's, within 10 %" \
    t_tr_memory layer
check "plan, shard = gradients (and dp = 2 rings of one): a cuda train job's memory covers the engine's, within 10 %" \
    t_tr_memory none gradients none fp32 2
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
                --model custom --dim 256 --layers 3 --heads 4 --kv-heads 2 --ffn 512 \
                --vocab 512 --seq-len 512 --steps 2 --recompute layer --offload "$1" \
                --ckpt-dtype "$2" >"$TMPD/oa-$1-$2.log" 2>&1 ||
                { cat "$TMPD/oa-$1-$2.log"; return 1; }
        done
        for _d in fp32 bf16; do
            same_less "R=$_r $_d, offloaded against on the device" "$TMPD/oa-none-$_d.log" \
                "$TMPD/oa-activations-$_d.log" || return 1
        done
        grep -q ' offload=activations ckpt_dtype=bf16' "$TMPD/oa-activations-bf16.log" || return 1
        _l32=$(sed -n 's/^result: .* loss=\([0-9.]*\).*/\1/p' "$TMPD/oa-none-fp32.log")
        _l16=$(sed -n 's/^result: .* loss=\([0-9.]*\).*/\1/p' "$TMPD/oa-none-bf16.log")
        awk -v a="$_l32" -v b="$_l16" 'BEGIN { d = (a - b) / a; if (d < 0) d = -d
            printf "loss fp32 %s, bf16 inputs %s (relative %.1e)\n", a, b, d; exit !(a > 0 && d <= 1e-2) }' ||
            return 1
    done
    run_rc 2 "$SIM" train --device cuda --model custom --dim 256 --layers 2 --heads 4 \
        --kv-heads 2 --ffn 512 --vocab 512 --seq-len 512 --steps 1 --offload activations
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
                --vocab 512 --seq-len 512 --steps 4 --shard "$2" --offload "$_of" \
                --batch "$3" --clip 0.5 --ckpt-dir "$TMPD/gof-$_of.d" --ckpt-every 2 \
                >"$TMPD/gof-$_of.log" 2>&1 || { cat "$TMPD/gof-$_of.log"; return 1; }
        done
        grep -q ' offload=optimizer' "$TMPD/gof-optimizer.log" ||
            { grep -i offload "$TMPD/gof-optimizer.log"; return 1; }
        same_less "R=$1 shard=$2, offloaded against no offload" "$TMPD/gof-none.log" \
            "$TMPD/gof-optimizer.log" || return 1
        _a=$(result_sha "$TMPD/gof-none.log")
    done
    # the planner: less on the device, more on the host
    for _of in none optimizer; do
        run_rc 0 "$DTCTL" plan --tokens 512 --kind train --model custom --dim 256 --layers 2 \
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
        --layers 2 --heads 4 --kv-heads 2 --ffn 512 --vocab 512 --seq-len 512 --steps 4 \
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
    for _case in "2 1024 no none optimizer gradients" "3 1026 yes none parameters"; do
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
            --seq-len 1026 --steps 4 --shard "$_s" --ckpt-dir "$TMPD/gsh-back.d" \
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
    _f16="$_f16 --ffn 512 --vocab 512 --seq-len 1024"
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
                --vocab 512 --seq-len 512 --steps 2 --recompute "$_rc" >"$TMPD/rc-$_rc.log" 2>&1 ||
                { cat "$TMPD/rc-$_rc.log"; return 1; }
        done
        same_less "R=$_r, recompute = layer against none" "$TMPD/rc-none.log" \
            "$TMPD/rc-layer.log" || return 1
    done
}
check "train --device cuda --recompute layer: bit-identical, less device memory (1 and 2 ranks)" \
    t_tr_recompute

# dp = N on simulated GPUs: N rings of R ranks, each its own sequences, a
# second NCCL communicator across the rings (its id through PMIx beside the
# ring's); the gradient summed around each ring, then across the replicas
# (sharded: each unit's ring part reduce-scattered in place, then across
# the replicas into the R N slices; parameters gathered the other way),
# the updated slices gathered across the replicas, then around. Pairwise
# over the shard levels, recompute and offload with dp = 2 on 4 ranks: the
# same parameters to the bit as the unsharded dp = 2 job, which is within
# bf16 tolerance of the CPU engine's dp = 2; dp = 3 on 3 ranks (rings of
# one, unequal slices, a tied head): parameters + optimizer in host memory
# to the bit of unsharded; the dp = 2 parameters checkpoint resumes
# unsharded to the bit
t_tr_dp() {
    _dpm="--model custom --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --vocab 512"
    _dpm="$_dpm --seq-len 512 --steps 3 --ckpt-every 2"
    for _case in "4 2 no none:none:none optimizer:layer:optimizer gradients:none:optimizer parameters:layer:activations,optimizer" \
        "3 3 yes none:none:none parameters:none:optimizer"; do
        # shellcheck disable=SC2086
        set -- $_case
        _np=$1 _dp=$2 _tied=$3
        shift 3
        _a=
        for _m; do
            _s=${_m%%:*} _rc=${_m#*:}
            _of=${_rc#*:} _rc=${_rc%%:*}
            rm -rf "$TMPD/gdp-$_dp-$_s.d"
            # shellcheck disable=SC2086
            mpirun_np "$_np" env DT_SIM_GPUS=1 "$SIM" train --device cuda $_dpm --dp "$_dp" \
                --tied "$_tied" --shard "$_s" --recompute "$_rc" --offload "$_of" \
                --ckpt-dir "$TMPD/gdp-$_dp-$_s.d" >"$TMPD/gdp-$_dp-$_s.log" 2>&1 ||
                { cat "$TMPD/gdp-$_dp-$_s.log"; return 1; }
            grep -q " dp=$_dp " "$TMPD/gdp-$_dp-$_s.log" || { head -n 5 "$TMPD/gdp-$_dp-$_s.log"; return 1; }
            _b=$(result_sha "$TMPD/gdp-$_dp-$_s.log")
            _a=${_a:-$_b}
            [ -n "$_b" ] && [ "$_b" = "$_a" ] ||
                { echo "dp=$_dp $_m: $_b, not $_a (unsharded)"; return 1; }
        done
        echo "dp=$_dp on $_np ranks: $* give $_a"
    done
    # the CPU engine's dp = 2 within bf16 tolerance of the GPUs'
    # shellcheck disable=SC2086
    mpirun_np 4 "$DT_BUILDDIR/engine/dtengine" train $_dpm --dp 2 --tied no \
        --ckpt-dir "$TMPD/gdp-cpu.d" --params-out "$TMPD/gdp-cpu.npy" >"$TMPD/gdp-cpu.log" 2>&1 ||
        { cat "$TMPD/gdp-cpu.log"; return 1; }
    grep '^step ' "$TMPD/gdp-cpu.log" >"$TMPD/gdp-cpu.steps"
    grep '^step ' "$TMPD/gdp-2-optimizer.log" >"$TMPD/gdp-gpu.steps"
    paste "$TMPD/gdp-gpu.steps" "$TMPD/gdp-cpu.steps" | awk '
        { g = $4; c = $(NF / 2 + 4); d = (g - c) / c; if (d < 0) d = -d; if (d > w) w = d }
        END { printf "dp=2 GPU against CPU: largest relative loss difference %.2e\n", w; exit !(NR == 3 && w < 1e-2) }' ||
        return 1
    # the dp = 2 parameters checkpoint of step 2 resumed unsharded on the GPUs
    rm -rf "$TMPD/gdp-back.d"
    # shellcheck disable=SC2086
    mpirun_np 4 env DT_SIM_GPUS=1 "$SIM" train --device cuda $_dpm --dp 2 --tied no \
        --shard none --ckpt-dir "$TMPD/gdp-back.d" \
        --resume-from "$TMPD/gdp-2-parameters.d/step-00000002" >"$TMPD/gdp-back.log" 2>&1 ||
        { cat "$TMPD/gdp-back.log"; return 1; }
    grep -q "params_sha256=$(result_sha "$TMPD/gdp-2-none.log")" "$TMPD/gdp-back.log" ||
        { echo "resumed unsharded: $(grep result: "$TMPD/gdp-back.log")"; return 1; }
}
check "train --device cuda --dp 2 and 3: every shard level, recompute, offload to the bit; CPU within 1e-2; resumes" \
    t_tr_dp

cat >"$TMPD/tr.spec" <<SPEC
kind = train
model = custom
dim = 256
layers = 2
heads = 4
kv_heads = 2
ffn = 512
vocab = 512
tokens = 1024
seed = 3
steps = 6
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
# The kill comes as step 3 is reported: on the GPU, step 2's copy goes to
# the copies' thread just before step 3's update and may still be in flight,
# so the newest copy in memory is step 1 or 2. With a disk checkpoint at
# step 2 (ckpt_every = 2) the disk one could win that race; here the only
# disk checkpoint is the job's last step, so a resume that is not from
# memory is a failure of the copies.
t_tr_worker() {
    sed 's/^ckpt_every = 2$/ckpt_every = 6/' "$TMPD/tr.spec" >"$TMPD/tr-mem.spec"
    job_local "$TMPD/tr-mem.spec" "$TR_REF" "$TMPD/trl-worker" --inject-failure worker@3 &&
        out_has "^gen 2: resumed step [1-9] from memory"
}
check "run --local, train on GPUs: a worker killed at step 3, resumed from memory (copied off the device), the same parameters" \
    t_tr_worker
check "run --local, train on GPUs: a worker hung, resumed, the same parameters" \
    tr_local hang --inject-failure hang@3
check "run --local, train on GPUs: an agent lost with a spare, the same parameters" \
    tr_local agent --inject-failure agent@3 --spares 1
check "run --local, train on GPUs: the coordinator killed and restarted, the same parameters" \
    tr_local coord --inject-failure coordinator@3
# two rings of two (dp = 2) with the layer inputs and the optimizer in host
# memory and the gradients streaming there: a worker killed at step 3
# resumes to the direct run's parameters
t_tr_local_offload() {
    { sed 's/^ranks = 4$/ranks = 2/; s/^tokens = 1024$/tokens = 512/; s/^steps = 6$/steps = 5/' \
          "$TMPD/tr.spec"
      printf 'dp = 2\nrecompute = layer\nshard = gradients\n'
      printf 'offload = activations,optimizer\nckpt_dtype = bf16\n'; } >"$TMPD/tr-off.spec"
    mpirun_np 4 env DT_SIM_GPUS=1 "$SIM" train --spec "$TMPD/tr-off.spec" \
        >"$TMPD/tr-off-direct.log" 2>&1 || { cat "$TMPD/tr-off-direct.log"; return 1; }
    job_local "$TMPD/tr-off.spec" "$(result_sha "$TMPD/tr-off-direct.log")" "$TMPD/trl-off" \
        --inject-failure worker@3
}
check "run --local, train on GPUs with dp = 2 and offload = activations,optimizer: a worker killed, the same parameters" \
    t_tr_local_offload
t_tr_ecc() {
    DT_SIM_DEVICE_FAULT="2:$TMPD/tr-ecc.mark" tr_local ecc --spares 1 || return 1
    [ -f "$TMPD/tr-ecc.mark" ] || { echo "the fault was not injected"; return 1; }
    sqlite3 "$TMPD/trl-ecc/dt.db" "SELECT detail FROM events WHERE kind = 'device_fault'" |
        grep -q "its GPU failed; local[0-9] is suspect" || { sqlite3 "$TMPD/trl-ecc/dt.db" "SELECT kind, detail FROM events"; return 1; }
}
check "run --local, train on GPUs: an uncorrectable ECC error, node suspect, spare, the same parameters" \
    t_tr_ecc
t_tr_oom() { oom_local "$TMPD/tr.spec" "$TMPD/trl-oom" 20000000; }
check "run --local, train on GPUs: out of device memory fails the job, naming node, GPU and cause" \
    t_tr_oom

finish
