#!/bin/sh
# SPDX-License-Identifier: MIT
#
# dtengine straight under Slurm, without dt's agents: `srun --mpi=pmix -n R
# dtengine ...` on a private two-node cluster on this host (dt-cluster,
# ports from 17400), the ranks taking their identity from Slurm's PMIx:
#   - causal zigzag dilated attention on 4 ranks equals the double-precision
#     single-process reference within 1e-5 (O and LSE), on one node and
#     across two (where Open MPI talks TCP over loopback);
#   - 4 ranks are one job of 4, not 4 singletons (one `ranks=4` line);
#   - `dtengine train` on 4 ranks under srun ends with the same result line
#     (loss and params_sha256) as under mpirun;
#   - failures are reported, not hung: a bad option on every rank is exit
#     2; one task failing before MPI_Init with --kill-on-bad-exit ends the
#     step with that task named; a rank killed mid-run ends the step with
#     137; no job is left behind.
# Open MPI's own launcher and the agents are tested elsewhere (ring.sh,
# train.sh, pmix.sh); timings are not checked.

. "$(dirname "$0")/lib.sh"
. "$DT_TESTDIR/slurmlib.sh"
need_mpirun

slurm_up 2 17400 --cpus 4
srun --mpi=list 2>&1 | grep -q pmix ||
    skip "srun has no pmix plugin (apt-get install slurm-wlm-basic-plugins)"

# Open MPI under srun: the ranks of one node over shared memory; TCP on
# loopback between the nodes, which are all this host (see below)
OMPI_MCA_pml=ob1
OMPI_MCA_btl=self,vader
export OMPI_MCA_pml OMPI_MCA_btl

# srun_t ARGS...: srun, killed after 120 s (a hang is exit 124)
srun_t() {
    if [ -n "$DT_TIMEOUT" ]; then
        "$DT_TIMEOUT" -k 5 120 srun "$@"
    else
        srun "$@"
    fi
}

# ---- (a) attention --------------------------------------------------------

T=512
H=6
HKV=2
D=16
SEED=23
SEGS=64,256,512
DILS=1,2,4
IN=$TMPD/in
gen_qkv "$IN" $T $H $HKV $D $SEED
"$NPYTOOL" ref --q "$IN/q.npy" --k "$IN/k.npy" --v "$IN/v.npy" --causal \
    --segments $SEGS --dilations $DILS --out "$TMPD/ref.o.npy" --lse "$TMPD/ref.lse.npy" ||
    die "npytool ref failed"

attn() { # OUTPREFIX SRUN-ARGS...
    _at_out=$1
    shift
    srun_t --mpi=pmix "$@" "$DTENGINE" attn --q "$IN/q.npy" --k "$IN/k.npy" --v "$IN/v.npy" \
        --causal --segments $SEGS --dilations $DILS --layout zigzag \
        --out "$_at_out.o.npy" --lse "$_at_out.lse.npy"
}

# one_job OUT: exactly one summary line, and it says 4 ranks (4 singletons
# would print four lines of ranks=1)
one_job() {
    _oj_n=$(grep -c '^dtengine attn:' "$1")
    _oj_r=$(grep -c '^dtengine attn: .* ranks=4 ' "$1")
    [ "$_oj_n" = 1 ] && [ "$_oj_r" = 1 ] && return 0
    echo "$_oj_n summary lines, $_oj_r with ranks=4:"
    sed 's/^/  | /' "$1" | head -n 20
    return 1
}

check "srun -N1 -n4 --mpi=pmix: causal zigzag dilated attn runs" \
    run_rc 0 attn "$TMPD/one" -N1 -n4
cp "$TMPD/out" "$TMPD/one.out"
check "srun -N1 -n4: one job of 4 ranks" one_job "$TMPD/one.out"
check "srun -N1 -n4: o equals the reference within 1e-5" \
    "$NPYTOOL" cmp "$TMPD/one.o.npy" "$TMPD/ref.o.npy" --atol 1e-5
check "srun -N1 -n4: lse equals the reference within 1e-5" \
    "$NPYTOOL" cmp "$TMPD/one.lse.npy" "$TMPD/ref.lse.npy" --atol 1e-5

# Two slurmd on one host: Open MPI names its shared-memory segments after
# the host name and the job, so ranks on two "nodes" here would collide on
# /dev/shm; across the nodes they talk TCP only.
attn_tcp() (
    export OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo
    attn "$@"
)
check "srun -N2 -n4 --mpi=pmix: the same across two nodes runs" \
    run_rc 0 attn_tcp "$TMPD/two" -N2 -n4 --ntasks-per-node=2
cp "$TMPD/out" "$TMPD/two.out"
check "srun -N2 -n4: one job of 4 ranks" one_job "$TMPD/two.out"
check "srun -N2 -n4: o equals the reference within 1e-5" \
    "$NPYTOOL" cmp "$TMPD/two.o.npy" "$TMPD/ref.o.npy" --atol 1e-5
