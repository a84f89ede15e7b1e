#!/bin/sh
# SPDX-License-Identifier: MIT
#
# train_gpu.sh: training speed on one GPU, dt against PyTorch side by side
# in one run: `dtengine train --device cuda` (bf16 compute, fp32 master
# weights and AdamW state, the whole step on the device) and Hugging Face
# transformers' LlamaForCausalLM with SDPA under bf16 autocast, the same
# recipe (bench/train_torch.py), for the same shapes on the same GPU, and
# the same model torch.compile'd where the node's PyTorch has it
# (DT_BENCH_COMPILE=0 leaves it out), and dt again with the backward
# nondeterministic (--no-deterministic, the job key deterministic = no;
# DT_BENCH_NONDET=0 leaves it out). Prints a markdown table: tokens/s per
# GPU, step time and model FLOP/s utilisation (MFU) of each, and dt /
# PyTorch. Asserts nothing.
#
# Shapes (one sequence of T tokens per step, one GPU, ring of 1):
#   small  dim 512, 4 layers, 8/4 heads (D = 64), ffn 1536, vocab 32000
#   1b     the LLaMA-3.2-1B shape untied: dim 2048, 16 layers, 32/8 heads,
#          ffn 8192, vocab 128256 (1.50 G parameters)
# at T = 16384 (DT_BENCH_T). `tiny` (D = 32) is not among them: the CUDA
# attention kernels take D = 64 or 128.
#
# Model FLOPs per token, as bench/train.sh counts them: 6 N for the N matrix
# parameters (every projection and the LM head) plus causal attention,
# 3.5 * 4 D H (T + 1) / 2 per layer. MFU divides by the GPU's dense bf16
# peak from its datasheet (H100 and H200 SXM: 989.4 TFLOP/s).
#
# usage: bench/train_gpu.sh [--quick] DTENGINE
#   --quick: 3 steps a shape instead of 5 (step 0 is dropped as warm-up)
# Environment: DT_BENCH_T (default 16384), DT_BENCH_SHAPES (default
# "small 1b"), DT_BENCH_BUDGET (seconds for everything, default 420; a
# program is killed at its share), PYTHON (default python3).
# Exit: 0; 1 when a program failed; 2 usage.
set -u

steps=5
dtengine=
for a in "$@"; do
    case $a in
    --quick) steps=3 ;;
    -*)
        echo "usage: bench/train_gpu.sh [--quick] DTENGINE" >&2
        exit 2
        ;;
    *) dtengine=$a ;;
    esac
done
[ -n "$dtengine" ] && [ -x "$dtengine" ] || {
    echo "usage: bench/train_gpu.sh [--quick] DTENGINE (an executable dtengine built with CUDA)" >&2
    exit 2
}
srcdir=$(cd "$(dirname "$0")/.." && pwd) || exit 1
python=${PYTHON:-python3}
T=${DT_BENCH_T:-16384}
shapes=${DT_BENCH_SHAPES:-"small 1b"}
budget=${DT_BENCH_BUDGET:-420}
t0=$(date +%s)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dt-trainbench.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
case $gpu in
*H100* | *H200*) peak=989.4 ;;
*) peak= ;;
esac

# shape NAME: its dim layers heads kv_heads ffn vocab
shape() {
    case $1 in
    small) echo 512 4 8 4 1536 32000 ;;
    1b) echo 2048 16 32 8 8192 128256 ;;
    *) return 1 ;;
    esac
}

# left: seconds of the budget still unspent
left() { echo $((budget - ($(date +%s) - t0))); }

