#!/bin/sh
# SPDX-License-Identifier: MIT
#
# The mask keys in whole models (dt-spec(5): doc_mask, eot_token,
# doc_positions, sliding_window, sliding_window_layers, block_pattern,
# block_size), prefill and train on real ranks under mpirun, a small
# custom model (dim 64, 2 layers, 4/2 heads, vocabulary 64):
#   - packed documents (npytool tokbin --docs: five documents of 40, 1,
#     23, 31 and 49 tokens, each starting with the end-of-text token 3,
#     crossing rank boundaries, one of a single token) with doc_mask = eot
#     and doc_positions = reset: every token's NLL is its document's
#     computed alone, R = 1 to 4, every layout; with doc_positions =
#     continue, its document's alone at pos_offset = the document's start;
#   - train's one step: the step's loss is the documents' own losses,
#     weighted by their targets (the targets across boundaries are not
#     scored), on 1 and 2 ranks;
#   - a window as long as the sequence changes nothing, to the bit; every:2
#     windows layer 0 only (on one layer it is all; on two, neither all
#     nor none);
#   - block_pattern local:1 over blocks of 16 attends what documents of
#     16 tokens do (logits within 1e-5);
#   - checkpoints record the masks: a resume with other masks is refused
#     naming both, the same masks resume;
#   - bad mask keys are refused naming the key, exit 2; dtctl plan prices
#     a window and prints the imbalance.
# The Hugging Face check of per-document positions is hf_golden.sh's.

. "$(dirname "$0")/lib.sh"
need_mpirun

DTCTL=$DT_BUILDDIR/cli/dtctl
M="--model custom --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 --vocab 64 --seed 5"
EOT=3
LENS="40 1 23 31 49"
T=144
STARTS="0 40 41 64 95"
"$NPYTOOL" tokbin "$TMPD/all.bin" --docs 40,1,23,31,49 --eot $EOT --vocab 64 --seed 1 ||
    die "npytool tokbin failed"
for _k in 0 1 2 3 4; do
    "$NPYTOOL" tokbin "$TMPD/d$_k.bin" --docs 40,1,23,31,49 --eot $EOT --vocab 64 --seed 1 \
        --doc $_k || die "npytool tokbin failed"
done

# pf R OUT ARGS...: prefill, its per-token NLL merged into OUT/nll.npy
pf() {
    _r=$1 _o=$2
    shift 2
    # shellcheck disable=SC2086
    mpirun_np "$_r" "$DTENGINE" prefill $M --out-dir "$_o" "$@" >"$_o.log" 2>&1 &&
        "$DTCTL" nll "$_o" --out "$_o/nll.npy" >"$_o.nll" 2>&1 || {
        cat "$_o.log" "$_o.nll" 2>/dev/null
        return 1
    }
}
nth() { echo "$2" | cut -d' ' -f"$(($1 + 1))"; }

# each document alone (reset: from position 0; continue: at its start)
alone() { # MODE: the documents' NLL one after another in $TMPD/alone-MODE.npy
    _files=
    for _k in 0 1 2 3 4; do
        _off=0
        [ "$1" = continue ] && _off=$(nth $_k "$STARTS")
        pf 1 "$TMPD/alone-$1-$_k" --seq-len "$(nth $_k "$LENS")" --data "$TMPD/d$_k.bin" \
            --doc-mask eot --eot-token $EOT --pos-offset "$_off" || return 1
        _files="$_files $TMPD/alone-$1-$_k/nll.npy"
    done
    # shellcheck disable=SC2086
    "$NPYTOOL" cat "$TMPD/alone-$1.npy" $_files
}

t_docs() { # MODE
    alone "$1" || return 1
    for _r in 1 2 3 4; do
        for _l in zigzag contiguous balanced; do
            [ $_r = 1 ] && [ $_l != zigzag ] && continue
            [ $_l = balanced ] && [ $_r != 2 ] && continue # T = 144: 8R divides it for R = 2
            pf $_r "$TMPD/packed-$1-$_r-$_l" --seq-len $T --data "$TMPD/all.bin" --layout $_l \
                --doc-mask eot --eot-token $EOT --doc-positions "$1" || return 1
            "$NPYTOOL" cmp "$TMPD/packed-$1-$_r-$_l/nll.npy" "$TMPD/alone-$1.npy" --atol 1e-5 \
                --nan-same || { echo "R=$_r $_l"; return 1; }
        done
    done
}
check "doc_mask = eot, doc_positions = reset: each token's NLL is its document's alone (R = 1 2 3 4, every layout)" \
    t_docs reset
