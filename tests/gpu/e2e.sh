#!/bin/sh
# SPDX-License-Identifier: MIT
#
# e2e.sh: `dtengine attn --device cuda` end to end on a GPU node, run by
# tests/gpu/device.sh with the engine and its libraries from
# tests/gpu/bundle.sh. The same generated inputs (T=2048, H=8, Hkv=2,
# D=128; causal and not, dense and dilated; forward and backward) run on
# the GPU (bf16 and fp16) and on the CPU (fp32), and npytool compares every
# output. The tolerances cover rounding the inputs to bf16 / fp16 on the
# way to the device; the kernels' own accuracy against the double-precision
# reference is what test_attn_cuda checks. Then `dtengine prefill --device
# cuda` (bf16, fp16) against the CPU prefill: loss and last logits. Prints
# ok/FAIL per output and
# "N passed, N failed".
#
# usage: sh tests/gpu/e2e.sh BUNDLEDIR WORKDIR   (LD_LIBRARY_PATH set by the caller)
set -u
[ $# -eq 2 ] || {
    echo "usage: sh tests/gpu/e2e.sh BUNDLEDIR WORKDIR" >&2
    exit 2
}
b=$1 dir=$2
mkdir -p "$dir" || exit 1
passed=0
failed=0
for causal in "" --causal "--causal --segments 256,2048 --dilations 1,4"; do
    gen="--generate 2048,8,2,128 --seed 5 $causal --backward"
    rm -rf "$dir/cpu"
    # shellcheck disable=SC2086
    "$b/dtengine" attn $gen --out-dir "$dir/cpu" || exit 1
    for dt in bf16 fp16; do
        case $dt in
        bf16) ao=3e-2 al=1e-2 ag=5e-2 ;;
        fp16) ao=5e-3 al=2e-3 ag=1e-2 ;;
        esac
        rm -rf "$dir/gpu"
        # shellcheck disable=SC2086
        "$b/dtengine" attn $gen --out-dir "$dir/gpu" --device cuda --dtype "$dt" --stats || {
            echo "FAIL dtengine --device cuda --dtype $dt ${causal:-(not causal)}: exit $?"
            failed=$((failed + 1))
            continue
        }
        for x in o lse dq dk dv; do
            case $x in o) tol=$ao ;; lse) tol=$al ;; *) tol=$ag ;; esac
            err=$("$b/npytool" maxerr "$dir/gpu/$x.0.npy" "$dir/cpu/$x.0.npy")
            what="dtengine --device cuda --dtype $dt ${causal:-(not causal)} $x vs CPU fp32"
            if "$b/npytool" cmp "$dir/gpu/$x.0.npy" "$dir/cpu/$x.0.npy" --atol "$tol" \
                >/dev/null; then
                echo "ok   $what: max err $err <= $tol"
                passed=$((passed + 1))
            else
                echo "FAIL $what: max err $err > $tol"
                failed=$((failed + 1))
            fi
        done
    done
done
# prefill --device cuda (the model forward on the GPU) against the CPU path:
# a 3-layer model with D = 128 over 4096 tokens, the loss and last 8 logits
pm="--model custom --dim 512 --layers 3 --heads 4 --kv-heads 2 --ffn 1024 --vocab 512"
pm="$pm --data recall --seq-len 4096 --seed 5 --last 8"
rm -rf "$dir/pcpu"
# shellcheck disable=SC2086
"$b/dtengine" prefill $pm --out-dir "$dir/pcpu" >"$dir/pcpu.log" || exit 1
lc=$(sed -n 's/^prefill: tokens=.* loss \([-0-9.e+]*\)$/\1/p' "$dir/pcpu.log")
for dt in bf16 fp16; do
    case $dt in bf16) tol=3e-2 ;; fp16) tol=5e-3 ;; esac
    rm -rf "$dir/pgpu"
    # shellcheck disable=SC2086
    "$b/dtengine" prefill $pm --out-dir "$dir/pgpu" --device cuda --dtype "$dt" \
        >"$dir/pgpu.log" 2>&1 || {
        echo "FAIL prefill --device cuda --dtype $dt: exit $?"
        sed 's/^/  | /' "$dir/pgpu.log"
        failed=$((failed + 1))
        continue
    }
    lg=$(sed -n 's/^prefill: tokens=.* loss \([-0-9.e+]*\)$/\1/p' "$dir/pgpu.log")
    err=$("$b/npytool" maxerr "$dir/pgpu/logits.npy" "$dir/pcpu/logits.npy")
    what="prefill --device cuda --dtype $dt: loss $lg (CPU $lc), logits max err $err"
    if "$b/npytool" cmp "$dir/pgpu/logits.npy" "$dir/pcpu/logits.npy" --atol "$tol" \
        --rtol "$tol" >/dev/null &&
        awk -v a="$lg" -v b="$lc" -v t="$tol" \
            'BEGIN { d = (a - b) / b; if (d < 0) d = -d; exit !(a != "" && d <= t) }'; then
        echo "ok   $what <= $tol"
        passed=$((passed + 1))
    else
        echo "FAIL $what > $tol"
        failed=$((failed + 1))
    fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
