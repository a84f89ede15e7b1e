#!/bin/sh
# SPDX-License-Identifier: MIT
#
# dtctl export: a training checkpoint as a Hugging Face model directory
# (issue 16), read back by dtengine --init-from. tests/fixtures/hf_llama
# holds a tiny LlamaForCausalLM that transformers wrote:
#   - round trip: train --init-from the fixture on 2 ranks for one step at
#     lr 0 (a checkpoint of the fixture's own weights in 2 slices), export:
#     every tensor of the export is the fixture's bit for bit (name, dtype,
#     shape and bytes; npytool sttensors), the files are readable by others
#     (0644, not a checkpoint's 0600), and prefill --init-from the export
#     gives the fixture's logits (their sha256);
#   - after 3 real training steps, the checkpoint root exports its newest
#     step: at fp32 train --init-from the export holds exactly the
#     parameters the training ended with (params_sha256); at bf16 in
#     shards of 20K a valid sharded directory (index, 3 or more shards,
#     BF16 tensors) that prefill --init-from loads;
#   - bad input, refused with exit 2 naming what and where, nothing
#     written: a prefill's checkpoint, a corrupt shard, an OUT that holds
#     a model, a bad --dtype or --shard-size;
#   - a job id: a train job run by dtcoordd and dtagentd (when munged is
#     installed) exports its newest committed checkpoint, whose parameters
#     are the job's result checksum.
. "$(dirname "$0")/lib.sh"
need_mpirun

FIX=$DT_SRCDIR/tests/fixtures/hf_llama
DTCTL=$DT_BUILDDIR/cli/dtctl
[ -x "$DTCTL" ] || die "$DTCTL is not built"
[ -f "$FIX/plain/model.safetensors" ] || die "no fixture at $FIX"
umask 022

"$NPYTOOL" tokbin "$TMPD/tok.npy" --n 4096 --vocab 128 --seed 7 --format npy-i64 ||
    die "npytool tokbin failed"

train() { # R ARGS...: dtengine train on the token file, 64 tokens a step
    _r=$1
    shift
    mpirun_np "$_r" "$DTENGINE" train --data "$TMPD/tok.npy" --seq-len 64 "$@"
}
prefill() { # MODELDIR: prefill of the token file's first 64 tokens on 2 ranks
    mpirun_np 2 "$DTENGINE" prefill --init-from "$1" --data "$TMPD/tok.npy" --seq-len 64 \
        --last 64
}
sha() { sed -n 's/^result: .*logits_sha256=\([0-9a-f]*\)$/\1/p' "$1"; }
params_sha() { sed -n 's/^result: .*params_sha256=\([0-9a-f]*\) .*$/\1/p' "$1"; }
# mode FILE: its permission bits as ls shows them (-rw-r--r--)
mode() { ls -l "$1" | cut -c1-10; }

# ---- round trip ----------------------------------------------------------------

t_roundtrip() {
    train 2 --init-from "$FIX/plain" --steps 1 --lr 0 --min-lr 0 --ckpt-dir "$TMPD/ck0" \
        --ckpt-every 1 >"$TMPD/ck0.log" 2>&1 || { cat "$TMPD/ck0.log"; return 1; }
    "$DTCTL" export "$TMPD/ck0/step-00000001" --hf "$TMPD/x0" >"$TMPD/x0.log" 2>&1 ||
        { cat "$TMPD/x0.log"; return 1; }
    grep -q "^exported .*step-00000001 (step 1, 2 ranks) to .*x0: 21 tensors, fp32, 107136 " \
        "$TMPD/x0.log" || { cat "$TMPD/x0.log"; return 1; }
    "$NPYTOOL" sttensors "$FIX/plain/model.safetensors" >"$TMPD/fix.tensors" &&
        "$NPYTOOL" sttensors "$TMPD/x0/model.safetensors" >"$TMPD/x0.tensors" || return 1
    [ "$(wc -l <"$TMPD/fix.tensors")" -eq 21 ] || { cat "$TMPD/fix.tensors"; return 1; }
    cmp -s "$TMPD/fix.tensors" "$TMPD/x0.tensors" ||
        { diff "$TMPD/fix.tensors" "$TMPD/x0.tensors"; return 1; }
    echo "21 tensors (F32) bit-identical to the fixture's"
}
check "export of a checkpoint of the fixture's weights: every tensor bit-identical" t_roundtrip

t_modes() {
    for _f in config.json model.safetensors; do
        [ "$(mode "$TMPD/x0/$_f")" = "-rw-r--r--" ] || { ls -l "$TMPD/x0"; return 1; }
    done
    [ "$(mode "$TMPD/ck0/step-00000001/shard-00000-of-00002.safetensors")" = "-rw-------" ] ||
        { ls -l "$TMPD/ck0/step-00000001"; return 1; }
    echo "export 0644, checkpoint shards 0600"
}
check "exported files are readable by others, the checkpoint's are not" t_modes

