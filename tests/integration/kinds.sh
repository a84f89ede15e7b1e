#!/bin/sh
# SPDX-License-Identifier: MIT
#
# attn and prefill jobs through the agents, as a user submits them: a
# private munged and dtcoordd, two dtagentd of 2 dtengine workers each
# (three where a spare is wanted). Each job must do what `mpirun -np 4
# dtengine KIND --spec` does on the same spec, put its outputs where the
# spec says (by default the job directory's output/), and name them in
# `dtctl show`; faults are recovered:
#   - attn: the same files byte for byte (o, lse, pos per rank and the
#     attn.json manifest, whose SHA-256 is the job's checksum); output_dir
#     in the spec; a worker killed during the attention (the generation
#     runs it again, same files); `dtctl checkpoint` and `cancel
#     --checkpoint` refused (it has no checkpoints);
#   - prefill: the loss and the last logits' digest; a checkpoint per layer
#     committed by the coordinator; a worker killed after layer 2 (resumes
#     at the newest committed layer: the same digest bit for bit); an
#     agent killed without a spare (re-planned on 2 ranks, the layer
#     checkpoint of 4 ranks resharded: the loss within 1e-5);
#   - a long attention whose ring steps outlast the agents' hang timeout
#     is not taken for a hang (the engine's heartbeats between tiles).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/coordlib.sh"
need_mpirun

DTAGENTD=$DT_BUILDDIR/agent/dtagentd
[ -x "$DTAGENTD" ] || die "$DTAGENTD is not built"

munge_start
coord_setup
coord_start || die "dtcoordd did not start"

# 4 s: a worker blocked in an MPI collective (the barrier before the
# attention, the statistics' allreduce) sends no heartbeat while it waits
# for a peer, and under make -j2's load a peer can be 2 s behind (CI saw
# a worker_hung at 2 s); the ring steps' own waits tick
HANG=4s
# the long attention's first size (doubled while it ends before the kill)
# and the prefill's tokens: a sanitized engine computes several times
# slower, so half as many tokens there still outlast the kills (the
# heartbeats' check against the 4 s timeout is the main build's)
LONG=32768
PREFILL_T=16384
if [ -n "${DT_SANITIZERS:-}" ]; then
    HANG=15s
    LONG=16384
    PREFILL_T=8192
fi

# attn_spec T [more lines]: an attention of T tokens, 4 ranks, 8 heads
# over 2 KV heads of dimension 32
attn_spec() {
    cat <<SPEC
kind = attn
model = custom
dim = 256
layers = 1
heads = 8
kv_heads = 2
ffn = 128
vocab = 64
tokens = $1
seed = 5
ranks = 4
gpu = cpu
nodes = 2
gpus_per_node = 2
SPEC
}

prefill_spec() { # T
    cat <<SPEC
kind = prefill
tokens = $1
seed = 3
ranks = 4
gpu = cpu
nodes = 2
gpus_per_node = 2
SPEC
}

# run_job SPEC: submit it, two agents of 2 slots, wait for the end; J
run_job() {
    J=$(submit "$1")
    agent a0 2 "$J"
    agent a1 2 "$J"
    finish_job "$J"
}