check "doc_positions = continue: each token's NLL is its document's alone at its start" \
    t_docs continue

loss_of() { sed -n 's/^step 0 loss \([0-9.eE+-]*\) .*/\1/p' "$1"; }
targets_of() { sed -n 's/^perplexity: \([0-9]*\) targets.*/\1/p' "$1"; }
ploss_of() { sed -n 's/^prefill: tokens=.* loss \([0-9.eE+-]*\)$/\1/p' "$1"; }

t_train_docs() {
    # the documents' losses, each weighted by its scored targets
    _want=$(for _k in 0 1 2 3 4; do
        echo "$(ploss_of "$TMPD/alone-reset-$_k.log") $(targets_of "$TMPD/alone-reset-$_k.log")"
    done | awk '{ s += $1 * $2; n += $2 } END { printf "%.9f", s / n }')
    for _r in 1 2; do
        # shellcheck disable=SC2086
        mpirun_np $_r "$DTENGINE" train $M --seq-len $T --data "$TMPD/all.bin" --steps 1 \
            --doc-mask eot --eot-token $EOT --doc-positions reset >"$TMPD/tr$_r.log" 2>&1 ||
            { cat "$TMPD/tr$_r.log"; return 1; }
        _got=$(loss_of "$TMPD/tr$_r.log")
        echo "R=$_r: step 0 loss $_got, the documents alone $_want"
        awk -v a="$_got" -v b="$_want" 'BEGIN { d = a - b; exit !(a != "" && d * d < 1e-12) }' ||
            return 1
    done
}
check "train, one step: the loss is the documents' own, weighted by their targets (R = 1, 2)" \
    t_train_docs

# tr OUT ARGS...: 2 steps of train on the packed tokens, its loss lines in OUT
tr() {
    _o=$1
    shift
    # shellcheck disable=SC2086
    "$DTENGINE" train $M --seq-len $T --data "$TMPD/all.bin" --steps 2 "$@" >"$_o.log" 2>&1 ||
        { cat "$_o.log"; return 1; }
    sed -n 's/^step \([0-9]*\) loss \([0-9.eE+-]*\) .*/\1 \2/p' "$_o.log" >"$_o"
    [ -s "$_o" ]
}
t_windows() {
    tr "$TMPD/w-none" && tr "$TMPD/w-full" --sliding-window $T &&
        tr "$TMPD/w-8" --sliding-window 8 && tr "$TMPD/w-8-2" --sliding-window 8 \
        --sliding-window-layers every:2 || return 1
    cmp "$TMPD/w-none" "$TMPD/w-full" || { echo "a window of T changed the losses"; return 1; }
    ! cmp -s "$TMPD/w-none" "$TMPD/w-8" && ! cmp -s "$TMPD/w-8" "$TMPD/w-8-2" &&
        ! cmp -s "$TMPD/w-none" "$TMPD/w-8-2" || { echo "every:2 is all or none"; return 1; }
    # one layer: every:2 windows layer 0, which is all of them
    tr "$TMPD/w1-8" --sliding-window 8 --layers 1 &&
        tr "$TMPD/w1-8-2" --sliding-window 8 --sliding-window-layers every:2 --layers 1 &&
        cmp "$TMPD/w1-8" "$TMPD/w1-8-2"
}
check "sliding_window: one of T changes nothing (to the bit); every:2 windows layers 0, 2, ..." \
    t_windows

t_pattern() {
    "$NPYTOOL" tokbin "$TMPD/b16.bin" --docs 16,16,16,16,16,16,16,16,16 --eot $EOT --vocab 64 \
        --seed 2 || return 1
    for _r in 1 3; do
        pf $_r "$TMPD/pat$_r" --seq-len $T --data "$TMPD/b16.bin" --last $T \
            --block-pattern local:1 --block-size 16 &&
            pf $_r "$TMPD/doc16-$_r" --seq-len $T --data "$TMPD/b16.bin" --last $T \
                --doc-mask eot --eot-token $EOT || return 1
        "$NPYTOOL" cmp "$TMPD/pat$_r/logits.npy" "$TMPD/doc16-$_r/logits.npy" --atol 1e-5 ||
            return 1
    done
    # and a pattern that lets more through differs
    pf 1 "$TMPD/pat-l2" --seq-len $T --data "$TMPD/b16.bin" --last $T \
        --block-pattern global:1,local:2 --block-size 16 &&
        ! "$NPYTOOL" cmp "$TMPD/pat-l2/logits.npy" "$TMPD/pat1/logits.npy" --atol 1e-5 >/dev/null
}
check "block_pattern local:1 over blocks of 16 attends as documents of 16 tokens (R = 1, 3)" \
    t_pattern