t_prefill_same() {
    prefill "$FIX/plain" >"$TMPD/p-fix.log" 2>&1 || { cat "$TMPD/p-fix.log"; return 1; }
    prefill "$TMPD/x0" >"$TMPD/p-x0.log" 2>&1 || { cat "$TMPD/p-x0.log"; return 1; }
    _want=$(sha "$TMPD/p-fix.log") _got=$(sha "$TMPD/p-x0.log")
    [ -n "$_want" ] && [ "$_got" = "$_want" ] || { echo "export $_got, fixture $_want"; return 1; }
    echo "logits_sha256=$_got"
}
check "prefill --init-from the export: the fixture's logits, bit for bit" t_prefill_same

# ---- after training -------------------------------------------------------------

t_trained() {
    train 2 --init-from "$FIX/plain" --steps 3 --lr 1e-2 --ckpt-dir "$TMPD/ck3" \
        --ckpt-every 1 --ckpt-keep 5 >"$TMPD/ck3.log" 2>&1 || { cat "$TMPD/ck3.log"; return 1; }
    # the root: its newest step
    "$DTCTL" export "$TMPD/ck3" --hf "$TMPD/x3" >"$TMPD/x3.log" 2>&1 &&
        grep -q "(step 3, 2 ranks)" "$TMPD/x3.log" || { cat "$TMPD/x3.log"; return 1; }
    train 1 --init-from "$TMPD/x3" --steps 0 >"$TMPD/x3-load.log" 2>&1 ||
        { cat "$TMPD/x3-load.log"; return 1; }
    _want=$(params_sha "$TMPD/ck3.log") _got=$(params_sha "$TMPD/x3-load.log")
    [ -n "$_want" ] && [ "$_want" = "$_got" ] ||
        { echo "trained $_want, loaded from the export $_got"; return 1; }
    echo "params_sha256=$_got"
}
check "export after 3 steps (from the root): loaded back, exactly the trained parameters" \
    t_trained

t_bf16_shards() {
    "$DTCTL" --json export "$TMPD/ck3/step-00000003" --hf "$TMPD/x3b" --dtype bf16 \
        --shard-size 20K >"$TMPD/x3b.json" 2>&1 || { cat "$TMPD/x3b.json"; return 1; }
    grep -q '"dtype": "bf16"' "$TMPD/x3b.json" && grep -q '"tensors": 21' "$TMPD/x3b.json" &&
        grep -q '"bytes": 53568' "$TMPD/x3b.json" || { cat "$TMPD/x3b.json"; return 1; }
    [ -f "$TMPD/x3b/model.safetensors.index.json" ] && [ ! -e "$TMPD/x3b/model.safetensors" ] ||
        { ls -l "$TMPD/x3b"; return 1; }
    _n=$(ls "$TMPD/x3b" | grep -c '^model-0000[0-9]-of-0000[0-9]\.safetensors$')
    [ "$_n" -ge 3 ] || { ls -l "$TMPD/x3b"; return 1; }
    grep -q '"torch_dtype": "bfloat16"' "$TMPD/x3b/config.json" || return 1
    "$NPYTOOL" sttensors "$TMPD/x3b"/model-*.safetensors >"$TMPD/x3b.tensors" || return 1
    [ "$(grep -c ' BF16 ' "$TMPD/x3b.tensors")" -eq 21 ] || { cat "$TMPD/x3b.tensors"; return 1; }
    # every shard is in the index, every tensor once
    for _s in "$TMPD/x3b"/model-*.safetensors; do
        grep -q "\"$(basename "$_s")\"" "$TMPD/x3b/model.safetensors.index.json" || return 1
    done
    prefill "$TMPD/x3b" >"$TMPD/p-x3b.log" 2>&1 || { cat "$TMPD/p-x3b.log"; return 1; }
    _got=$(sha "$TMPD/p-x3b.log") _fix=$(sha "$TMPD/p-fix.log")
    [ -n "$_got" ] && [ "$_got" != "$_fix" ] ||
        { echo "trained bf16 logits $_got, the fixture's $_fix"; return 1; }
    echo "$_n shards, 21 BF16 tensors, prefill loads them"
}
check "export at bf16 in shards of 20K: a sharded directory prefill --init-from loads" \
    t_bf16_shards

# ---- bad input: exit 2, named, nothing written ------------------------------------

# refused OUT WORDS... -- ARGS...: dtctl export ARGS exits 2 saying every
# WORD, and OUT is not there afterwards
refused() {
    _out=$1
    shift
    _words=
    while [ "$1" != -- ]; do
        _words="$_words
$1"
        shift
    done
    shift
    "$DTCTL" export "$@" >"$TMPD/bad.log" 2>&1
    _rc=$?
    [ "$_rc" -eq 2 ] || { echo "exit $_rc, want 2"; cat "$TMPD/bad.log"; return 1; }
    printf '%s\n' "$_words" | while IFS= read -r _w; do
        [ -z "$_w" ] || grep -qF -- "$_w" "$TMPD/bad.log" ||
            { echo "no '$_w' in:"; cat "$TMPD/bad.log"; exit 1; }
    done || return 1
    [ ! -e "$_out" ] || { echo "$_out was written:"; ls -l "$_out"; return 1; }
    head -n 1 "$TMPD/bad.log"
}

