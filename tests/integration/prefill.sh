#!/bin/sh
# SPDX-License-Identifier: MIT
#
# dtengine prefill on real ranks under mpirun, a short sequence (T=256) of
# the recall task with the tiny model:
#   - the prefill loss equals the loss train prints at step 0 (the same
#     untrained parameters and sequence), on 1 and 4 ranks;
#   - the last positions' logits of 4 ranks (zigzag) and 2 ranks
#     (contiguous) equal those of 1 rank within 1e-5;
#   - a prefill stopped after layer 2 (exit 3) and resumed says where it
#     resumed and writes bit-identical logits;
#   - a corrupt newest layer checkpoint is skipped for the layer before it,
#     and a finished prefill resumed runs only the head;
#   - a checkpoint of 4 ranks resumes on 2 (resharded), within 1e-5 of the
#     uninterrupted run; bad options exit 2.
. "$(dirname "$0")/lib.sh"
need_mpirun

LAST=8
prefill() { # R [ARGS...]: log of a run
    _r=$1
    shift
    mpirun_np "$_r" "$DTENGINE" prefill --model tiny --data recall --seq-len 256 --seed 5 \
        --last $LAST "$@"
}
loss() { sed -n 's/^prefill: tokens=.* loss \([0-9.eE+-]*\)$/\1/p' "$1"; }
train_loss() { awk '$1 == "step" && $2 == 0 { print $4 }' "$1"; }

# close A B TOL: two numbers agree within relative TOL
close() {
    awk -v a="$1" -v b="$2" -v tol="$3" 'BEGIN {
        if (a == "" || b == "") { print "missing value: \"" a "\" vs \"" b "\""; exit 1 }
        d = a - b; if (d < 0) d = -d; r = d / (b < 0 ? -b : b);
        printf "%s vs %s, relative difference %.3g\n", a, b, r; exit r > tol }'
}

# below X TOL: X (npytool maxerr output) is a number <= TOL
below() {
    awk -v x="$1" -v tol="$2" 'BEGIN { printf "max |diff| %s\n", x; exit !(x + 0 == x && x <= tol) }'
}

for R in 1 4; do
    prefill $R --ckpt-dir "$TMPD/full$R" --logits "$TMPD/full$R.npy" >"$TMPD/full$R.log" 2>&1
    check "R=$R: prefill succeeds and writes ($LAST, 512) logits" \
        sh -c "grep -q '^result: .*logits_sha256=' '$TMPD/full$R.log' &&
               head -c 128 '$TMPD/full$R.npy' | grep -q \"'shape': ($LAST, 512)\""
    check "R=$R: a checkpoint after every layer (the newest 2 kept)" \
        test -d "$TMPD/full$R/step-00000003" -a -d "$TMPD/full$R/step-00000004"
    mpirun_np $R "$DTENGINE" train --model tiny --data recall --seq-len 256 --steps 1 --seed 5 \
        >"$TMPD/train$R.log" 2>&1
    check "R=$R: prefill loss equals train's step-0 loss within 1e-6" \
        close "$(loss "$TMPD/full$R.log")" "$(train_loss "$TMPD/train$R.log")" 1e-6
done

check "R=4 (zigzag) logits equal R=1 logits within 1e-5" \
    below "$(maxerr "$TMPD/full4.npy" "$TMPD/full1.npy")" 1e-5
prefill 2 --layout contiguous --logits "$TMPD/cont2.npy" >"$TMPD/cont2.log" 2>&1
check "R=2 (contiguous, no checkpoints) logits equal R=1 logits within 1e-5" \
    below "$(maxerr "$TMPD/cont2.npy" "$TMPD/full1.npy")" 1e-5

# interrupted after layer 2, then resumed
prefill 4 --ckpt-dir "$TMPD/part" --logits "$TMPD/part.npy" --stop-after-layer 2 \
    >"$TMPD/stop.log" 2>&1
stop_rc=$?
check "--stop-after-layer 2 exits 3 with layers 1 and 2 checkpointed, no logits" \
    test $stop_rc -eq 3 -a -d "$TMPD/part/step-00000002" -a ! -e "$TMPD/part.npy"
cp -r "$TMPD/part" "$TMPD/corrupt"
prefill 4 --ckpt-dir "$TMPD/part" --logits "$TMPD/part.npy" --resume >"$TMPD/resumed.log" 2>&1
check "the resumed prefill says it resumed after layer 2" \
    grep -q 'resuming from .*step-00000002 after layer 2 of 4' "$TMPD/resumed.log"
check "and writes bit-identical logits" cmp "$TMPD/full4.npy" "$TMPD/part.npy"

