#!/bin/sh
# SPDX-License-Identifier: MIT
#
# recompute.sh: activation recomputation on the GPU (issue 17), run by
# tests/gpu/device.sh with the bundle of tests/gpu/bundle.sh.
# `dtengine train --device cuda --recompute layer` keeps each layer's input
# only and runs the layer's forward again before its backward: the same
# kernels on the same inputs, so its losses and parameters must equal the
# run that keeps every activation, to the bit (8 layers of width 1024 over
# 8192 tokens: 3.3 GB of kept activations without recompute, 0.3 GB of
# layer inputs with it; dt_model_gpu_train_bytes, spec/model.h).
# Prints ok/FAIL per check and "N passed, N failed".
#
# usage: sh tests/gpu/recompute.sh BUNDLEDIR WORKDIR   (LD_LIBRARY_PATH set by the caller)
. "$(dirname "$0")/checks.sh"
sha() { sed -n 's/^result: .*params_sha256=\([0-9a-f]*\) .*/\1/p' "$1"; }
tm="--model custom --dim 1024 --layers 8 --heads 8 --kv-heads 2 --ffn 2816 --vocab 4096"
tm="$tm --data recall --seq-len 8192 --seed 5 --steps 3 --device cuda"
for r in none layer; do
    # shellcheck disable=SC2086
    "$b/dtengine" train $tm --recompute $r >"$dir/$r.log" 2>&1 || {
        echo "  train --recompute $r: exit $?"
        sed 's/^/  | /' "$dir/$r.log" | tail -n 5
    }
    grep '^step ' "$dir/$r.log" | sed "s/^/  | $r: /"
done
a=$(sha "$dir/none.log") c=$(sha "$dir/layer.log")
ok=0
[ -n "$a" ] && [ "$a" = "$c" ] && ok=1
verdict "train --device cuda --recompute layer: parameters $c, without recompute $a" "$ok"
summary
