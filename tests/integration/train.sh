#!/bin/sh
# SPDX-License-Identifier: MIT
#
# dtengine train on real ranks under mpirun, small sequences (T=256) of the
# recall task with the tiny model:
#   - a run interrupted after step 3 and resumed logs exactly the losses of
#     the uninterrupted run and ends with bit-identical parameters (R=1 and
#     R=4);
#   - 4 ranks give the losses of 1 rank within 1e-5 relative;
#   - after one update the parameters of 4 ranks (zigzag and contiguous)
#     equal those of 1 rank within 1e-5;
#   - a checkpoint written by 4 ranks resumes on 2, losses within 1e-5 of
#     the 4-rank run;
#   - a corrupt newest checkpoint is skipped (with a message) for the one
#     before it;
#   - --ckpt-commit external: nothing is pruned, --resume takes only a
#     checkpoint with a COMMITTED marker (written here by hand, as the
#     coordinator would), and then resumes exactly;
#   - --resume-from DIR resumes from exactly DIR, bit-identical; a corrupt
#     DIR is exit 1 naming the shard;
#   - llm.c token shards: resume is exact; the same tokens as .npy token
#     ids (int32 and int64) give exactly the same losses and parameters;
#   - the result line carries the last step's loss;
#   - bad options are refused with exit 2.
. "$(dirname "$0")/lib.sh"
need_mpirun

STEPS=6
train() { # R DIR [ARGS...]: log of a run
    _r=$1
    _d=$2
    shift 2
    mpirun_np "$_r" "$DTENGINE" train --model tiny --data recall --seq-len 256 --steps $STEPS \
        --ckpt-dir "$_d" --ckpt-every 3 --seed 5 "$@"
}
steps() { grep '^step ' "$1" | awk '{ print $2, $4 }'; }
sha() { sed -n 's/^result: .*params_sha256=\([0-9a-f]*\).*/\1/p' "$1"; }

# same_losses A B TOL: step lines agree within relative TOL (0: exactly)
same_losses() {
    steps "$1" >"$TMPD/a.txt"
    steps "$2" >"$TMPD/b.txt"
    [ -s "$TMPD/b.txt" ] || { echo "no step lines in $2"; return 1; }
    awk -v tol="$3" 'NR == FNR { l[$1] = $2; next }
        !($1 in l) { print "step " $1 " missing"; bad = 1; next }
        { d = l[$1] - $2; if (d < 0) d = -d; r = d / (l[$1] < 0 ? -l[$1] : l[$1]);
          if ((tol == 0 && l[$1] != $2) || r > tol) { print "step " $1 ": " l[$1] " vs " $2; bad = 1 }
          if (r > worst) worst = r }
        END { if (!bad) printf "worst relative difference %.3g\n", worst; exit bad }' \
        "$TMPD/a.txt" "$TMPD/b.txt"
}

for R in 1 4; do
    train $R "$TMPD/full$R" >"$TMPD/full$R.log" 2>&1
    check "R=$R: $STEPS steps with checkpoints at 3 and 6" \
        test -d "$TMPD/full$R/step-00000003" -a -d "$TMPD/full$R/step-00000006"
    mkdir -p "$TMPD/part$R"
    cp -r "$TMPD/full$R/step-00000003" "$TMPD/part$R/"
    train $R "$TMPD/part$R" --resume >"$TMPD/resumed$R.log" 2>&1
    check "R=$R: resumed run says where it resumed" grep -q 'resuming from .*step-00000003' \
        "$TMPD/resumed$R.log"
    check "R=$R: resume logs exactly the uninterrupted losses" \
        same_losses "$TMPD/full$R.log" "$TMPD/resumed$R.log" 0
    check "R=$R: resume ends with bit-identical parameters" \
        test "$(sha "$TMPD/full$R.log")" = "$(sha "$TMPD/resumed$R.log")" -a -n "$(sha "$TMPD/full$R.log")"
done

check "R=4 losses equal R=1 losses within 1e-5" \
    same_losses "$TMPD/full1.log" "$TMPD/full4.log" 1e-5
# the parameters after one update (no warm-up, so the full learning rate)
one_step() { # R NPY [ARGS...]
    _r=$1
    _o=$2
    shift 2
    mpirun_np "$_r" "$DTENGINE" train --model tiny --data recall --seq-len 256 --steps 1 \
        --warmup 0 --seed 5 --params-out "$_o" "$@" >"$_o.log" 2>&1
}
one_step 1 "$TMPD/one1.npy"
one_step 4 "$TMPD/one4z.npy" --layout zigzag
one_step 4 "$TMPD/one4c.npy" --layout contiguous
check "one update: R=4 zigzag parameters equal R=1 within 1e-5" \
    "$NPYTOOL" cmp "$TMPD/one4z.npy" "$TMPD/one1.npy" --atol 1e-5
