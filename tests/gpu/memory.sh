#!/bin/sh
# SPDX-License-Identifier: MIT
#
# memory.sh: the GPU training memory account on a real GPU (issue "Long
# sequences on few GPUs": what the simulator cannot confirm). Two layers
# of the llama3-8b shape (dim 4096, 32/8 heads of 128, ffn 14336, vocab
# 128256, untied; random parameters from --seed, no checkpoint needed) on
# one GPU, for each memory mode (recompute, shard, offload, ckpt_dtype):
#   - the device bytes the run holds after its first step (dtengine's
#     "gpu memory held_bytes" line, cudaMemGetInfo) against `dtctl plan`'s
#     device total less its fixed part (the CUDA context and libraries):
#     the ratio planned / held should be 1 to 1.1;
#   - the process's peak RSS (page-locked host memory is resident) against
#     the planner's host memory per rank;
#   - the step time (the last step's tokens/s) with and without offload
#     (offload should cost under 10 % where the plan says it hides);
# then the longest T that trains with those two layers in the ALST mode
# (recompute = layer, shard = gradients, offload = activations,optimizer,
# ckpt_dtype = bf16), doubling from 64K until a run fails or the time is
# spent, beside the planner's longest T for the same two layers and for
# all 32 (llama3-8b, the figure the README states). Prints tables;
# asserts nothing; exit 0 when every run that should fit ran.
#
# usage: sh tests/gpu/memory.sh [BUILDDIR]
#   BUILDDIR holds gpu-bundle/ (tests/gpu/bundle.sh: dtengine and dtctl
#   with their libraries) or engine/dtengine and cli/dtctl. DT_ENGINE
#   overrides the engine (tests/gpu/dtengine-sim checks this script
#   without a GPU: DT_MEM_SHAPE=small, a model of dim 256). DT_MEM_T: the
#   table's sequence length (default 16384); DT_MEM_LONGEST_T0: where the
#   longest-T search starts (default 65536). DT_GPU_DEADLINE: seconds
#   after which no run goes on (default 270; a run then is killed).
set -u

builddir=${1:-.}
if [ -d "$builddir/gpu-bundle" ]; then
    eng=$builddir/gpu-bundle/dtengine
    ctl=$builddir/gpu-bundle/dtctl
    LD_LIBRARY_PATH=$builddir/gpu-bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LD_LIBRARY_PATH
else
    eng=$builddir/engine/dtengine
    ctl=$builddir/cli/dtctl
fi
eng=${DT_ENGINE:-$eng}
for b in "$eng" "$ctl"; do
    [ -x "$b" ] || { echo "memory.sh: $b is not there (build it, or tests/gpu/bundle.sh)" >&2; exit 2; }
done
T=${DT_MEM_T:-16384}
deadline=$(($(date +%s) + ${DT_GPU_DEADLINE:-270}))
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM

# the shape, and the GPU preset the planner uses (the device's name)
if [ "${DT_MEM_SHAPE:-8b}" = small ]; then
    shape="--dim 256 --heads 4 --kv-heads 2 --ffn 512 --vocab 512"
else
    shape="--dim 4096 --heads 32 --kv-heads 8 --ffn 14336 --vocab 128256"
fi
model="--model custom $shape --layers 2 --tied no"
gpu=h100-sxm
case $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1) in
*H200*) gpu=h200 ;;
esac
echo "memory.sh: engine $eng, planner preset $gpu, T = $T"

