#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Hugging Face LLaMA models in dtengine, against an independent
# implementation: tests/fixtures/hf_llama holds a tiny LlamaForCausalLM
# (transformers' own files: config.json in transformers 5's form,
# model.safetensors) with plain and llama3-scaled RoPE, 48 token ids, and
# the logits and per-token NLL transformers computed for them in float64 at
# positions 0 and 1,000,000 (gen.py, README.md there). dtengine prefill
# --init-from must reproduce them:
#   - logits within 1e-4 relative (|dt - hf| <= 1e-4 |hf| + 1e-5) and
#     NLL within 1e-5 absolute, for R = 1, 2, 4 ranks, zigzag and
#     contiguous layouts, RoPE scaling llama3 on and off, pos_offset 0 and
#     1,000,000; the table of the largest differences is printed;
#   - the comparison can fail: the scaled model's logits at 1,000,000 are
#     far from the plain model's;
#   - train --init-from's step-0 loss is prefill's on the same tokens;
#   - dtctl plan --model DIR plans the directory's model;
#   - bad directories (a missing or contradictory key, another
#     architecture, a truncated weights file, a model key against the
#     file) are refused before any compute, naming the file and the key,
#     exit 2;
#   - pos_offset is recorded in checkpoints: a resume at other positions is
#     refused, one at the same positions gives the same logits;
#   - packed documents with per-document positions (doc_mask = eot,
#     doc_positions = reset, eot_token from config.json's eos_token_id):
#     the logits and NLL transformers computes given per-document position
#     ids (gen_docs.py), R = 1, 2, 4.
. "$(dirname "$0")/lib.sh"
need_mpirun

FIX=$DT_SRCDIR/tests/fixtures/hf_llama
DTCTL=$DT_BUILDDIR/cli/dtctl
[ -f "$FIX/plain/model.safetensors" ] || die "no fixture at $FIX"

prefill() { # R MODEL POS LAYOUT OUT [ARGS...]
    _r=$1 _m=$2 _p=$3 _l=$4 _o=$5
    shift 5
    mpirun_np "$_r" "$DTENGINE" prefill --init-from "$FIX/$_m" --data "$FIX/tokens.npy" \
        --seq-len 48 --last 48 --pos-offset "$_p" --layout "$_l" --out-dir "$_o" "$@"
}
loss() { sed -n 's/^prefill: tokens=.* loss \([0-9.eE+-]*\)$/\1/p' "$1"; }
sha() { sed -n 's/^result: .*logits_sha256=\([0-9a-f]*\)$/\1/p' "$1"; }

# golden R MODEL POS LAYOUT: logits and NLL against transformers'
golden() {
    _d="$TMPD/g-$1-$2-$3-$4"
    prefill "$1" "$2" "$3" "$4" "$_d" >"$_d.log" 2>&1 || { cat "$_d.log"; return 1; }
    "$NPYTOOL" cmp "$_d/logits.npy" "$FIX/${2}_pos${3}_logits.npy" --rtol 1e-4 --atol 1e-5 ||
        return 1
    "$DTCTL" nll "$_d" --out "$_d/nll.npy" >"$_d.nll" 2>&1 || { cat "$_d.nll"; return 1; }
    "$NPYTOOL" cmp "$_d/nll.npy" "$FIX/${2}_pos${3}_nll.npy" --head 47 --atol 1e-5 || return 1
    printf '%-7s %-8s %-2s %-10s %10s %10s\n' "$2" "$3" "$1" "$4" \
        "$("$NPYTOOL" maxerr "$_d/logits.npy" "$FIX/${2}_pos${3}_logits.npy")" \
        "$("$NPYTOOL" maxerr "$_d/nll.npy" "$FIX/${2}_pos${3}_nll.npy" --head 47)" \
        >>"$TMPD/table"
}

printf '%-7s %-8s %-2s %-10s %10s %10s\n' model pos R layout "logits" "nll" >"$TMPD/table"
for M in plain llama3; do
    for P in 0 1000000; do
        for R in 1 2 4; do
            for L in zigzag contiguous; do
                check "$M, positions from $P, R=$R $L: logits and NLL as transformers'" \
                    golden $R $M $P $L
            done
        done
    done
done
echo "# largest |dt - transformers| (logits (48, 128); NLL of 47 targets):"
sed 's/^/# /' "$TMPD/table"

t_discriminates() {
    _e=$("$NPYTOOL" maxerr "$TMPD/g-1-llama3-1000000-zigzag/logits.npy" \
        "$FIX/plain_pos1000000_logits.npy")
    echo "llama3-scaled dt vs plain transformers at 1,000,000: max |diff| $_e"
    awk -v e="$_e" 'BEGIN { exit !(e + 0 == e && e > 1e-2) }'
}
check "the comparison can fail: llama3 scaling moves the logits at 1,000,000 by > 1e-2" \
    t_discriminates

