#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Ring attention backward across real ranks under mpirun: dtengine attn with
# --dout/--dq/--dk/--dv at R=1, then at R=2 and 4 in both layouts, causal.
# dQ, dK and dV at R ranks must equal those of one rank (atol 1e-5), and all
# of them the double-precision reference gradients of npytool ref (atol
# 1e-5, rtol 1e-4). Grouped-query heads (H=4, Hkv=2) make dK/dV sums over
# several query heads. One non-causal case, and one dilated case at R=4
# (H=6, r up to 4, segments inside one rank and spanning 2 and 4 ranks).

. "$(dirname "$0")/lib.sh"
need_mpirun

T=256
SEED=31

# bwd_run R LAYOUT IN OUT [dtengine args...]: forward + backward, gathered
bwd_run() {
    _b_r=$1 _b_layout=$2 _b_in=$3 _b_out=$4
    shift 4
    mpirun_np "$_b_r" "$DTENGINE" attn --q "$_b_in/q.npy" --k "$_b_in/k.npy" \
        --v "$_b_in/v.npy" --dout "$_b_in/dout.npy" --layout "$_b_layout" \
        --out "$_b_out.o.npy" --dq "$_b_out.dq.npy" --dk "$_b_out.dk.npy" \
        --dv "$_b_out.dv.npy" "$@"
}

# bwd_ref IN OUT [npytool ref args...]
bwd_ref() {
    _b_in=$1 _b_out=$2
    shift 2
    "$NPYTOOL" ref --q "$_b_in/q.npy" --k "$_b_in/k.npy" --v "$_b_in/v.npy" \
        --dout "$_b_in/dout.npy" --out "$_b_out.o.npy" --dq "$_b_out.dq.npy" \
        --dk "$_b_out.dk.npy" --dv "$_b_out.dv.npy" "$@" ||
        die "npytool ref failed for $_b_out"
}

# compare NAME GOT BASE REF: o and gradients against the reference, and
# gradients against the one-rank run BASE (skipped when BASE is empty)
compare() {
    _c_name=$1 _c_got=$2 _c_base=$3 _c_ref=$4
    check "$_c_name o vs ref" "$NPYTOOL" cmp "$_c_got.o.npy" "$_c_ref.o.npy" --atol 1e-5
    for _c_g in dq dk dv; do
        if [ -n "$_c_base" ]; then
            check "$_c_name $_c_g vs R=1" "$NPYTOOL" cmp "$_c_got.$_c_g.npy" \
                "$_c_base.$_c_g.npy" --atol 1e-5
        fi
        check "$_c_name $_c_g vs ref" "$NPYTOOL" cmp "$_c_got.$_c_g.npy" \
            "$_c_ref.$_c_g.npy" --atol 1e-5 --rtol 1e-4
    done
}

# ---- dense, GQA ----------------------------------------------------------------
IN=$TMPD/in
gen_qkv "$IN" $T 4 2 32 $SEED
bwd_ref "$IN" "$TMPD/ref.c1" --causal
bwd_ref "$IN" "$TMPD/ref.c0"

check "dense R=1 causal run" bwd_run 1 contiguous "$IN" "$TMPD/r1.c1" --causal
compare "dense R=1 causal" "$TMPD/r1.c1" "" "$TMPD/ref.c1"
for R in 2 4; do
    for layout in contiguous zigzag; do
        out=$TMPD/r$R.$layout.c1
        check "dense R=$R $layout causal run" bwd_run $R $layout "$IN" "$out" --causal
        compare "dense R=$R $layout causal" "$out" "$TMPD/r1.c1" "$TMPD/ref.c1"
    done
done

check "dense R=1 non-causal run" bwd_run 1 contiguous "$IN" "$TMPD/r1.c0" --no-causal
compare "dense R=1 non-causal" "$TMPD/r1.c0" "" "$TMPD/ref.c0"
check "dense R=4 zigzag non-causal run" bwd_run 4 zigzag "$IN" "$TMPD/r4.zigzag.c0" --no-causal
compare "dense R=4 zigzag non-causal" "$TMPD/r4.zigzag.c0" "$TMPD/r1.c0" "$TMPD/ref.c0"

# ---- dilated -----------------------------------------------------------------
# c = 64 at R=4: w=64 stays on one rank (contiguous), 128 and 256 span ranks
DIN=$TMPD/din
SEGS=64,128,256
DILS=1,2,4
gen_qkv "$DIN" $T 6 2 16 $((SEED + 1))
bwd_ref "$DIN" "$TMPD/dref" --causal --segments $SEGS --dilations $DILS

check "dilated R=1 causal run" bwd_run 1 contiguous "$DIN" "$TMPD/d1" --causal \
    --segments $SEGS --dilations $DILS
compare "dilated R=1 causal" "$TMPD/d1" "" "$TMPD/dref"
for layout in contiguous zigzag; do
    check "dilated R=4 $layout causal run" bwd_run 4 $layout "$DIN" "$TMPD/d4.$layout" \
        --causal --segments $SEGS --dilations $DILS
    compare "dilated R=4 $layout causal" "$TMPD/d4.$layout" "$TMPD/d1" "$TMPD/dref"
done

finish