check "one update: R=4 contiguous parameters equal R=1 within 1e-5" \
    "$NPYTOOL" cmp "$TMPD/one4c.npy" "$TMPD/one1.npy" --atol 1e-5
# the parameters barely moved from their initialisation: one step at a
# millionth of the learning rate (warm-up over a million steps)
mpirun_np 1 "$DTENGINE" train --model tiny --seq-len 256 --steps 1 --warmup 1000000 --seed 5 \
    --params-out "$TMPD/init.npy" >/dev/null 2>&1
check "one update: the comparison can fail (the update moved parameters by more than 1e-5)" \
    sh -c "[ -s '$TMPD/init.npy' ] && ! '$NPYTOOL' cmp '$TMPD/one1.npy' '$TMPD/init.npy' --atol 1e-5 >/dev/null 2>&1"

mkdir -p "$TMPD/reshard"
cp -r "$TMPD/full4/step-00000003" "$TMPD/reshard/"
train 2 "$TMPD/reshard" --resume >"$TMPD/reshard.log" 2>&1
check "a 4-rank checkpoint resumes on 2 ranks" grep -q 'written by 4 ranks' "$TMPD/reshard.log"
check "resharded run matches the 4-rank run within 1e-5" \
    same_losses "$TMPD/full4.log" "$TMPD/reshard.log" 1e-5

# the result line ends with the loss of the last step, as printed there
result_loss() { # LOG: "result loss = last step loss", or fail
    _rl=$(sed -n 's/^result: .* loss=\([^ ]*\)$/\1/p' "$1")
    _sl=$(grep '^step ' "$1" | tail -n 1 | awk '{ print $4 }')
    [ -n "$_rl" ] && [ "$_rl" = "$_sl" ] || { echo "result loss '$_rl', last step loss '$_sl'"; return 1; }
    echo "loss=$_rl"
}
check "the result line has the last step's loss" result_loss "$TMPD/full1.log"
check "the result line still has params_sha256" test -n "$(sha "$TMPD/full4.log")"

# --ckpt-commit external: the engine writes, the coordinator commits (the
# COMMITTED marker) and prunes
train 1 "$TMPD/ext" --ckpt-commit external --ckpt-keep 1 >"$TMPD/ext.log" 2>&1
check "external: nothing pruned (--ckpt-keep 1, both checkpoints there)" \
    test -d "$TMPD/ext/step-00000003" -a -d "$TMPD/ext/step-00000006"
check "external: no COMMITTED marker written by the engine" \
    test ! -e "$TMPD/ext/step-00000003/COMMITTED" -a ! -e "$TMPD/ext/step-00000006/COMMITTED"
check "external: the same run as self commit" \
    test "$(sha "$TMPD/ext.log")" = "$(sha "$TMPD/full1.log")" -a -n "$(sha "$TMPD/ext.log")"
train 1 "$TMPD/ext" --ckpt-commit external --resume >"$TMPD/ext-nomark.log" 2>&1
check "external: --resume takes no checkpoint without a COMMITTED marker" \
    sh -c "grep -q 'start=0' '$TMPD/ext-nomark.log' && ! grep -q 'resuming from' '$TMPD/ext-nomark.log'"
check "external: and says why for each" \
    grep -q 'skipping checkpoint .*step-00000003: .*no COMMITTED marker' "$TMPD/ext-nomark.log"
# the marker holds the manifest's SHA-256 (dt_ckpt_mark_committed)
(cd "$TMPD/ext/step-00000003" && sha256sum manifest.json | cut -d ' ' -f 1 >COMMITTED) ||
    die "cannot write the COMMITTED marker"
train 1 "$TMPD/ext" --ckpt-commit external --resume >"$TMPD/ext-marked.log" 2>&1
echo "exit $?" >>"$TMPD/ext-marked.log"
check "external: --resume takes the committed step 3 over the uncommitted step 6" \
    grep -q 'resuming from .*step-00000003' "$TMPD/ext-marked.log"
check "external: resume logs exactly the uninterrupted losses" \
    same_losses "$TMPD/full1.log" "$TMPD/ext-marked.log" 0
check "external: resume ends with bit-identical parameters" \
    test "$(sha "$TMPD/full1.log")" = "$(sha "$TMPD/ext-marked.log")"
check "external: the uncommitted step 6 ahead is written again, and the run succeeds" \
    sh -c "grep -q 'step-00000006 was never committed: writing it again' '$TMPD/ext-marked.log' &&
        grep -q '^exit 0' '$TMPD/ext-marked.log'"

# --resume-from DIR: exactly that step directory (4 ranks' checkpoint, 4 ranks)
train 4 "$TMPD/rfrom" --resume-from "$TMPD/full4/step-00000003" >"$TMPD/rfrom.log" 2>&1
check "--resume-from: resumes from the directory given" \
    grep -q "resuming from $TMPD/full4/step-00000003 " "$TMPD/rfrom.log"