t_prefill_ckpt() {
    mpirun_np 2 "$DTENGINE" prefill --init-from "$FIX/plain" --data "$TMPD/tok.npy" \
        --seq-len 64 --ckpt-dir "$TMPD/pck" --ckpt-every 1 --stop-after-layer 1 \
        >"$TMPD/pck.log" 2>&1
    [ $? -eq 3 ] || { cat "$TMPD/pck.log"; return 1; }
    refused "$TMPD/xp" "$TMPD/pck/step-00000001" "a prefill checkpoint" "not parameters" -- \
        "$TMPD/pck" --hf "$TMPD/xp"
}
check "a prefill's checkpoint: refused (its shards hold no parameters)" t_prefill_ckpt

t_corrupt() {
    cp -r "$TMPD/ck0" "$TMPD/bad" || return 1
    _f=$TMPD/bad/step-00000001/shard-00001-of-00002.safetensors
    # one byte of the parameters changed, the size kept
    corrupt_bytes "$_f" 4000 || return 1
    refused "$TMPD/xc" "$TMPD/bad/step-00000001" "shard-00001-of-00002.safetensors is corrupt" \
        -- "$TMPD/bad/step-00000001" --hf "$TMPD/xc" || return 1
    # from the root: passed over, and then there is none
    refused "$TMPD/xc" "skipping" "no checkpoint here" -- "$TMPD/bad" --hf "$TMPD/xc"
}
check "a corrupt shard: refused naming it, directly and from the root" t_corrupt

t_nonempty() {
    mkdir -p "$TMPD/full" && echo '{"keep": "me"}' >"$TMPD/full/config.json" || return 1
    refused "$TMPD/full/model.safetensors" "$TMPD/full/config.json: already exists" -- \
        "$TMPD/ck0" --hf "$TMPD/full" || return 1
    [ "$(cat "$TMPD/full/config.json")" = '{"keep": "me"}' ] &&
        [ "$(ls "$TMPD/full")" = config.json ] || { ls -l "$TMPD/full"; return 1; }
}
check "an OUT that holds a model: refused, left as it was" t_nonempty

t_usage() {
    refused "$TMPD/xu" "--dtype 'fp8': fp32, bf16 or fp16" -- "$TMPD/ck0" --hf "$TMPD/xu" \
        --dtype fp8 || return 1
    refused "$TMPD/xu" "--shard-size '5X'" -- "$TMPD/ck0" --hf "$TMPD/xu" --shard-size 5X ||
        return 1
    refused "$TMPD/xu" "--hf OUT is required" -- "$TMPD/ck0" || return 1
    refused "$TMPD/xu" "$TMPD/none: No such file" -- "$TMPD/none" --hf "$TMPD/xu"
}
check "bad options and a missing source: exit 2" t_usage

# ---- a job id, through the coordinator -----------------------------------------

if ! command -v munged >/dev/null 2>&1 && [ ! -x /usr/sbin/munged ] && [ ! -x /sbin/munged ]; then
    echo "# dtctl export JOB not tested: munged is not installed"
    finish
fi
. "$(dirname "$0")/coordlib.sh"
DTAGENTD=$DT_BUILDDIR/agent/dtagentd
[ -x "$DTAGENTD" ] || die "$DTAGENTD is not built"
munge_start
coord_setup
coord_start || die "dtcoordd did not start"

t_job() {
    cat >"$TMPD/job.spec" <<SPEC
kind = train
name = export-me
init_from = $FIX/plain
data = $TMPD/tok.npy
tokens = 64
steps = 2
ckpt_every = 1
lr = 0.01
seed = 3
ranks = 2
gpu = cpu
SPEC
    _j=$(submit "$TMPD/job.spec")
    [ -n "$_j" ] || { ctl submit "$TMPD/job.spec"; return 1; }
    agent a0 2 "$_j"
    finish_job "$_j"
    [ "$(state_of "$_j")" = completed ] || { ctl show "$_j"; cat "$TMPD"/agents/*.log; return 1; }
    ctl export "$_j" --hf "$TMPD/xj" >"$TMPD/xj.log" 2>&1 &&
        grep -q "(step 2, 2 ranks)" "$TMPD/xj.log" || { cat "$TMPD/xj.log"; return 1; }
    train 1 --init-from "$TMPD/xj" --steps 0 >"$TMPD/xj-load.log" 2>&1 ||
        { cat "$TMPD/xj-load.log"; return 1; }
    _want=$(checksum_of "$_j") _got=$(params_sha "$TMPD/xj-load.log")
    [ -n "$_want" ] && [ "$_want" = "$_got" ] ||
        { echo "the job's checksum $_want, loaded from the export $_got"; return 1; }
    echo "job $_j: step 2, params_sha256=$_got"
}
check "dtctl export JOB: its newest committed checkpoint, the job's parameters" t_job

finish