# corrupt the newest layer checkpoint: the resume falls back to layer 1
shard=$(ls "$TMPD/corrupt/step-00000002"/shard-*.safetensors | head -n 1)
corrupt_bytes "$shard" 300 || die "cannot corrupt layer 2's checkpoint"
prefill 4 --ckpt-dir "$TMPD/corrupt" --logits "$TMPD/corrupt.npy" --resume \
    >"$TMPD/corrupt.log" 2>&1
check "a corrupt newest layer checkpoint is skipped with a message" \
    grep -q 'skipping checkpoint .*step-00000002' "$TMPD/corrupt.log"
check "and the prefill resumes after layer 1" \
    grep -q 'resuming from .*step-00000001 after layer 1 of 4' "$TMPD/corrupt.log"
check "with bit-identical logits" cmp "$TMPD/full4.npy" "$TMPD/corrupt.npy"

# the same layer bad again on a retry: set aside under the next free name
# (step-00000002.rejected was taken, and the resume failed on every retry)
prefill 4 --ckpt-dir "$TMPD/retry" --stop-after-layer 2 >"$TMPD/retry0.log" 2>&1
retry_layer2() { # N ASIDE: corrupt layer 2, resume and stop after it again (exit 3)
    _s=$(ls "$TMPD/retry/step-00000002"/shard-*.safetensors | head -n 1)
    corrupt_bytes "$_s" 300 || return 1
    prefill 4 --ckpt-dir "$TMPD/retry" --resume --stop-after-layer 2 >"$TMPD/retry$1.log" 2>&1
    _rc=$?
    [ $_rc -eq 3 ] && grep -q "moved .*step-00000002 aside to .*/$2\$" "$TMPD/retry$1.log" &&
        test -d "$TMPD/retry/$2" || { echo "exit $_rc"; cat "$TMPD/retry$1.log"; return 1; }
}
check "a bad layer checkpoint is set aside as step-00000002.rejected" \
    retry_layer2 1 step-00000002.rejected
check "bad again on a retry: set aside as step-00000002.rejected.2, exit 3" \
    retry_layer2 2 step-00000002.rejected.2
prefill 4 --ckpt-dir "$TMPD/retry" --resume --logits "$TMPD/retry.npy" >"$TMPD/retry3.log" 2>&1
check "and the last resume writes bit-identical logits" cmp "$TMPD/full4.npy" "$TMPD/retry.npy"

prefill 1 --ckpt-dir "$TMPD/full1" --resume --logits "$TMPD/again1.npy" >"$TMPD/again1.log" 2>&1
check "a finished prefill resumed after its last layer runs only the head, bit-identically" \
    sh -c "grep -q 'after layer 4 of 4' '$TMPD/again1.log' && cmp '$TMPD/full1.npy' '$TMPD/again1.npy'"

prefill 4 --ckpt-dir "$TMPD/reshard" --stop-after-layer 2 >"$TMPD/reshard-a.log" 2>&1
prefill 2 --ckpt-dir "$TMPD/reshard" --resume --logits "$TMPD/reshard.npy" \
    >"$TMPD/ranks.log" 2>&1
check "a 4-rank checkpoint resumes on 2 ranks: each takes its positions' rows from every shard" \
    grep -q 'after layer 2 of 4 (written by 4 ranks)' "$TMPD/ranks.log"
check "and its logits equal the uninterrupted 4-rank run's within 1e-5" \
    below "$(maxerr "$TMPD/full4.npy" "$TMPD/reshard.npy")" 1e-5

bad() { # EXPECT-IN-STDERR ARGS...: exit 2 with the message
    _want=$1
    shift
    "$DTENGINE" prefill --seq-len 256 "$@" >"$TMPD/bad.out" 2>&1
    _rc=$?
    [ $_rc -eq 2 ] || { echo "exit $_rc"; cat "$TMPD/bad.out"; return 1; }
    grep -q "$_want" "$TMPD/bad.out" || { cat "$TMPD/bad.out"; return 1; }
}
check "refuses --resume without --ckpt-dir" bad 'needs --ckpt-dir' --resume
check "refuses --last beyond the sequence" bad 'more than the 256 positions' --last 257
check "refuses --stop-after-layer beyond the model" bad 'has 4 layers' \
    --ckpt-dir "$TMPD/x" --stop-after-layer 5
check "refuses to overwrite an earlier prefill's checkpoints" bad 'pass --resume' \
    --ckpt-dir "$TMPD/full1"
check "refuses another sequence length on resume" bad 'another sequence length' \
    --seq-len 128 --ckpt-dir "$TMPD/full1" --resume
finish