check "--resume-from: logs exactly the uninterrupted losses" \
    same_losses "$TMPD/full4.log" "$TMPD/rfrom.log" 0
check "--resume-from: ends with bit-identical parameters" \
    test "$(sha "$TMPD/full4.log")" = "$(sha "$TMPD/rfrom.log")"
mkdir -p "$TMPD/rfbad"
cp -r "$TMPD/full4/step-00000003" "$TMPD/rfbad/"
corrupt_bytes "$TMPD/rfbad/step-00000003/shard-00002-of-00004.safetensors" 200 ||
    die "cannot corrupt the copy of step 3"
bad_resume_from() {
    "$DTENGINE" train --model tiny --data recall --seq-len 256 --steps $STEPS --seed 5 \
        --resume-from "$TMPD/rfbad/step-00000003" >"$TMPD/rfbad.out" 2>&1
    _rc=$?
    [ $_rc -eq 6 ] || { echo "exit $_rc"; cat "$TMPD/rfbad.out"; return 1; }
    grep -q -- '--resume-from: .*shard-00002-of-00004.safetensors' "$TMPD/rfbad.out" ||
        { cat "$TMPD/rfbad.out"; return 1; }
}
check "--resume-from a corrupt checkpoint: exit 6 (the checkpoint does not verify), naming the shard" bad_resume_from

# A bad newest checkpoint: the resume falls back to step 3, sets step 6
# aside (step-00000006.corrupt, .corrupt.2, ...) and writes it again, with
# the uninterrupted run's parameters; a retry resumes from the new step 6.
# Three ways to be bad: a flipped byte (sha256 mismatch), a manifest whose
# sha256 is not the shard's, a shard cut short with the manifest resealed
# to match it (size and sha256 agree; the safetensors header does not).
resume6() { # NAME: resume full1 up to step 6; the log and exit status in NAME.log
    train 1 "$TMPD/full1" --resume --steps 6 >"$TMPD/$1.log" 2>&1
    echo "exit $?" >>"$TMPD/$1.log"
}
shard=$(ls "$TMPD/full1/step-00000006"/shard-*.safetensors | head -n 1)
manifest=$TMPD/full1/step-00000006/manifest.json
# reseal: the manifest records the shard as it is now (R=1: one record)
reseal() {
    _sz=$(wc -c <"$shard" | tr -d ' ')
    _sum=$(sha256sum "$shard" | cut -d ' ' -f 1)
    sed -i "s/\"bytes\": [0-9]*/\"bytes\": $_sz/; s/\"sha256\": \"[0-9a-f]*\"/\"sha256\": \"$_sum\"/" \
        "$manifest"
}
fell_back() { # NAME ASIDE: skipped 6, resumed from 3, set 6 aside as ASIDE, exit 0, same result
    grep -q 'skipping checkpoint .*step-00000006' "$TMPD/$1.log" &&
        grep -q 'resuming from .*step-00000003' "$TMPD/$1.log" &&
        grep -q "moved aside to .*/$2 " "$TMPD/$1.log" && test -d "$TMPD/full1/$2" &&
        grep -q '^exit 0' "$TMPD/$1.log" && test -d "$TMPD/full1/step-00000006" &&
        test "$(sha "$TMPD/$1.log")" = "$(sha "$TMPD/full1.log")" ||
        { cat "$TMPD/$1.log"; return 1; }
}
corrupt_bytes "$shard" 200 || die "cannot corrupt step 6"
resume6 corrupt
check "a corrupt newest checkpoint is skipped with a message" \
    grep -q 'skipping checkpoint .*step-00000006: .*sha256' "$TMPD/corrupt.log"
check "and the run resumes from the one before it, rewrites step 6 and succeeds" \
    fell_back corrupt step-00000006.corrupt
resume6 retry
check "a retry resumes from the rewritten step 6" \
    sh -c "grep -q 'resuming from .*step-00000006 ' '$TMPD/retry.log' && grep -q '^exit 0' '$TMPD/retry.log'"
# the recorded sha256 with every hex digit changed (0 -> 1, ..., f -> 0)
sum6=$(sed -n 's/.*"sha256": "\([0-9a-f]\{64\}\)".*/\1/p' "$manifest" | head -n 1)
cp "$manifest" "$TMPD/manifest6"
[ -n "$sum6" ] && sed -i "s/$sum6/$(echo "$sum6" | tr 0-9a-f 1-9a-f0)/" "$manifest" &&
    ! cmp -s "$manifest" "$TMPD/manifest6" || die "cannot change the sha256 in $manifest"
resume6 badsum
check "a manifest whose sha256 is not the shard's: skipped, rewritten, exit 0" \
    fell_back badsum step-00000006.corrupt.2
