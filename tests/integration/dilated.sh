#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Dilated (LongNet) attention across real ranks under mpirun against the
# double-precision reference over the multiset union of the branches' keys
# (npytool ref --segments --dilations): one rank and R = 2, 4, contiguous and
# zigzag, causal and not, tolerance 1e-5 on O and LSE. T=512, so c = T/R is
# 128 at R=4. The branch sets cover segments that stay inside one rank and
# segments wider than c (sub-rings of 2 and 4 ranks), a head count that is
# not a multiple of the dilation (H=6 with r=4: the padded last chunk has no
# heads), grouped-query heads (Hkv=2, so a head chunk can read two kv
# heads), and segments that do not divide T (a shorter last segment, and a
# segment longer than T).

. "$(dirname "$0")/lib.sh"
need_mpirun

T=512
H=6
HKV=2
D=16
SEED=23
IN=$TMPD/in

# name:segments:dilations
SETS="wide:64,256,512:1,2,4
local:32,128:1,2
ragged:96,200,1024:2,4,8
dense1:512:1"

gen_qkv "$IN" $T $H $HKV $D $SEED

for set in $SETS; do
    sname=${set%%:*}
    rest=${set#*:}
    segs=${rest%%:*}
    dils=${rest#*:}
    for causal in 0 1; do
        flag= eflag=--no-causal # npytool's and dtengine's (causal by default)
        [ $causal = 1 ] && flag=--causal eflag=--causal
        ref=$TMPD/ref.$sname.c$causal
        "$NPYTOOL" ref --q "$IN/q.npy" --k "$IN/k.npy" --v "$IN/v.npy" $flag \
            --segments "$segs" --dilations "$dils" --out "$ref.o.npy" --lse "$ref.lse.npy" ||
            die "npytool ref failed (set $sname, causal=$causal)"
        for R in 1 2 4; do
            for layout in contiguous zigzag; do
                # zigzag on one rank is the contiguous layout
                [ $R = 1 ] && [ $layout = zigzag ] && continue
                name="$sname w=$segs r=$dils R=$R $layout causal=$causal"
                out=$TMPD/$sname.r$R.$layout.c$causal
                check "$name run" mpirun_np $R "$DTENGINE" attn --q "$IN/q.npy" \
                    --k "$IN/k.npy" --v "$IN/v.npy" --segments "$segs" --dilations "$dils" \
                    --layout $layout $eflag --out "$out.o.npy" --lse "$out.lse.npy"
                check "$name o" "$NPYTOOL" cmp "$out.o.npy" "$ref.o.npy" --atol 1e-5
                check "$name lse" "$NPYTOOL" cmp "$out.lse.npy" "$ref.lse.npy" --atol 1e-5
            done
        done
    done
done

# One branch of segment T and dilation 1 is dense attention.
"$NPYTOOL" ref --q "$IN/q.npy" --k "$IN/k.npy" --v "$IN/v.npy" --causal \
    --out "$TMPD/dense.o.npy" --lse "$TMPD/dense.lse.npy" || die "npytool ref failed (dense)"
check "w=T r=1 equals dense o" "$NPYTOOL" cmp "$TMPD/dense1.r4.zigzag.c1.o.npy" \
    "$TMPD/dense.o.npy" --atol 1e-5
check "w=T r=1 equals dense lse" "$NPYTOOL" cmp "$TMPD/dense1.r4.zigzag.c1.lse.npy" \
    "$TMPD/dense.lse.npy" --atol 1e-5

finish