# run_dt TAG LOG [OPTION...]: dtengine train on the shape (d L H Hkv f V
# set), killed after $lim s; tps: its tokens/s over the steps after step 0
# (tokens / summed step time), or - (status 1) when it failed
run_dt() {
    tag=$1 log=$2
    shift 2
    timeout "$lim" "$dtengine" train --model custom --dim "$d" --layers "$L" --heads "$H" \
        --kv-heads "$Hkv" --ffn "$f" --vocab "$V" --seq-len "$T" --steps "$steps" --warmup 1 \
        --lr 3e-4 --device cuda --dtype bf16 "$@" >"$log" 2>&1
    rc=$?
    grep -E '^(train|step|result)' "$log" | sed "s/^/  $tag | /"
    if [ "$rc" -ne 0 ]; then
        echo "  $tag | exit $rc:"
        tail -n 5 "$log" | sed "s/^/  $tag | /"
        tps=- status=1
    else
        tps=$(awk -v T="$T" '/^step / && $2 > 0 { n++; s += T / $6 }
            END { if (n) printf "%.1f", n * T / s; else print "-" }' "$log")
    fi
}

status=0
rows=
for s in $shapes; do
    set -- $(shape "$s") || {
        echo "bench/train_gpu.sh: unknown shape $s (small, 1b)" >&2
        exit 2
    }
    d=$1 L=$2 H=$3 Hkv=$4 f=$5 V=$6
    D=$((d / H))
    flops=$(awk -v d="$d" -v L="$L" -v H="$H" -v Hkv="$Hkv" -v f="$f" -v V="$V" -v T="$T" \
        'BEGIN { D = d / H; n = L * (2 * d * H * D + 2 * d * Hkv * D + 3 * d * f) + V * d
                 printf "%.6e", 6 * n + L * 3.5 * 4 * D * H * (T + 1) / 2 }')
    lim=$(($(left) / 3))
    [ "$lim" -ge 30 ] || lim=30
    echo "== $s: dim $d, $L layers, $H/$Hkv heads, ffn $f, vocab $V, T $T ($lim s each)"
    run_dt dt "$tmp/dt.log"
    dt_tps=$tps
    nd_tps=-
    if [ "${DT_BENCH_NONDET:-1}" != 0 ]; then
        lim=$(($(left) / 3))
        [ "$lim" -ge 30 ] || lim=30
        run_dt "dt nondet" "$tmp/nd.log" --no-deterministic
        nd_tps=$tps
    fi
    lim=$(($(left) - 10))
    [ "$lim" -ge 30 ] || lim=30
    timeout "$lim" "$python" "$srcdir/bench/train_torch.py" --name "$s" --dim "$d" \
        --layers "$L" --heads "$H" --kv-heads "$Hkv" --ffn "$f" --vocab "$V" --seq-len "$T" \
        --steps "$steps" >"$tmp/torch.log" 2>&1
    rc=$?
    sed 's/^/  torch | /' "$tmp/torch.log" | tail -n 5
    pt_tps=$(awk '$1 == "ROW" { print ($5 ~ /^[0-9.]+$/) ? $5 : "-" }' "$tmp/torch.log")
    pt_peak=$(awk '$1 == "ROW" && $5 ~ /^[0-9.]+$/ { print $7 }' "$tmp/torch.log")
    [ -n "$pt_tps" ] || { pt_tps=- status=1; }
    pc_tps=-
    if [ "${DT_BENCH_COMPILE:-1}" != 0 ]; then
        lim=$(($(left) - 10))
        [ "$lim" -ge 30 ] || lim=30
        timeout "$lim" "$python" "$srcdir/bench/train_torch.py" --name "$s" --dim "$d" \
            --layers "$L" --heads "$H" --kv-heads "$Hkv" --ffn "$f" --vocab "$V" \
            --seq-len "$T" --steps "$steps" --compile >"$tmp/torchc.log" 2>&1
        sed 's/^/  torch.compile | /' "$tmp/torchc.log" | tail -n 3
        pc_tps=$(awk '$1 == "ROW" { print ($5 ~ /^[0-9.]+$/) ? $5 : "-" }' "$tmp/torchc.log")
        [ -n "$pc_tps" ] || pc_tps=-
    fi
    kern=$(sed -n 's/.*gpu attn_kernel=\([^ ]*\).*/\1/p' "$tmp/dt.log" | head -n 1)
    rows="$rows
$(awk -v s="$s" -v T="$T" -v a="$dt_tps" -v b="$pt_tps" -v fl="$flops" -v pk="$peak" \
        -v pm="${pt_peak:--}" -v c="$pc_tps" -v kn="${kern:-?}" -v n="$nd_tps" '
        function mfu(x) {
            if (x == "-" || pk == "") return "-"
            return sprintf("%.1f%%", 100 * x * fl / (pk * 1e12))
        }
        function ratio(x, y) { return (x != "-" && y != "-") ? sprintf("%.2f", x / y) : "-" }
        BEGIN { printf "| %s | %d | %.1f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" \
                    " %s | %s | %s |", s, T, fl / 1e9, kn, a, mfu(a), n, mfu(n), b, mfu(b),
                    pm, ratio(a, b), ratio(n, b), c, mfu(c), ratio(a, c) }')"
done

echo
echo "## training on one GPU: dt against PyTorch (same run)"
echo
echo "GPU: ${gpu:-unknown}; peak bf16 ${peak:-unknown} TFLOP/s (datasheet, dense)"
echo "dt: dtengine train --device cuda --dtype bf16; PyTorch: transformers LlamaForCausalLM, SDPA, bf16 autocast, fused AdamW"
echo "both: fp32 master weights and AdamW state, clipping 1.0, one sequence a step; $steps steps, step 0 dropped"
echo
echo "dt nondet: the same with --no-deterministic (the job key deterministic = no: cuDNN's fastest, nondeterministic backward, as PyTorch's)"
echo
echo "| shape | T | GFLOP/token | dt attention kernel | dt tokens/s | dt MFU | dt nondet tokens/s | dt nondet MFU | PyTorch tokens/s | PyTorch MFU | PyTorch peak GiB | dt / PyTorch | dt nondet / PyTorch | compiled tokens/s | compiled MFU | dt / compiled |"
echo "|---|---:|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
echo "$rows" | sed '/^$/d'
exit "$status"