shorten_file "$shard" 4096 && reseal || die "cannot cut $shard to 4096 bytes"
resume6 cut
cut_fell_back() {
    grep -q 'step-00000006: shard .* is not a valid safetensors file' "$TMPD/cut.log" &&
        fell_back cut step-00000006.corrupt.3
}
check "a truncated shard under a matching manifest: skipped (its header), rewritten, exit 0" \
    cut_fell_back
check "checkpoints are private: step directories 0700, shards and manifest 0600" \
    sh -c "test \"\$(stat -c %a '$TMPD/full1/step-00000006' '$shard' '$manifest' | tr '\n' ' ')\" = '700 600 600 '"

# several sequences per step (mean gradient): resume stays exact, and
# R=2 agrees with R=1
train 1 "$TMPD/batch1" --batch 3 >"$TMPD/batch1.log" 2>&1
train 2 "$TMPD/batch2" --batch 3 >"$TMPD/batch2.log" 2>&1
mkdir -p "$TMPD/batch-part"
cp -r "$TMPD/batch2/step-00000003" "$TMPD/batch-part/"
train 2 "$TMPD/batch-part" --batch 3 --resume >"$TMPD/batch-resumed.log" 2>&1
check "batch 3: R=2 losses equal R=1 losses within 1e-5" \
    same_losses "$TMPD/batch1.log" "$TMPD/batch2.log" 1e-5
check "batch 3: resume logs exactly the uninterrupted losses" \
    same_losses "$TMPD/batch2.log" "$TMPD/batch-resumed.log" 0
check "batch 3: resume ends with bit-identical parameters" \
    test "$(sha "$TMPD/batch2.log")" = "$(sha "$TMPD/batch-resumed.log")"

# token shards in the llm.c layout, and a job spec instead of flags
"$NPYTOOL" tokbin "$TMPD/tok0.bin" --n 20000 --vocab 512 --seed 1
"$NPYTOOL" tokbin "$TMPD/tok1.bin" --n 9000 --vocab 512 --seed 2
train 2 "$TMPD/shards" --data "$TMPD/tok*.bin" >"$TMPD/shards.log" 2>&1
mkdir -p "$TMPD/shards-part"
cp -r "$TMPD/shards/step-00000003" "$TMPD/shards-part/"
train 2 "$TMPD/shards-part" --data "$TMPD/tok*.bin" --resume >"$TMPD/shards-resumed.log" 2>&1
check "token shards: the data cursor is in the manifest" \
    grep -q '"cursor"' "$TMPD/shards/step-00000003/manifest.json"
check "token shards: resume logs exactly the uninterrupted losses" \
    same_losses "$TMPD/shards.log" "$TMPD/shards-resumed.log" 0
check "token shards: resume ends with bit-identical parameters" \
    test "$(sha "$TMPD/shards.log")" = "$(sha "$TMPD/shards-resumed.log")"
# the same tokens as .npy token ids, int32 and int64: the same training
mkdir -p "$TMPD/npy"
"$NPYTOOL" tokbin "$TMPD/npy/tok0.npy" --n 20000 --vocab 512 --seed 1 --format npy-i32
"$NPYTOOL" tokbin "$TMPD/npy/tok1.npy" --n 9000 --vocab 512 --seed 2 --format npy-i64
train 2 "$TMPD/npy-run" --data "$TMPD/npy/tok*" >"$TMPD/npy.log" 2>&1
same_run() { # A B: the same losses, exactly, and bit-identical parameters
    same_losses "$1" "$2" 0 && test -n "$(sha "$2")" && test "$(sha "$1")" = "$(sha "$2")"
}
check ".npy token ids (int32, int64): the losses and parameters of the llm.c shards" \
    same_run "$TMPD/shards.log" "$TMPD/npy.log"
# recompute = layer: only each layer's input kept, the layer made again in
# the backward: the same losses and parameters to the bit, on 1, 2 and 4
# ranks, both layouts, dense and dilated
t_recompute() { # R ARGS...
    _r=$1
    shift
    mpirun_np "$_r" "$DTENGINE" train --model tiny --data recall --seq-len 256 --steps 3 \
        --seed 5 "$@" >"$TMPD/rc-none.log" 2>&1 || { cat "$TMPD/rc-none.log"; return 1; }
    mpirun_np "$_r" "$DTENGINE" train --model tiny --data recall --seq-len 256 --steps 3 \
        --seed 5 --recompute layer "$@" >"$TMPD/rc-layer.log" 2>&1 ||
        { cat "$TMPD/rc-layer.log"; return 1; }
    same_losses "$TMPD/rc-none.log" "$TMPD/rc-layer.log" 0 >/dev/null || return 1
    [ -n "$(sha "$TMPD/rc-none.log")" ] && [ "$(sha "$TMPD/rc-none.log")" = "$(sha "$TMPD/rc-layer.log")" ] ||
        { echo "parameters $(sha "$TMPD/rc-none.log") vs $(sha "$TMPD/rc-layer.log")"; return 1; }
    sha "$TMPD/rc-layer.log"
}
check "recompute = layer, R=1: bit-identical losses and parameters" t_recompute 1
check "recompute = layer, R=2 zigzag: bit-identical" t_recompute 2
check "recompute = layer, R=4 contiguous: bit-identical" t_recompute 4 --layout contiguous
check "recompute = layer, R=2 dilated: bit-identical" t_recompute 2 --segments 64,256 \
    --dilations 1,4

