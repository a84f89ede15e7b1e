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
# cuda` (bf16, fp16) against the CPU prefill: loss and last logits; and
# `dtengine train --device cuda` against the CPU training: every step's
# loss, the parameters, its checkpoints (resumed on the GPU to the bit, on
# the CPU within the tolerance). Prints ok/FAIL per check and
# "N passed, N failed".
#
# usage: sh tests/gpu/e2e.sh BUNDLEDIR WORKDIR   (LD_LIBRARY_PATH set by the caller)
. "$(dirname "$0")/checks.sh"
for causal in --no-causal --causal "--causal --segments 256,2048 --dilations 1,4"; do
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
            echo "FAIL dtengine --device cuda --dtype $dt ${causal}: exit $?"
            failed=$((failed + 1))
            continue
        }
        for x in o lse dq dk dv; do
            case $x in o) tol=$ao ;; lse) tol=$al ;; *) tol=$ag ;; esac
            err=$("$b/npytool" maxerr "$dir/gpu/$x.0.npy" "$dir/cpu/$x.0.npy")
            what="dtengine --device cuda --dtype $dt ${causal} $x vs CPU fp32"
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
# prefill checkpoints on the GPU: copied off the device while the next layer
# runs (copy_stall); a prefill stopped after layer 2 and resumed there on
# the GPU gives the uninterrupted run's logits to the bit
rm -rf "$dir/pck" "$dir/pres"
# shellcheck disable=SC2086
"$b/dtengine" prefill $pm --out-dir "$dir/pgpu" --device cuda --ckpt-dir "$dir/pck" \
    --ckpt-every 1 --stop-after-layer 2 >"$dir/pck.log" 2>&1
# shellcheck disable=SC2086
"$b/dtengine" prefill $pm --out-dir "$dir/pres" --device cuda --ckpt-dir "$dir/pck" \
    --ckpt-every 1 --resume >"$dir/pres.log" 2>&1
"$b/dtengine" prefill $pm --out-dir "$dir/pgpu" --device cuda >"$dir/pgpu.log" 2>&1
ok=0
grep -q '^checkpoint layer 1 copy_stall [0-9.]*$' "$dir/pck.log" &&
    cmp -s "$dir/pres/logits.npy" "$dir/pgpu/logits.npy" && ok=1
if [ "$ok" = 1 ]; then
    echo "ok   prefill --device cuda: checkpoints copied during the next layer; resumed at layer 2, the same logits"
    passed=$((passed + 1))
else
    echo "FAIL prefill --device cuda: checkpoint copy or resume at layer 2"
    sed 's/^/  | /' "$dir/pck.log" "$dir/pres.log" | tail -n 20
    failed=$((failed + 1))
fi

# train --device cuda (the whole step on the GPU) against the CPU path: the
# same model, 2048 tokens, 4 steps; every step's loss and the trained
# parameters; then the checkpoints: copied off the device during the next
# step (copy_stall), a resume on the GPU equal to the uninterrupted run to
# the bit, a GPU checkpoint resumed on the CPU
tm="--model custom --dim 512 --layers 3 --heads 4 --kv-heads 2 --ffn 1024 --vocab 512"
tm="$tm --data recall --seq-len 2048 --seed 5 --steps 4"
rm -rf "$dir/tcpu.npy"
# shellcheck disable=SC2086
"$b/dtengine" train $tm --params-out "$dir/tcpu.npy" >"$dir/tcpu.log" || exit 1
for dt in bf16 fp16; do
    case $dt in bf16) tol=1e-2 ;; fp16) tol=5e-3 ;; esac
    rm -rf "$dir/tgpu.npy" "$dir/tck"
    # shellcheck disable=SC2086
    "$b/dtengine" train $tm --params-out "$dir/tgpu.npy" --device cuda --dtype "$dt" \
        --ckpt-dir "$dir/tck" --ckpt-every 2 >"$dir/tgpu.log" 2>&1 || {
        echo "FAIL train --device cuda --dtype $dt: exit $?"
        sed 's/^/  | /' "$dir/tgpu.log"
        failed=$((failed + 1))
        continue
    }
    grep '^step \|^checkpoint ' "$dir/tgpu.log" | sed 's/^/  | /'
    # the loss is the 4th field of each step line (fp16's lines add a
    # loss_scale field, so the two sides differ in width)
    awk '$1 == "step" { print $4 }' "$dir/tgpu.log" >"$dir/tgpu.steps"
    awk '$1 == "step" { print $4 }' "$dir/tcpu.log" >"$dir/tcpu.steps"
    worst=$(paste "$dir/tgpu.steps" "$dir/tcpu.steps" | awk '
        NF != 2 { w = "inf"; exit }
        { d = ($1 - $2) / $2; if (d < 0) d = -d; if (d > w) w = d }
        END { if (w == "inf") print w; else printf "%.2e", w }')
    ok=$(awk -v w="$worst" -v t="$tol" 'BEGIN { print (w != "" && w <= t) ? 1 : 0 }')
    verdict "train --device cuda --dtype $dt: losses within $worst of the CPU's (<= $tol)" "$ok"
    err=$("$b/npytool" maxerr "$dir/tgpu.npy" "$dir/tcpu.npy")
    ok=0
    "$b/npytool" cmp "$dir/tgpu.npy" "$dir/tcpu.npy" --atol "$tol" --rtol "$tol" >/dev/null && ok=1
    verdict "train --device cuda --dtype $dt: parameters max err $err (<= $tol)" "$ok"
    ok=0
    grep -q '^checkpoint step 2 .* copy_stall [0-9.]*$' "$dir/tgpu.log" && ok=1
    verdict "train --device cuda --dtype $dt: checkpoint copied during the next step" "$ok"
    [ "$dt" = bf16 ] || continue
    # shellcheck disable=SC2086
    "$b/dtengine" train $tm --params-out "$dir/tre.npy" --device cuda --ckpt-dir "$dir/tre" \
        --ckpt-every 2 --resume-from "$dir/tck/step-00000002" >"$dir/tre.log" 2>&1
    a=$(sed -n 's/^result: .*params_sha256=\([0-9a-f]*\) .*/\1/p' "$dir/tgpu.log")
    r=$(sed -n 's/^result: .*params_sha256=\([0-9a-f]*\) .*/\1/p' "$dir/tre.log")
    ok=0
    [ -n "$a" ] && [ "$a" = "$r" ] && ok=1
    verdict "train --device cuda: resumed at step 2 on the GPU: $r, uninterrupted $a" "$ok"
    # shellcheck disable=SC2086
    "$b/dtengine" train $tm --params-out "$dir/tgc.npy" --ckpt-dir "$dir/tgc" --ckpt-every 2 \
        --resume-from "$dir/tck/step-00000002" >"$dir/tgc.log" 2>&1
    err=$("$b/npytool" maxerr "$dir/tgc.npy" "$dir/tcpu.npy")
    ok=0
    "$b/npytool" cmp "$dir/tgc.npy" "$dir/tcpu.npy" --atol "$tol" --rtol "$tol" >/dev/null && ok=1
    verdict "train: a GPU checkpoint resumed on the CPU: parameters max err $err (<= $tol)" "$ok"
done
summary