check "srun -N2 -n4: lse equals the reference within 1e-5" \
    "$NPYTOOL" cmp "$TMPD/two.lse.npy" "$TMPD/ref.lse.npy" --atol 1e-5

# ---- (b) training ---------------------------------------------------------

TRAIN="train --model tiny --data recall --seq-len 256 --steps 3 --seed 5"
result() { sed -n 's/^result: //p' "$1"; }
# shellcheck disable=SC2086
mpirun_np 4 "$DTENGINE" $TRAIN >"$TMPD/train.mpirun" 2>&1 ||
    { sed 's/^/    /' "$TMPD/train.mpirun" | tail -n 20; die "dtengine train under mpirun failed"; }
# shellcheck disable=SC2086
check "srun -N1 -n4 --mpi=pmix: dtengine train runs" \
    run_rc 0 srun_t --mpi=pmix -N1 -n4 "$DTENGINE" $TRAIN
cp "$TMPD/out" "$TMPD/train.srun"
same_result() {
    _sr_a=$(result "$TMPD/train.mpirun")
    _sr_b=$(result "$TMPD/train.srun")
    [ -n "$_sr_a" ] && [ "$_sr_a" = "$_sr_b" ] && { echo "$_sr_b"; return 0; }
    echo "mpirun: result: $_sr_a"
    echo "srun:   result: $_sr_b"
    return 1
}
check "srun -N1 -n4: the result line (loss, params_sha256) equals mpirun's" same_result
check "srun -N1 -n4: the result line carries params_sha256" \
    grep -q '^result: .*params_sha256=[0-9a-f]\{64\}' "$TMPD/train.srun"

# ---- (c) failures ---------------------------------------------------------

check "a bad option on every rank: srun exits 2" \
    run_rc 2 srun_t --mpi=pmix -N1 -n4 "$DTENGINE" attn --no-such-option
check "a bad option: dtengine says which" out_has "unknown option '--no-such-option'"
check "a bad option: srun reports the tasks' exit code" \
    out_has 'tasks? [0-9,-]+: Exited with exit code 2'

# run_fails CMD...: CMD fails, and not by the timeout (124, or 137 when
# the timeout had to SIGKILL it: then "Killed" is not srun's word); its
# output is kept in $TMPD/out
run_fails() {
    "$@" >"$TMPD/out" 2>&1
    _rf_rc=$?
    if [ "$_rf_rc" -eq 0 ] || [ "$_rf_rc" -eq 124 ]; then
        [ "$_rf_rc" -eq 124 ] && _rf_rc="124 (the timeout: a hang)"
        echo "expected a failure, got exit $_rf_rc: $*"
        sed 's/^/  | /' "$TMPD/out" | head -n 30
        return 1
    fi
    echo "exit $_rf_rc"
}

# A task that fails before MPI_Init leaves the other ranks waiting in the
# PMIx fence for ever; --kill-on-bad-exit ends the step (dt's agents do
# not rely on it: they get failure events).
# shellcheck disable=SC2016
early='[ "$SLURM_PROCID" = 2 ] && exit 3
exec "$0" attn --generate 512,4,2,16 --seed 1 --causal --out "$1"'
check "one task exits 3 before MPI_Init, --kill-on-bad-exit=1: srun fails, no hang" \
    run_fails srun_t --mpi=pmix --kill-on-bad-exit=1 -N1 -n4 \
    sh -c "$early" "$DTENGINE" "$TMPD/early.o.npy"
check "one task exits 3: srun names it and its exit code" \
    out_has 'task 2: Exited with exit code 3'

# A rank killed in the middle of training (once the checkpoint of step 1
# is there): Slurm's PMIx plugin ends the whole step (no failure event
# reaches the others).
# shellcheck disable=SC2016
killed='if [ "$SLURM_PROCID" = 2 ]; then
    (n=0; while [ ! -d "$1/step-00000001" ] && [ $n -lt 900 ]; do sleep 0.1; n=$((n + 1)); done
     kill -9 $$) &
fi
exec "$0" train --model tiny --data recall --seq-len 256 --steps 1000 --seed 5 \
    --ckpt-dir "$1" --ckpt-every 1'
check "a rank SIGKILLed mid-run: srun fails with 137, no hang" \
    run_rc 137 srun_t --mpi=pmix -N1 -n4 sh -c "$killed" "$DTENGINE" "$TMPD/ckpt"
check "a rank SIGKILLed: srun names the task" out_has 'task 2: (Killed|Exited with exit code 137)'
check "a rank SIGKILLed: it had started training (step lines)" out_has '^step [0-9]+ '

no_jobs() {
    [ -z "$(squeue -h -o %A)" ] && return 0
    echo "jobs still there: $(squeue -h -o '%A %T %R' | tr '\n' ';')"
    return 1
}
wait_no_jobs() {
    _wn=50
    while [ "$_wn" -gt 0 ]; do
        [ -z "$(squeue -h -o %A 2>/dev/null)" ] && return 0
        sleep 0.2
        _wn=$((_wn - 1))
    done
    no_jobs
}
check "no job is left in the queue (10 s)" wait_no_jobs

finish