# shard: each rank keeps 1/R of the AdamW moments (optimizer), of the
# gradient too (gradients: reduce-scatter instead of all-reduce), of the
# parameters too (parameters: each layer gathered before its forward and
# its backward). Against none: optimizer to the bit everywhere (AdamW is
# element by element, the gather copies); gradients and parameters to the
# bit on 2 ranks (a sum of two is one addition whatever the algorithm),
# within 1e-6 relative on 4 (reduce-scatter may sum in another order).
# The parameters of a 1e-6 case: |a - b| <= 1e-6 + 1e-6 |b|.
t_shard() { # R MODE TOL ARGS...
    _r=$1
    _m=$2
    _tol=$3
    shift 3
    for _s in none $_m; do
        mpirun_np "$_r" "$DTENGINE" train --model tiny --data recall --seq-len 256 --steps 3 \
            --seed 5 --shard $_s --params-out "$TMPD/sh-$_s.npy" "$@" >"$TMPD/sh-$_s.log" 2>&1 ||
            { cat "$TMPD/sh-$_s.log"; return 1; }
    done
    same_losses "$TMPD/sh-none.log" "$TMPD/sh-$_m.log" "$_tol" || return 1
    if [ "$_tol" = 0 ]; then
        [ -n "$(sha "$TMPD/sh-none.log")" ] &&
            [ "$(sha "$TMPD/sh-none.log")" = "$(sha "$TMPD/sh-$_m.log")" ] ||
            { echo "parameters $(sha "$TMPD/sh-none.log") vs $(sha "$TMPD/sh-$_m.log")"; return 1; }
        sha "$TMPD/sh-$_m.log"
    else
        "$NPYTOOL" cmp "$TMPD/sh-$_m.npy" "$TMPD/sh-none.npy" --atol 1e-6 --rtol 1e-6 &&
            echo "parameters: max |difference| $("$NPYTOOL" maxerr "$TMPD/sh-$_m.npy" "$TMPD/sh-none.npy")"
    fi
}
check "shard = optimizer, R=2 zigzag: bit-identical losses and parameters" t_shard 2 optimizer 0
check "shard = optimizer, R=4 contiguous, recompute = layer: bit-identical" t_shard 4 optimizer 0 \
    --layout contiguous --recompute layer
check "shard = optimizer, R=2 dilated: bit-identical" t_shard 2 optimizer 0 --segments 64,256 \
    --dilations 1,4
check "shard = gradients, R=2 zigzag: bit-identical" t_shard 2 gradients 0
check "shard = gradients, R=2 dilated, untied head: bit-identical" t_shard 2 gradients 0 \
    --segments 64,256 --dilations 1,4 --tied no
check "shard = gradients, R=4 contiguous: within 1e-6" t_shard 4 gradients 1e-6 --layout contiguous
check "shard = parameters, R=2 zigzag: bit-identical" t_shard 2 parameters 0
check "shard = parameters, R=2 contiguous, untied head, recompute = layer: bit-identical" \
    t_shard 2 parameters 0 --layout contiguous --tied no --recompute layer
check "shard = parameters, R=2 dilated: bit-identical" t_shard 2 parameters 0 \
    --segments 64,256 --dilations 1,4
check "shard = parameters, R=4 zigzag, recompute = layer: within 1e-6" t_shard 4 parameters 1e-6 \
    --recompute layer
check "shard = parameters, R=4 dilated, untied head: within 1e-6" t_shard 4 parameters 1e-6 \
    --segments 64,256 --dilations 1,4 --tied no