t_perplexity() {
    _d="$TMPD/g-4-plain-0-zigzag"
    grep -q '^perplexity: 47 targets at positions 0\.\.47: mean nll ' "$_d.log" &&
        grep -q '^  \[32, 64) *15 ' "$_d.log" && grep -q '"targets": 47' "$_d/perplexity.json" &&
        grep -q '^  \[32, 64) *15 ' "$_d.nll" || { cat "$_d.log" "$_d.nll"; return 1; }
    grep '^perplexity' "$_d.log"
}
check "prefill prints the perplexity by position bucket; perplexity.json and dtctl nll agree" \
    t_perplexity

# train --init-from: step 0's loss is prefill's on the same 49 tokens (the
# one sequence of the file: x = tokens 0..47, y = tokens 1..48)
t_train() {
    "$NPYTOOL" tokbin "$TMPD/doc.npy" --n 49 --vocab 128 --seed 3 --format npy-i64 || return 1
    mpirun_np 2 "$DTENGINE" prefill --init-from "$FIX/llama3" --data "$TMPD/doc.npy" \
        --seq-len 48 >"$TMPD/doc-prefill.log" 2>&1 || { cat "$TMPD/doc-prefill.log"; return 1; }
    mpirun_np 2 "$DTENGINE" train --init-from "$FIX/llama3" --data "$TMPD/doc.npy" \
        --seq-len 48 --steps 2 --lr 1e-3 >"$TMPD/doc-train.log" 2>&1 ||
        { cat "$TMPD/doc-train.log"; return 1; }
    _a=$(loss "$TMPD/doc-prefill.log")
    _b=$(awk '$1 == "step" && $2 == 0 { print $4 }' "$TMPD/doc-train.log")
    awk -v a="$_a" -v b="$_b" 'BEGIN { d = a - b; if (d < 0) d = -d;
        printf "prefill %s, train step 0 %s\n", a, b; exit !(a != "" && d <= 1e-6 * a) }'
}
check "train --init-from: step 0's loss equals prefill's on the same tokens" t_train

t_plan() {
    "$DTCTL" plan --model "$FIX/llama3" --kind prefill --tokens 1M --json >"$TMPD/plan.json" \
        2>&1 || { cat "$TMPD/plan.json"; return 1; }
    tr -d ' \n' <"$TMPD/plan.json" | grep -o '"model":{[^}]*}' >"$TMPD/plan.model"
    grep -q '"dim":32,"layers":2,"heads":4,"kv_heads":2,"ffn":64,"vocab":128,"head_dim":8,' \
        "$TMPD/plan.model" && grep -q '"rope_scaling":"llama3"' "$TMPD/plan.model" &&
        grep -q '"tied":false' "$TMPD/plan.model" || { cat "$TMPD/plan.model"; return 1; }
    cat "$TMPD/plan.model"
}
check "dtctl plan --model DIR plans the directory's model (config.json)" t_plan

# ---- bad directories: refused before any compute, naming file and key ----------

# broken NAME EDIT: a copy of the plain model with config.json edited by
# sed; 1 when the edit changed nothing (it would test the plain model)
broken() {
    rm -rf "$TMPD/$1"
    cp -r "$FIX/plain" "$TMPD/$1" && sed -i "$2" "$TMPD/$1/config.json" || return 1
    ! cmp -s "$FIX/plain/config.json" "$TMPD/$1/config.json" ||
        { echo "sed '$2' did not change config.json"; return 1; }
}
# refused DIR WORDS... [-- ARGS]: prefill exits 2 before any layer, saying WORDS
refused() {
    _dir=$1
    shift
    "$DTENGINE" prefill --init-from "$_dir" --data "$FIX/tokens.npy" --seq-len 48 \
        >"$TMPD/bad.log" 2>&1
    _rc=$?
    [ "$_rc" -eq 2 ] || { echo "exit $_rc, want 2"; cat "$TMPD/bad.log"; return 1; }
    ! grep -q '^layer ' "$TMPD/bad.log" || { echo "it computed"; return 1; }
    for _w in "$@"; do
        grep -qF -- "$_w" "$TMPD/bad.log" || { echo "no '$_w' in:"; cat "$TMPD/bad.log"; return 1; }
    done
    head -n 1 "$TMPD/bad.log"
}
t_missing() { broken miss '/"hidden_size"/d' && refused "$TMPD/miss" config.json hidden_size; }
check "config.json without hidden_size: refused naming it" t_missing
t_contra() {
    broken contra 's/"num_key_value_heads": 2/"num_key_value_heads": 3/' &&
        refused "$TMPD/contra" config.json num_key_value_heads
}
check "num_key_value_heads 3 with 4 heads: refused naming the key" t_contra
t_arch() {
    broken arch 's/LlamaForCausalLM/MistralForCausalLM/' &&
        refused "$TMPD/arch" config.json MistralForCausalLM
}
check "another architecture: refused naming it" t_arch
t_trunc() {
    rm -rf "$TMPD/trunc" && cp -r "$FIX/plain" "$TMPD/trunc" &&
        shorten_file "$TMPD/trunc/model.safetensors" -100 &&
        refused "$TMPD/trunc" model.safetensors
}
check "a truncated model.safetensors: refused naming the file" t_trunc
t_against() {
    "$DTENGINE" prefill --init-from "$FIX/plain" --dim 64 --data "$FIX/tokens.npy" \
        --seq-len 48 >"$TMPD/against.log" 2>&1
    _rc=$?
    [ "$_rc" -eq 2 ] && grep -qF "key 'dim' = 64, but $FIX/plain/config.json has hidden_size 32" \
        "$TMPD/against.log" || { echo "exit $_rc"; cat "$TMPD/against.log"; return 1; }
    head -n 1 "$TMPD/against.log"
}
check "--dim 64 against the file's hidden_size 32: refused naming both" t_against

