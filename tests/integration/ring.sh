#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Dense ring attention across real ranks under mpirun against the
# double-precision single-process reference (npytool ref): R = 1, 2, 3, 4
# and 8 ranks, contiguous and zigzag layouts, causal and not, grouped-query
# heads (H=4, Hkv=2, D=32), T=480 so that 2R divides T for every R. O and
# LSE must match to 1e-5; a table of the largest error per R is printed and
# the error must not grow with R. Also once with float16 inputs and once
# with --generate (which must equal `npytool gen`), and with --threads 2 and
# 3 against --threads 1 (equal to the bit). Timings are not checked.

. "$(dirname "$0")/lib.sh"
need_mpirun

T=480
H=4
HKV=2
D=32
SEED=11
RANKS="1 2 3 4 8"
IN=$TMPD/in

gen_qkv "$IN" $T $H $HKV $D $SEED
for causal in 0 1; do
    flag=
    [ $causal = 1 ] && flag=--causal
    "$NPYTOOL" ref --q "$IN/q.npy" --k "$IN/k.npy" --v "$IN/v.npy" $flag \
        --out "$TMPD/ref.c$causal.o.npy" --lse "$TMPD/ref.c$causal.lse.npy" ||
        die "npytool ref failed (causal=$causal)"
done

# run_ring R LAYOUT CAUSAL IN OUTPREFIX [dtengine args...]
run_ring() {
    _rr_r=$1 _rr_layout=$2 _rr_causal=$3 _rr_in=$4 _rr_out=$5
    shift 5
    _rr_flag=--no-causal
    [ "$_rr_causal" = 1 ] && _rr_flag=--causal
    mpirun_np "$_rr_r" "$DTENGINE" attn --q "$_rr_in/q.npy" --k "$_rr_in/k.npy" \
        --v "$_rr_in/v.npy" --layout "$_rr_layout" $_rr_flag --out "$_rr_out.o.npy" \
        --lse "$_rr_out.lse.npy" "$@"
}

: >"$TMPD/errors"
for R in $RANKS; do
    for layout in contiguous zigzag; do
        for causal in 0 1; do
            name="R=$R $layout causal=$causal"
            out=$TMPD/r$R.$layout.c$causal
            check "$name run" run_ring $R $layout $causal "$IN" "$out"
            check "$name o" "$NPYTOOL" cmp "$out.o.npy" "$TMPD/ref.c$causal.o.npy" --atol 1e-5
            check "$name lse" "$NPYTOOL" cmp "$out.lse.npy" "$TMPD/ref.c$causal.lse.npy" \
                --atol 1e-5
            echo "$R $(maxerr "$out.o.npy" "$TMPD/ref.c$causal.o.npy")" \
                "$(maxerr "$out.lse.npy" "$TMPD/ref.c$causal.lse.npy")" >>"$TMPD/errors"
        done
    done
done

echo
echo "max abs error against the reference, over both layouts and causal/not:"
awk '{ if (!($1 in o) || $2 > o[$1]) o[$1] = $2; if (!($1 in l) || $3 > l[$1]) l[$1] = $3 }
     END { printf "%4s  %-10s  %-10s\n", "R", "o", "lse"
           n = split("'"$RANKS"'", rs, " ")
           for (i = 1; i <= n; i++) printf "%4d  %-10s  %-10s\n", rs[i], o[rs[i]], l[rs[i]] }' \
    "$TMPD/errors"
echo

# The error must not grow with the number of ranks: merging R partial
# softmaxes adds a few roundings, not error proportional to R. Rule, for O
# and for LSE separately (largest error over layouts and causal/not):
#   err(R=8) <= 4 * max(err(R=1), 1e-7) + 1e-6
# A "nan" (an output that could not be read) fails it.
growth() {
    awk -v col="$1" '
        $2 == "nan" || $3 == "nan" { bad = 1 }
        $1 == 1 && $col + 0 > e1 { e1 = $col + 0 }
        $1 == 8 && $col + 0 > e8 { e8 = $col + 0 }
        END {
            lim = 4 * (e1 > 1e-7 ? e1 : 1e-7) + 1e-6
            printf "err(R=8)=%.3e err(R=1)=%.3e limit=%.3e\n", e8, e1, lim
            exit (bad || e8 > lim) ? 1 : 0
        }' "$TMPD/errors"
}
check "o error does not grow with R" growth 2
check "lse error does not grow with R" growth 3

# float16 inputs: the reference reads the same float16 values
gen_qkv "$TMPD/in16" $T $H $HKV $D $((SEED + 1)) --f16
"$NPYTOOL" ref --q "$TMPD/in16/q.npy" --k "$TMPD/in16/k.npy" --v "$TMPD/in16/v.npy" --causal \
    --out "$TMPD/ref16.o.npy" --lse "$TMPD/ref16.lse.npy" || die "npytool ref failed (float16)"
check "float16 R=4 zigzag causal run" run_ring 4 zigzag 1 "$TMPD/in16" "$TMPD/f16"
check "float16 R=4 zigzag causal o" "$NPYTOOL" cmp "$TMPD/f16.o.npy" "$TMPD/ref16.o.npy" \
    --atol 1e-5
check "float16 R=4 zigzag causal lse" "$NPYTOOL" cmp "$TMPD/f16.lse.npy" "$TMPD/ref16.lse.npy" \
    --atol 1e-5

# --generate makes the inputs that `npytool gen` wrote to $IN
check "generate R=3 contiguous causal run" mpirun_np 3 "$DTENGINE" attn \
    --generate $T,$H,$HKV,$D --seed $SEED --causal --layout contiguous --out "$TMPD/gen.o.npy" \
    --lse "$TMPD/gen.lse.npy"
check "generate R=3 contiguous causal o" "$NPYTOOL" cmp "$TMPD/gen.o.npy" \
    "$TMPD/ref.c1.o.npy" --atol 1e-5
check "generate R=3 contiguous causal lse" "$NPYTOOL" cmp "$TMPD/gen.lse.npy" \
    "$TMPD/ref.c1.lse.npy" --atol 1e-5

# --threads spreads a block's heads over threads; each head's arithmetic is
# the one of a single thread, so every output is the same to the bit (the
# ring's transfers progressed by the calling thread only)
for n in 1 2 3; do
    check "R=2 zigzag causal backward, --threads $n, run" mpirun_np 2 "$DTENGINE" attn \
        --generate $T,$H,$HKV,$D --seed $SEED --causal --layout zigzag --backward \
        --threads $n --out "$TMPD/th$n.o.npy" --lse "$TMPD/th$n.lse.npy" \
        --dq "$TMPD/th$n.dq.npy" --dk "$TMPD/th$n.dk.npy" --dv "$TMPD/th$n.dv.npy"
done
for n in 2 3; do
    for x in o lse dq dk dv; do
        check "--threads $n $x equals --threads 1 to the bit" "$NPYTOOL" cmp \
            "$TMPD/th$n.$x.npy" "$TMPD/th1.$x.npy" --atol 0
    done
done
check "--threads 1 o matches the reference" "$NPYTOOL" cmp "$TMPD/th1.o.npy" \
    "$TMPD/ref.c1.o.npy" --atol 1e-5

finish