# checkpoints are the same files whatever the sharding (every rank writes
# the slice it keeps, or its share of what it holds): 4 ranks sharded ->
# 2 ranks unsharded resumes as from an unsharded checkpoint, and an
# unsharded checkpoint -> 4 ranks sharded ends as the uninterrupted run
t_shard_resume() { # MODE
    _m=$1
    for _s in none $_m; do
        rm -rf "$TMPD/shck-$_s"
        train 4 "$TMPD/shck-$_s" --shard $_s >"$TMPD/shck-$_s.log" 2>&1 ||
            { cat "$TMPD/shck-$_s.log"; return 1; }
    done
    grep -q '"shard": "'$_m'"' "$TMPD/shck-$_m/step-00000003/manifest.json" ||
        { echo "the manifest does not say shard = $_m"; return 1; }
    # the same model state (optimizer: to the bit; else within rounding)
    # from either 4-rank checkpoint, resumed on 2 ranks unsharded and
    # sharded: to the bit among themselves (R=2)
    for _s in none $_m; do
        rm -rf "$TMPD/shto2-$_s"
        train 2 "$TMPD/shto2-$_s" --resume-from "$TMPD/shck-$_m/step-00000003" --shard $_s \
            >"$TMPD/shto2-$_s.log" 2>&1 || { cat "$TMPD/shto2-$_s.log"; return 1; }
    done
    [ -n "$(sha "$TMPD/shto2-none.log")" ] &&
        [ "$(sha "$TMPD/shto2-none.log")" = "$(sha "$TMPD/shto2-$_m.log")" ] ||
        { echo "4 sharded -> 2 unsharded $(sha "$TMPD/shto2-none.log"), -> 2 sharded $(sha "$TMPD/shto2-$_m.log")"; return 1; }
    # and the 4-rank sharded run resumed on 4 sharded: the uninterrupted run
    rm -rf "$TMPD/shagain"
    train 4 "$TMPD/shagain" --shard $_m --resume-from "$TMPD/shck-$_m/step-00000003" \
        >"$TMPD/shagain.log" 2>&1 || { cat "$TMPD/shagain.log"; return 1; }
    [ "$(sha "$TMPD/shagain.log")" = "$(sha "$TMPD/shck-$_m.log")" ] ||
        { echo "4 sharded resumed: $(sha "$TMPD/shagain.log"), uninterrupted $(sha "$TMPD/shck-$_m.log")"; return 1; }
    # back: the unsharded 4-rank checkpoint on 4 sharded ranks
    rm -rf "$TMPD/shback"
    train 4 "$TMPD/shback" --shard $_m --resume-from "$TMPD/shck-none/step-00000003" \
        >"$TMPD/shback.log" 2>&1 || { cat "$TMPD/shback.log"; return 1; }
    if [ "$_m" = optimizer ]; then
        [ "$(sha "$TMPD/shback.log")" = "$(sha "$TMPD/shck-none.log")" ] ||
            { echo "unsharded -> 4 sharded: $(sha "$TMPD/shback.log"), uninterrupted $(sha "$TMPD/shck-none.log")"; return 1; }
    else
        same_losses "$TMPD/shck-none.log" "$TMPD/shback.log" 1e-6 >/dev/null || return 1
    fi
    echo "4 sharded -> 2: $(sha "$TMPD/shto2-$_m.log"); unsharded -> 4 sharded: $(sha "$TMPD/shback.log")"
}
check "shard = optimizer checkpoints: 4 sharded -> 2 unsharded, unsharded -> 4 sharded, exact" \
    t_shard_resume optimizer
check "shard = parameters checkpoints: 4 sharded -> 2 unsharded and sharded alike, resumed exactly, back to 4" \
    t_shard_resume parameters

# dp = N: N rings of R ranks, ring i takes the step's sequences i B to
# i B + B - 1, the gradient is summed around each ring, divided by N and
# summed across: the job of one ring with a batch of N B, to the bit for
# N = 2 (one addition across), whatever the sharding
t_dp() { # R N MODE ARGS...
    _r=$1
    _n=$2
    _m=$3
    shift 3
    mpirun_np "$_r" "$DTENGINE" train --model tiny --data recall --seq-len 256 --steps 3 \
        --seed 5 --batch "$_n" "$@" >"$TMPD/dp-batch.log" 2>&1 || { cat "$TMPD/dp-batch.log"; return 1; }
    mpirun_np $((_r * _n)) "$DTENGINE" train --model tiny --data recall --seq-len 256 --steps 3 \
        --seed 5 --dp "$_n" --shard "$_m" "$@" >"$TMPD/dp-$_m.log" 2>&1 || { cat "$TMPD/dp-$_m.log"; return 1; }
    grep -q "ranks=$((_r * _n)) .* dp=$_n" "$TMPD/dp-$_m.log" || { head -n 1 "$TMPD/dp-$_m.log"; return 1; }
    same_losses "$TMPD/dp-batch.log" "$TMPD/dp-$_m.log" 0 >/dev/null || return 1
    [ -n "$(sha "$TMPD/dp-batch.log")" ] && [ "$(sha "$TMPD/dp-batch.log")" = "$(sha "$TMPD/dp-$_m.log")" ] ||
        { echo "batch $_n: $(sha "$TMPD/dp-batch.log"), dp $_n: $(sha "$TMPD/dp-$_m.log")"; return 1; }
    sha "$TMPD/dp-$_m.log"
}
check "dp = 2 x R = 2 zigzag = one ring with batch 2, bit-identical" t_dp 2 2 none
check "dp = 2 x R = 2 contiguous, shard = parameters: bit-identical to batch 2" t_dp 2 2 parameters \
    --layout contiguous
