#!/bin/sh
# SPDX-License-Identifier: MIT
#
# hf.sh: a Hugging Face model on the GPU (issue 16), run by
# tests/gpu/device.sh with the bundle of tests/gpu/bundle.sh. hfgen writes
# a LlamaForCausalLM directory with dt's own writer (bf16 weights, LLaMA
# 3.1's rope_scaling, head dimension 64, which the CUDA kernels take;
# tests/fixtures/hf_llama's D = 8 they do not), then at positions from
# 1,000,000 (pos_offset: the angles the device builds from the host's
# double-double frequencies, llama3-scaled):
#   - prefill --init-from on the GPU (bf16) against the CPU (fp32): the loss
#     and the last logits, and the perplexity summary;
#   - train --init-from on the GPU against the CPU: every step's loss.
# Prints ok/FAIL per check and "N passed, N failed".
#
# usage: sh tests/gpu/hf.sh BUNDLEDIR WORKDIR   (LD_LIBRARY_PATH set by the caller)
. "$(dirname "$0")/checks.sh"
rm -rf "$dir/hf"
"$b/hfgen" "$dir/hf" --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --vocab 512 \
    --llama3 8,1,4,64 --dtype bf16 --seed 3 || exit 1
"$b/npytool" tokbin "$dir/tok.npy" --n 4097 --vocab 512 --seed 4 --format npy-i64 || exit 1
hm="--init-from $dir/hf --data $dir/tok.npy --pos-offset 1000000"
loss() { sed -n 's/^prefill: tokens=.* loss \([-0-9.e+]*\)$/\1/p' "$1"; }

rm -rf "$dir/pcpu" "$dir/pgpu"
# shellcheck disable=SC2086
"$b/dtengine" prefill $hm --seq-len 4096 --last 8 --out-dir "$dir/pcpu" >"$dir/pcpu.log" 2>&1 ||
    { sed 's/^/  | /' "$dir/pcpu.log"; exit 1; }
# shellcheck disable=SC2086
"$b/dtengine" prefill $hm --seq-len 4096 --last 8 --out-dir "$dir/pgpu" --device cuda \
    >"$dir/pgpu.log" 2>&1
rc=$?
grep -E '^perplexity|^  \[' "$dir/pgpu.log" | sed 's/^/  | /'
lc=$(loss "$dir/pcpu.log") lg=$(loss "$dir/pgpu.log")
err=$("$b/npytool" maxerr "$dir/pgpu/logits.npy" "$dir/pcpu/logits.npy" 2>/dev/null)
ok=0
[ "$rc" = 0 ] && "$b/npytool" cmp "$dir/pgpu/logits.npy" "$dir/pcpu/logits.npy" --atol 3e-2 \
    --rtol 3e-2 >/dev/null &&
    awk -v a="$lg" -v c="$lc" 'BEGIN { d = (a - c) / c; if (d < 0) d = -d; exit !(a != "" && d <= 3e-2) }' &&
    [ -s "$dir/pgpu/perplexity.json" ] && ok=1
verdict "prefill --init-from (bf16, llama3 rope, D 64) at 1,000,000 on the GPU: loss $lg (CPU $lc), logits max err $err (<= 3e-2)" "$ok"

tm="$hm --seq-len 2048 --steps 3 --lr 1e-3"
# shellcheck disable=SC2086
"$b/dtengine" train $tm >"$dir/tcpu.log" 2>&1 || { sed 's/^/  | /' "$dir/tcpu.log"; exit 1; }
# shellcheck disable=SC2086
"$b/dtengine" train $tm --device cuda >"$dir/tgpu.log" 2>&1
rc=$?
grep '^step ' "$dir/tgpu.log" | sed 's/^/  | /'
grep '^step ' "$dir/tgpu.log" >"$dir/tgpu.steps"
grep '^step ' "$dir/tcpu.log" >"$dir/tcpu.steps"
worst=$(paste "$dir/tgpu.steps" "$dir/tcpu.steps" | awk '
    { g = $4; c = $(NF / 2 + 4); d = (g - c) / c; if (d < 0) d = -d; if (d > w) w = d; n++ }
    END { if (n == 3) printf "%.2e", w }')
ok=$(awk -v w="$worst" -v r="$rc" 'BEGIN { print (r == 0 && w != "" && w <= 1e-2) ? 1 : 0 }')
verdict "train --init-from at 1,000,000 on the GPU: 3 step losses within ${worst:-?} of the CPU's (<= 1e-2)" "$ok"
summary