# same_files DIR1 DIR2: every file of DIR1 is in DIR2 with the same bytes,
# and both have as many
same_files() {
    _n=0
    for _f in "$1"/*; do
        cmp "$_f" "$2/$(basename "$_f")" || return 1
        _n=$((_n + 1))
    done
    [ "$_n" -gt 0 ] && [ "$(ls "$2" | wc -l)" = "$_n" ] ||
        { echo "$_n files in $1, $(ls "$2" | wc -l) in $2"; return 1; }
    echo "$_n files equal"
}

show_names() { # JOB PATH: dtctl show names the output, and has a result line
    ctl show "$1" >"$TMPD/show.out" 2>&1
    grep -q "^  outputs   $2\$" "$TMPD/show.out" && grep -q "^  result    steps=" "$TMPD/show.out" &&
        return 0
    echo "dtctl show $1 does not name $2:"
    sed 's/^/  | /' "$TMPD/show.out" | head -n 30
    return 1
}

no_workers_left() {
    _nw=$(pgrep -f "dtengine (attn|prefill).*$TMPD" || true)
    [ -z "$_nw" ] || { echo "workers left: $_nw"; return 1; }
}

# ---- attn ------------------------------------------------------------------------
attn_spec 1024 >"$TMPD/attn.spec"
run_job "$TMPD/attn.spec"
OUT=$COORD_STATE/jobs/$J/output
check "attn: the job completed" completed "$J"
mpirun_np 4 "$DTENGINE" attn --spec "$TMPD/attn.spec" --out-dir "$TMPD/attn-direct" \
    >"$TMPD/attn-direct.log" 2>&1
check "attn: the outputs equal mpirun -np 4 dtengine attn's, file by file" \
    same_files "$TMPD/attn-direct" "$OUT"
ATTN_SUM=$(sed -n 's/^output: .* sha256=\([0-9a-f]*\)$/\1/p' "$TMPD/attn-direct.log")
check "attn: the checksum is the manifest's SHA-256, as the direct run's" \
    test -n "$ATTN_SUM" -a "$(checksum_of "$J")" = "$ATTN_SUM"
check "attn: dtctl show names the manifest in the job directory" show_names "$J" "$OUT/attn.json"
check "attn: the manifest lists 4 ranks' o, lse and pos" \
    sh -c "grep -q '\"format\": \"dt-attn-1\"' '$OUT/attn.json' &&
           grep -q '\"ranks\": 4' '$OUT/attn.json' && grep -q 'lse.3.npy' '$OUT/attn.json'"
check "attn: no worker left" no_workers_left

{
    attn_spec 1024
    echo "output_dir = $TMPD/elsewhere/attn"
} >"$TMPD/attn-dir.spec"
run_job "$TMPD/attn-dir.spec"
check "attn, output_dir: completed, the outputs there and named" \
    sh -c "[ -f '$TMPD/elsewhere/attn/o.3.npy' ] && [ ! -e '$COORD_STATE/jobs/$J/output' ]"
check "attn, output_dir: dtctl show names it" show_names "$J" "$TMPD/elsewhere/attn/attn.json"

# long enough (seconds here) for a kill during the attention; each rank's
# ring steps then take seconds, near the 4 s hang timeout. The test acts once the
# generation runs, never after a fixed wait. A try whose attention ended
# before the kill came (a machine faster than the work is long) shows
# nothing either way: it is run again with twice the tokens.
running() { [ "$(state_of "$1")" = running ]; }
running_or_ended() { running "$1" || terminal "$1"; }
t_attn_no_ckpt() {
    run_rc 1 ctl checkpoint "$J" && out_has "kind = attn, which has no checkpoints" &&
        run_rc 1 ctl cancel "$J" --checkpoint && out_has "cancel it without --checkpoint" &&
        [ "$(state_of "$J")" = running ]
}
t_kill_running() { # AGENT: job J runs, and a worker of AGENT is killed
    running "$J" || { echo "job $J is $(state_of "$J"), not running"; return 1; }
    _kr=$(worker_of "$1" "$J")
    [ -n "$_kr" ] || { echo "agent $1 runs no worker of job $J"; return 1; }
    kill -KILL "$_kr" && echo "worker $_kr of $1 killed while job $J runs"
}
# keep NAME CMD...: run CMD now, its output and status kept for `check ... replay NAME`
keep() {
    _kp=$1
    shift
    "$@" >"$TMPD/$_kp.kept" 2>&1
    echo $? >"$TMPD/$_kp.rc"
}
replay() {
    cat "$TMPD/$1.kept"
    return "$(cat "$TMPD/$1.rc")"
}
# ended_first: job J completed in its first generation with no worker failed
ended_first() {
    [ "$(state_of "$J")" = completed ] && ctl events "$J" >"$TMPD/ev.out" 2>&1 &&
        ! grep -q -E 'worker_failed|generation_started .*gen=2 ' "$TMPD/ev.out"
}
while :; do
    attn_spec $LONG >"$TMPD/attn-long.spec"
    J=$(submit "$TMPD/attn-long.spec")
    agent a0 2 "$J"
    agent a1 2 "$J"
    wait_for 120 running_or_ended "$J" # else the checks below say what it is
    keep long-ckpt t_attn_no_ckpt
    keep long-kill t_kill_running a1
    finish_job "$J"
    ended_first && [ "$LONG" -lt 262144 ] || break
    echo "attn, long: $LONG tokens ended before the kill (job $J); again with $((LONG * 2))"
    LONG=$((LONG * 2))
done
check "attn, long: running when the worker is killed" replay long-kill
check "attn, long: checkpoint and cancel --checkpoint refused (no checkpoints), it runs on" \
    replay long-ckpt
check "attn, long: the job completed" completed "$J"
check "attn, long: the kill is an event, and a second generation ran it again" \
    has_event "$J" worker_failed "signal 9"
check "attn, long: no hang was seen (heartbeats during the ring steps)" \
    sh -c "! '$DTCTL' --socket '$COORD_SOCK' events $J | grep -q worker_hung"
mpirun_np 4 "$DTENGINE" attn --spec "$TMPD/attn-long.spec" --out-dir "$TMPD/attn-long" \
    >"$TMPD/attn-long.log" 2>&1
check "attn, long: the same files as the direct run" \
    same_files "$TMPD/attn-long" "$COORD_STATE/jobs/$J/output"
check "attn, long: no worker left" no_workers_left

# ---- prefill ---------------------------------------------------------------------
prefill_spec "$PREFILL_T" >"$TMPD/prefill.spec"
run_job "$TMPD/prefill.spec"
check "prefill: the job completed" completed "$J"
REF=$(checksum_of "$J")
REF_LOSS=$(loss_of "$J")
mpirun_np 4 "$DTENGINE" prefill --spec "$TMPD/prefill.spec" >"$TMPD/prefill-direct.log" 2>&1
check "prefill: the logits' digest equals mpirun -np 4 dtengine prefill's" \
    grep -q "logits_sha256=$REF\$" "$TMPD/prefill-direct.log"
t_prefill_loss() {
    _dl=$(sed -n 's/^prefill: tokens=.* loss \([-0-9.e+]*\)$/\1/p' "$TMPD/prefill-direct.log")
    near "$REF_LOSS" "$_dl" 1e-9 || { echo "loss '$REF_LOSS', direct '$_dl'"; return 1; }
    echo "loss $REF_LOSS"
}
check "prefill: the loss equals the direct run's" t_prefill_loss
check "prefill: dtctl show names the logits" show_names "$J" "$COORD_STATE/jobs/$J/output/logits.npy"
check "prefill: the logits are (1, vocab) float32" \
    sh -c "head -c 128 '$COORD_STATE/jobs/$J/output/logits.npy' | grep -q \"'shape': (1, 512)\""
check "prefill: a checkpoint per layer, committed by the coordinator" \
    sh -c "'$DTCTL' --socket '$COORD_SOCK' checkpoints $J | grep -cE '^ *[1-4] +committed' | grep -qx 3"
check "prefill: no worker left" no_workers_left

# ---- a Hugging Face model's prefill of a document, at 1,000,000 ----------------
# dtctl reads the model directory's config.json (the coordinator plans with
# the keys it sends); the workers read its weights and the token file
FIX=$DT_SRCDIR/tests/fixtures/hf_llama
cat >"$TMPD/hf.spec" <<SPEC
kind = prefill
init_from = $FIX/llama3
data = $FIX/tokens.npy
tokens = 48
pos_offset = 1000000
ranks = 4
gpu = cpu
nodes = 2
gpus_per_node = 2
SPEC
run_job "$TMPD/hf.spec"
check "hf prefill: the job completed" completed "$J"
t_hf_direct() {
    mpirun_np 4 "$DTENGINE" prefill --spec "$TMPD/hf.spec" >"$TMPD/hf-direct.log" 2>&1 ||
        { cat "$TMPD/hf-direct.log"; return 1; }
    _r=$(sed -n 's/^result: .*logits_sha256=\([0-9a-f]*\)$/\1/p' "$TMPD/hf-direct.log")
    [ -n "$_r" ] && [ "$(checksum_of "$J")" = "$_r" ] ||
        { echo "job $(checksum_of "$J"), direct '$_r'"; return 1; }
}
check "hf prefill: the logits' digest equals mpirun -np 4 dtengine prefill's" t_hf_direct
t_hf_show() {
    ctl show "$J" >"$TMPD/show.out" 2>&1
    grep -q "^  result    steps=2 loss=[0-9.]* ppl=[0-9.]* " "$TMPD/show.out" &&
        grep -q "^  outputs   $COORD_STATE/jobs/$J/output/perplexity.json\$" "$TMPD/show.out" &&
        grep -q "^    \[524288, 1048576)  targets=47 nll=[0-9.]* ppl=" "$TMPD/show.out" ||
        { sed 's/^/  | /' "$TMPD/show.out"; return 1; }
    grep -E 'ppl|targets=' "$TMPD/show.out"
}
check "hf prefill: dtctl show reports the perplexity, by position bucket too" t_hf_show
check "hf prefill: no worker left" no_workers_left

same_checksum() { # JOB
    _sc=$(checksum_of "$1")
    [ -n "$_sc" ] && [ "$_sc" = "$REF" ] && { echo "$_sc"; return 0; }
    echo "checksum '$_sc', fault-free '$REF'"
    return 1
}

J=$(submit "$TMPD/prefill.spec")
agent a0 2 "$J"
agent a1 2 "$J"
wait_for 120 step_at_least "$J" 2
kill -KILL "$(worker_of a1 "$J")"
finish_job "$J"
check "prefill, worker killed: the job completed" completed "$J"
check "prefill, worker killed: resumed from the agents' memory after a layer (mem_ckpt_every = 1)" \
    has_event "$J" resumed_step "gen=2: resumed step [1-3] from memory"
check "prefill, worker killed: the engine loaded its in-memory copy" \
    sh -c "grep -q 'resuming from the in-memory checkpoint of layer [1-3]' '$COORD_STATE/jobs/$J/logs/rank-0.log'"
check "prefill, worker killed: the same logits bit for bit" same_checksum "$J"
check "prefill, worker killed: no worker left" no_workers_left

J=$(submit "$TMPD/prefill.spec")
agent a0 2 "$J"
agent a1 2 "$J"
wait_for 120 step_at_least "$J" 2
kill -KILL "$AGENT_a1"
finish_job "$J"
check "prefill, agent killed, no spare: the job completed" completed "$J"
check "prefill, agent killed, no spare: re-planned on 2 ranks" has_event "$J" replanned "4 -> 2"
check "prefill, agent killed, no spare: a checkpoint of 4 ranks resharded onto 2" \
    sh -c "grep -q 'after layer [1-3] of 4 (written by 4 ranks)' '$COORD_STATE/jobs/$J/logs/rank-0.log'"
t_replan_loss() {
    _l=$(loss_of "$J")
    near "$_l" "$REF_LOSS" 1e-5 || { echo "loss '$_l', fault-free '$REF_LOSS'"; return 1; }
    echo "loss $_l, fault-free $REF_LOSS"
}
check "prefill, agent killed, no spare: the loss within 1e-5 of the fault-free run" t_replan_loss
check "prefill, agent killed: no worker left" no_workers_left

finish