check "dp = 2 x R = 2 dilated, shard = gradients: bit-identical to batch 2" t_dp 2 2 gradients \
    --segments 64,256 --dilations 1,4
check "dp = 2 x R = 1, shard = optimizer, recompute: bit-identical to batch 2" t_dp 1 2 optimizer \
    --recompute layer
t_dp4() {
    mpirun_np 1 "$DTENGINE" train --model tiny --data recall --seq-len 256 --steps 3 --seed 5 \
        --batch 4 >"$TMPD/dp4-batch.log" 2>&1 || { cat "$TMPD/dp4-batch.log"; return 1; }
    mpirun_np 4 "$DTENGINE" train --model tiny --data recall --seq-len 256 --steps 3 --seed 5 \
        --dp 4 --shard parameters >"$TMPD/dp4.log" 2>&1 || { cat "$TMPD/dp4.log"; return 1; }
    same_losses "$TMPD/dp4-batch.log" "$TMPD/dp4.log" 1e-6
}
check "dp = 4 x R = 1, shard = parameters: batch 4 within 1e-6" t_dp4

# a dp job's sharded checkpoint (slices listed out of offset order: rank
# i R + r keeps slice r N + i) resumes on one ring with batch N, and a
# token-shard job's cursor carries over: exactly the uninterrupted run
t_dp_resume() {
    rm -rf "$TMPD/dpck" "$TMPD/dpb2" "$TMPD/dpr"
    "$NPYTOOL" tokbin "$TMPD/dptok.bin" --n 20000 --vocab 512 --seed 3 || return 1
    train 4 "$TMPD/dpck" --dp 2 --shard parameters --data "$TMPD/dptok.bin" >"$TMPD/dpck.log" 2>&1 ||
        { cat "$TMPD/dpck.log"; return 1; }
    train 2 "$TMPD/dpb2" --batch 2 --data "$TMPD/dptok.bin" >"$TMPD/dpb2.log" 2>&1 ||
        { cat "$TMPD/dpb2.log"; return 1; }
    train 2 "$TMPD/dpr" --batch 2 --data "$TMPD/dptok.bin" \
        --resume-from "$TMPD/dpck/step-00000003" >"$TMPD/dpr.log" 2>&1 || { cat "$TMPD/dpr.log"; return 1; }
    grep -q '"dp": 2' "$TMPD/dpck/step-00000003/manifest.json" || { echo "no dp in the manifest"; return 1; }
    for _l in dpb2 dpr; do
        [ -n "$(sha "$TMPD/dpck.log")" ] && [ "$(sha "$TMPD/dpck.log")" = "$(sha "$TMPD/$_l.log")" ] ||
            { echo "dp run $(sha "$TMPD/dpck.log"), $_l $(sha "$TMPD/$_l.log")"; return 1; }
    done
    sha "$TMPD/dpr.log"
}
check "dp = 2 sharded checkpoint with token shards -> one ring, batch 2: exact" t_dp_resume

cat >"$TMPD/job.spec" <<SPEC
kind = train
model = tiny
tokens = 256
steps = $STEPS
seed = 5
data = recall
SPEC
mpirun_np 1 "$DTENGINE" train --spec "$TMPD/job.spec" >"$TMPD/spec.log" 2>&1
check "a job spec runs the same job as the flags" \
    same_losses "$TMPD/full1.log" "$TMPD/spec.log" 0

printf 'not a token shard at all, just text that is long enough........' >"$TMPD/bad.bin"

bad() { # EXPECT-IN-STDERR ARGS...: exit 2 with the message
    _want=$1
    shift
    # a refusal is immediate: 60 s is a hang (a FIFO read), exit 124. The
    # sequence length is required (a spec's tokens): 256 unless ARGS say
    # (a later --seq-len replaces it), so each check meets its own refusal
    ${DT_TIMEOUT:+$DT_TIMEOUT 60} "$DTENGINE" train --seq-len 256 "$@" >"$TMPD/bad.out" 2>&1
    _rc=$?
    [ $_rc -eq 2 ] || { echo "exit $_rc"; cat "$TMPD/bad.out"; return 1; }
    grep -q "$_want" "$TMPD/bad.out" || { cat "$TMPD/bad.out"; return 1; }
}
check "refuses --resume without --ckpt-dir" bad 'needs --ckpt-dir' --resume
check "refuses a sequence too short for the task" bad 'too short' --seq-len 20
check "refuses heads that do not divide dim" bad 'do not divide dim' --heads 3
check "refuses an unknown option" bad 'unknown option' --bogus 1
check "refuses --recompute other than none or layer" bad 'none or layer' --recompute all
check "refuses --shard other than the four modes" bad 'none, optimizer, gradients or parameters' \
    --shard everything