# plan MODE T [LAYERS]: the planner's device bytes less fixed, and host
# bytes, per rank on one GPU, into $plan_dev $plan_host; exit 6 when the
# plan does not fit
plan() {
    # shellcheck disable=SC2086
    set -- $1 "$2" "${3:-}"
    _m=$model
    [ -n "$6" ] && _m="--model llama3-8b"
    # shellcheck disable=SC2086
    "$ctl" plan --kind train $_m --tokens "$5" --device cuda --gpu "$gpu" --ranks 1 \
        --recompute "$1" --shard "$2" --offload "$3" --ckpt-dtype "$4" --json >"$tmp/plan" 2>&1
    _rc=$?
    _tot=$(sed -n 's/.*"memory_per_rank_bytes": *\([0-9]*\).*/\1/p' "$tmp/plan")
    _fix=$(sed -n 's/.*"fixed": *\([0-9]*\).*/\1/p' "$tmp/plan" | head -n 1)
    plan_dev=$((${_tot:-0} - ${_fix:-0}))
    plan_host=$(sed -n 's/.*"host_memory_per_rank_bytes": *\([0-9]*\).*/\1/p' "$tmp/plan")
    return $_rc
}
# run MODE T: one GPU, 3 steps, killed at the deadline; sets held, rss
# (bytes), tps (the last step's tokens/s); non-zero when the run failed
run() {
    # shellcheck disable=SC2086
    set -- $1 "$2"
    _left=$((deadline - $(date +%s)))
    [ "$_left" -gt 0 ] || return 124
    # shellcheck disable=SC2086
    timeout "$_left" /usr/bin/time -f 'maxrss_kib %M' "$eng" train --device cuda $model --seq-len "$5" --steps 3 \
        --seed 1 --recompute "$1" --shard "$2" --offload "$3" --ckpt-dtype "$4" \
        >"$tmp/run" 2>&1
    _rc=$?
    held=$(sed -n 's/.*gpu memory held_bytes=\([0-9]*\) .*/\1/p' "$tmp/run" | head -n 1)
    _kib=$(sed -n 's/^maxrss_kib \([0-9]*\)$/\1/p' "$tmp/run" | tail -n 1)
    rss=$((${_kib:-0} * 1024))
    tps=$(sed -n 's/^step 2 .* tokens\/s \([0-9]*\) .*/\1/p' "$tmp/run")
    return $_rc
}
for b in /usr/bin/time timeout; do
    command -v "$b" >/dev/null 2>&1 || { echo "memory.sh: needs $b" >&2; exit 2; }
done

modes="none none none fp32
none none optimizer fp32
layer none none fp32
layer none activations fp32
layer none activations,optimizer fp32
layer gradients activations,optimizer bf16"
bad=0
printf '\n| recompute | shard | offload | ckpt | device planned GiB | held GiB | ratio | host planned GiB | peak RSS GiB | tokens/s |\n'
printf '|--|--|--|--|--:|--:|--:|--:|--:|--:|\n'
printf '%s\n' "$modes" >"$tmp/modes"
while read -r rc sh of ck; do
    [ "$(date +%s)" -lt "$deadline" ] || { echo "(deadline: the rest not run)"; break; }
    if ! plan "$rc $sh $of $ck" "$T"; then
        printf '| %s | %s | %s | %s | does not fit | | | | | |\n' "$rc" "$sh" "$of" "$ck"
        continue
    fi
    if run "$rc $sh $of $ck" "$T"; then
        awk -v a="$rc" -v b="$sh" -v c="$of" -v d="$ck" -v p="$plan_dev" -v e="${held:-0}" \
            -v h="${plan_host:-0}" -v r="$rss" -v t="${tps:-0}" 'BEGIN { G = 1073741824
            printf "| %s | %s | %s | %s | %.2f | %.2f | %s | %.2f | %.2f | %d |\n", a, b, c, d,
                p / G, e / G, (e > 0 ? sprintf("%.3f", p / e) : "-"), h / G, r / G, t }'
    else
        bad=1
        printf '| %s | %s | %s | %s | %.2f | run failed: %s | | | | |\n' "$rc" "$sh" "$of" "$ck" \
            "$(awk -v p="$plan_dev" 'BEGIN { print p / 1073741824 }')" \
            "$(grep -m 1 -iE 'error|memory' "$tmp/run" | cut -c1-80)"
    fi
done <"$tmp/modes"

# the longest T in the ALST mode: measured (two layers), planned (two
# layers, and llama3-8b's 32)
alst="layer gradients activations,optimizer bf16"
longest() { # [32]: the planner's longest T (doubling from 16K, up to 8M) for
    # the two layers, or with 32 for llama3-8b
    _lo=0
    _t=16384
    while [ "$_t" -le 8388608 ] && plan "$alst" "$_t" "${1:-}"; do
        _lo=$_t
        _t=$((_t * 2))
    done
    echo "$_lo"
}
ran=0
t=${DT_MEM_LONGEST_T0:-65536}
while [ "$(date +%s)" -lt "$deadline" ] && run "$alst" "$t"; do
    ran=$t
    t=$((t * 2))
done
printf '\nlongest T, recompute = layer, shard = gradients, offload = activations,optimizer, bf16 inputs:\n'
printf '  trained here (2 layers of the model, one GPU): %s%s\n' "$ran" \
    "$([ "$(date +%s)" -ge "$deadline" ] && echo ' (the time ran out before a failure)')"
printf '  planned for those 2 layers: %s\n' "$(longest)"
printf '  planned for llama3-8b (32 layers) on one %s: %s\n' "$gpu" "$(longest 32)"
exit "$bad"