t_resume() {
    _d=$TMPD/ck
    tr "$TMPD/ck-a" --sliding-window 16 --ckpt-dir "$_d" --ckpt-every 1 || return 1
    grep -q '"masks": "sliding_window=16"' "$_d"/step-*2/manifest.json ||
        { echo "no masks in the manifest"; return 1; }
    # shellcheck disable=SC2086
    run_rc 2 "$DTENGINE" train $M --seq-len $T --data "$TMPD/all.bin" --steps 3 \
        --sliding-window 8 --ckpt-dir "$_d" --resume &&
        out_has "written with masks sliding_window=16, this run has sliding_window=8" || return 1
    # shellcheck disable=SC2086
    run_rc 2 "$DTENGINE" train $M --seq-len $T --data "$TMPD/all.bin" --steps 3 \
        --ckpt-dir "$_d" --resume && out_has "this run has none" || return 1
    # shellcheck disable=SC2086
    run_rc 0 "$DTENGINE" train $M --seq-len $T --data "$TMPD/all.bin" --steps 3 \
        --sliding-window 16 --ckpt-dir "$_d" --resume && out_has "^step 2 loss"
}
check "checkpoints record the masks: another mask's resume is refused, the same resumes" t_resume

bad() { # NEEDLE ARGS...: train refuses ARGS with exit 2 naming NEEDLE
    _needle=$1
    shift
    # shellcheck disable=SC2086
    run_rc 2 "$DTENGINE" train $M --seq-len $T --steps 1 "$@" && out_has "$_needle"
}
t_bad() {
    D="--data $TMPD/all.bin"
    bad "doc_positions = reset needs doc_mask = eot" $D --doc-positions reset &&
        bad "pos_offset' = 5 with doc_positions = reset" $D --doc-mask eot --eot-token 3 \
            --doc-positions reset --pos-offset 5 &&
        bad "eot_token 64 is not a token of the model's vocabulary of 64" $D --doc-mask eot \
            --eot-token 64 &&
        bad "eot_token 50256 is not a token" $D --doc-mask eot &&
        bad "doc_mask = eot needs token data" --doc-mask eot --eot-token 3 &&
        bad "'eot_token' needs doc_mask = eot" $D --eot-token 3 &&
        bad "'block_size' = 7 does not divide tokens = 144" $D --block-pattern local:1 \
            --block-size 7 &&
        bad "block_pattern' 'local:0': local:0: expected a whole number" $D \
            --block-pattern local:0 &&
        bad "unknown part 'dilated'" $D --block-pattern dilated:2 &&
        bad "'block_size' needs key 'block_pattern'" $D --block-size 16 &&
        bad "'sliding_window_layers' needs key 'sliding_window'" $D \
            --sliding-window-layers every:2 &&
        bad "sliding_window_layers' 'every:0'" $D --sliding-window 8 \
            --sliding-window-layers every:0 &&
        bad "sliding-window: value '0' out of range" $D --sliding-window 0
}
check "bad mask keys are refused naming the key, exit 2" t_bad

t_plan() {
    run_rc 0 "$DTCTL" plan --kind train --tokens 64K --ranks 4 --sliding-window 1024 &&
        out_has "^masks +sliding_window=1024" &&
        out_has "0\\.031[0-9]* of the unmasked pairs attended" &&
        out_has "^imbalance +1\\.0[0-9]* " || return 1
    run_rc 0 "$DTCTL" plan --kind prefill --tokens 64K --ranks 4 --block-pattern global:1,local:2 \
        --block-size 1024 --doc-mask eot --data /x.bin &&
        out_has "block_pattern=global:1,local:2 block_size=1024" &&
        out_has "documents are the data's: planned as one" || return 1
    run_rc 6 "$DTCTL" plan --kind train --tokens 64K --device cuda --sliding-window 64 \
        --segments 4096,65536 --dilations 1,4 && out_has "masks on dilated attention run on"
}
check "dtctl plan prices the masks known before the data and prints the imbalance" t_plan

finish