check "refuses a --dp that does not divide the ranks" bad 'dp 2 does not divide the job.s 1 ranks' \
    --dp 2
check "refuses --dp 0" bad 'dp' --dp 0
check "refuses an unknown --ckpt-commit" bad 'self or external' --ckpt-commit later
check "refuses --resume with --resume-from" bad 'exclude each other' --resume-from "$TMPD" \
    --resume --ckpt-dir "$TMPD/x" --ckpt-every 3
check "refuses a malformed token shard, naming it" bad 'bad.bin' --data "$TMPD/bad.bin"
"$NPYTOOL" gen --shape 300 --seed 1 --stream 0 "$TMPD/f32.npy"
check "refuses a float32 .npy as token ids, naming it and the dtype" \
    bad 'f32.npy: dtype is float32; token ids need int32' --data "$TMPD/f32.npy"
mkdir "$TMPD/dir.bin"
check "refuses a directory as a token shard (exit 2, not 1)" bad 'dir.bin: is a directory' \
    --data "$TMPD/dir.bin"
check "refuses --data in a directory that does not exist, naming it" \
    bad "cannot read directory $TMPD/nodir: No such file" --data "$TMPD/nodir/*.bin"
check "refuses a spec of another kind" sh -c "printf 'kind = attn\ntokens = 256\n' >'$TMPD/attn.spec'; \
    '$DTENGINE' train --spec '$TMPD/attn.spec' 2>&1 | grep -q 'kind = attn'"
mkfifo "$TMPD/fifo.spec" || die "mkfifo failed"
check "refuses a spec that is a FIFO at once (exit 2)" bad 'fifo.spec: not a regular file' \
    --spec "$TMPD/fifo.spec"
printf 'kind = train\ntokens = 256\nname = job\302\233[2J\n' >"$TMPD/c1.spec"
check "refuses a spec value with a C1 control character, naming the line and key" \
    bad 'c1.spec:3: key .name.: control character U+009B' --spec "$TMPD/c1.spec"
printf 'kind = train\ntokens = 256\nckpt_dir = /ck\377pt\n' >"$TMPD/utf8.spec"
check "refuses a spec value that is not UTF-8, naming the line and key" \
    bad 'utf8.spec:3: key .ckpt_dir.: invalid UTF-8' --spec "$TMPD/utf8.spec"
printf 'kind = train\ntokens = 256\ncolour = red\n' >"$TMPD/unknown.spec"
check "refuses a spec with an unknown key with exit 2" bad "unknown.spec:3: unknown key 'colour'" \
    --spec "$TMPD/unknown.spec"
# One model table (spec/model.h): for a spec's model, dtengine train and
# dtctl plan resolve the same shape and the same defaults (custom: RoPE base
# 500000, untied head, as dt-spec(5) says; the engine once ran 10000, tied).
model_of_plan() { "$DT_BUILDDIR/cli/dtctl" plan "$1" --json | tr -d ' \n' | grep -o '"model":{[^}]*}' |
    sed 's/"name":"[^"]*",//; s/"rope_theta":\([0-9]*\)\.0*/"rope_theta":\1/;
        s/"head_dim":[0-9]*,//; s/"rope_scaling":"none",//; s/"norm_eps":[^,]*,//'; }
model_of_ckpt() { tr -d ' \n' <"$1" | grep -o '"model":{[^}]*}' |
    sed 's/"norm_eps":[^,]*,//; s/"rope_theta":\([0-9]*\)\.0*/"rope_theta":\1/'; }
same_model() { # SPEC: the engine's checkpointed model equals the planner's
    rm -rf "$TMPD/model"
    "$DTENGINE" train --spec "$1" --steps 1 --ckpt-dir "$TMPD/model" --ckpt-every 1 \
        >"$TMPD/model.log" 2>&1 || { cat "$TMPD/model.log"; return 1; }
    _e=$(model_of_ckpt "$TMPD"/model/step-00000001/manifest.json)
    _p=$(model_of_plan "$1")
    echo "engine $_e"
    echo "plan   $_p"
    [ -n "$_e" ] && [ "$_e" = "$_p" ] && grep -q "$2" "$TMPD"/model/step-00000001/manifest.json
}
printf 'kind = train\ntokens = 256\nmodel = custom\ndim = 64\nlayers = 1\nheads = 4\nkv_heads = 2\nffn = 128\nvocab = 512\n' \
    >"$TMPD/custom.spec"
check "model = custom: engine and planner agree (rope_theta 500000, untied)" \
    same_model "$TMPD/custom.spec" '"tied": false'
printf 'kind = train\ntokens = 256\nmodel = tiny\nlayers = 1\n' >"$TMPD/tiny1.spec"
check "model = tiny with a key over it: engine and planner agree (10000, tied)" \
    same_model "$TMPD/tiny1.spec" '"tied": true'
finish