# ---- positions in checkpoints ------------------------------------------------

t_prefill_resume() {
    _c="$TMPD/pck"
    prefill 2 llama3 1000000 zigzag "$TMPD/pfull" >"$TMPD/pfull.log" 2>&1 ||
        { cat "$TMPD/pfull.log"; return 1; }
    prefill 2 llama3 1000000 zigzag "$TMPD/pa" --ckpt-dir "$_c" --stop-after-layer 1 \
        >"$TMPD/pa.log" 2>&1
    [ $? -eq 3 ] || { echo "the stop after layer 1 did not exit 3"; cat "$TMPD/pa.log"; return 1; }
    prefill 2 llama3 0 zigzag "$TMPD/pb" --ckpt-dir "$_c" --resume >"$TMPD/pb.log" 2>&1
    [ $? -eq 2 ] && grep -q 'position 1000000 (pos_offset), this run.s starts at 0' \
        "$TMPD/pb.log" || { echo "a resume at 0 was not refused:"; cat "$TMPD/pb.log"; return 1; }
    prefill 2 llama3 1000000 zigzag "$TMPD/pc" --ckpt-dir "$_c" --resume >"$TMPD/pc.log" 2>&1 ||
        { cat "$TMPD/pc.log"; return 1; }
    [ -n "$(sha "$TMPD/pc.log")" ] && [ "$(sha "$TMPD/pc.log")" = "$(sha "$TMPD/pfull.log")" ] ||
        { echo "resumed $(sha "$TMPD/pc.log") vs $(sha "$TMPD/pfull.log")"; return 1; }
    grep -m 1 'pos_offset' "$TMPD/pb.log"
}
check "prefill at 1,000,000: a resume at 0 refused, at 1,000,000 the same logits" \
    t_prefill_resume

t_train_resume() {
    _c="$TMPD/tck"
    "$DTENGINE" train --model tiny --data recall --seq-len 64 --steps 2 --pos-offset 5000 \
        --ckpt-dir "$_c" --ckpt-every 1 >"$TMPD/ta.log" 2>&1 || { cat "$TMPD/ta.log"; return 1; }
    "$DTENGINE" train --model tiny --data recall --seq-len 64 --steps 3 --ckpt-dir "$_c" \
        --ckpt-every 1 --resume >"$TMPD/tb.log" 2>&1
    [ $? -eq 2 ] && grep -q 'position 5000 (pos_offset), this run.s starts at 0' "$TMPD/tb.log" ||
        { echo "a resume at 0 was not refused:"; cat "$TMPD/tb.log"; return 1; }
    "$DTENGINE" train --model tiny --data recall --seq-len 64 --steps 3 --pos-offset 5000 \
        --ckpt-dir "$_c" --ckpt-every 1 --resume >"$TMPD/tc.log" 2>&1 ||
        { cat "$TMPD/tc.log"; return 1; }
    grep -m 1 'resuming from' "$TMPD/tc.log"
}
check "train at 5000: a resume at 0 refused, at 5000 resumed" t_train_resume

t_docs() {
    for _r in 1 2 4; do
        _d="$TMPD/docs-$_r"
        mpirun_np $_r "$DTENGINE" prefill --init-from "$FIX/plain" --data "$FIX/docs_tokens.npy" \
            --seq-len 48 --last 48 --doc-mask eot --doc-positions reset --out-dir "$_d" \
            >"$_d.log" 2>&1 || { cat "$_d.log"; return 1; }
        "$NPYTOOL" cmp "$_d/logits.npy" "$FIX/docs_logits.npy" --rtol 1e-4 --atol 1e-5 &&
            "$DTCTL" nll "$_d" --out "$_d/nll.npy" >"$_d.nll" 2>&1 &&
            "$NPYTOOL" cmp "$_d/nll.npy" "$FIX/docs_nll.npy" --atol 1e-5 --nan-same || return 1
    done
    # the comparison can fail: without the documents the logits move
    prefill 1 plain 0 zigzag "$TMPD/docs-none" --data "$FIX/docs_tokens.npy" \
        >"$TMPD/docs-none.log" 2>&1 &&
        ! "$NPYTOOL" cmp "$TMPD/docs-none/logits.npy" "$FIX/docs_logits.npy" --rtol 1e-4 \
            --atol 1e-5 >/dev/null
}
check "packed documents, positions reset in each (eot_token from config.json): logits and NLL as transformers' per-document position ids (R = 1 2 4)" \
    t_docs

finish
