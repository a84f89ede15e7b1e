#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Attention masks across real ranks under mpirun: dtengine attn with
# --doc-lengths, --sliding-window and --block-mask (dense and CSR), alone
# and combined, forward and backward, against the double-precision
# reference of the same definitions (npytool ref, tests/ref): R = 1 to 4,
# contiguous and zigzag (balanced on 2 and 4 ranks), causal (and not, on
# 1 and 3 ranks), GQA (H=4, Hkv=2, D=32), T=480; documents cross rank boundaries and one is a single
# token. The work and traffic skipped: a window reaches only the next
# rank, documents that stay on their ranks send nothing (--stats). A mask
# on dilated attention across ranks; CSR equal to dense to the bit; bad
# masks refused naming what is wrong, exit 2. The balanced layout spreads
# uneven documents' work where zigzag cannot (--stats' imbalance).

. "$(dirname "$0")/lib.sh"
need_mpirun

T=480
SEED=43
IN=$TMPD/in
gen_qkv "$IN" $T 4 2 32 $SEED
"$NPYTOOL" blocks --blocks 12 --seed 5 --csr "$TMPD/rows.npy,$TMPD/cols.npy" "$TMPD/blocks.npy" ||
    die "npytool blocks failed"
"$NPYTOOL" blocks --blocks 12 --heads 4 --seed 6 --bool "$TMPD/blocks4.npy" ||
    die "npytool blocks failed"

# mrun R LAYOUT OUT [dtengine args...]: forward + backward, gathered
mrun() {
    _m_r=$1 _m_layout=$2 _m_out=$3
    shift 3
    mpirun_np "$_m_r" "$DTENGINE" attn --q "$IN/q.npy" --k "$IN/k.npy" --v "$IN/v.npy" \
        --dout "$IN/dout.npy" --layout "$_m_layout" --out "$_m_out.o.npy" \
        --lse "$_m_out.lse.npy" --dq "$_m_out.dq.npy" --dk "$_m_out.dk.npy" \
        --dv "$_m_out.dv.npy" "$@"
}

# mref OUT [npytool ref args...]
mref() {
    _m_out=$1
    shift
    "$NPYTOOL" ref --q "$IN/q.npy" --k "$IN/k.npy" --v "$IN/v.npy" --dout "$IN/dout.npy" \
        --out "$_m_out.o.npy" --lse "$_m_out.lse.npy" --dq "$_m_out.dq.npy" \
        --dk "$_m_out.dk.npy" --dv "$_m_out.dv.npy" "$@"
}

# mcmp GOT REF: o, lse and the gradients within the ring tests' tolerances
mcmp() {
    "$NPYTOOL" cmp "$1.o.npy" "$2.o.npy" --atol 1e-5 &&
        "$NPYTOOL" cmp "$1.lse.npy" "$2.lse.npy" --atol 1e-5 &&
        for _m_g in dq dk dv; do
            "$NPYTOOL" cmp "$1.$_m_g.npy" "$2.$_m_g.npy" --atol 1e-5 --rtol 1e-4 || return 1
        done
}

# name|masks: documents crossing every rank boundary of R = 2, 3, 4 (and a
# one-token one), a window, both, blocks shared and per head, all three
MASKS="docs|--doc-lengths 100,1,139,60,180
window|--sliding-window 50
docs+window|--doc-lengths 100,1,139,60,180 --sliding-window 50
blocks|--block-mask $TMPD/blocks.npy --mask-block 40
heads|--block-mask $TMPD/blocks4.npy --mask-block 40
all|--doc-lengths 200,280 --sliding-window 90 --block-mask $TMPD/blocks.npy --mask-block 40"

# t_mask NAME CAUSAL RANKS MASK...: every R and layout against the reference
t_mask() {
    _t_name=$1 _t_causal=$2 _t_ranks=$3
    shift 3
    _t_flag=--no-causal
    _t_rflag=
    [ "$_t_causal" = 1 ] && _t_flag=--causal _t_rflag=--causal
    # shellcheck disable=SC2086
    mref "$TMPD/ref.$_t_name.$_t_causal" $_t_rflag "$@" || return 1
    for _t_r in $_t_ranks; do
        for _t_l in contiguous zigzag balanced; do
            # one rank: every layout is contiguous; balanced on 2 and 4
            [ "$_t_r" = 1 ] && [ "$_t_l" != contiguous ] && continue
            [ "$_t_l" = balanced ] && [ "$_t_r" != 2 ] && [ "$_t_r" != 4 ] && continue
            _t_o=$TMPD/m.$_t_name.$_t_causal.$_t_r.$_t_l
            mrun "$_t_r" "$_t_l" "$_t_o" "$_t_flag" "$@" >"$_t_o.log" 2>&1 ||
                { cat "$_t_o.log"; return 1; }
            mcmp "$_t_o" "$TMPD/ref.$_t_name.$_t_causal" ||
                { echo "R=$_t_r $_t_l differs from the reference"; return 1; }
        done
    done
}
_nl='
'
_ifs=$IFS
IFS=$_nl
for _line in $MASKS; do
    IFS=$_ifs
    name=${_line%%|*}
    args=${_line#*|}
    # shellcheck disable=SC2086
    check "mask $name, causal, R = 1 2 3 4, every layout: o, lse, dq, dk, dv equal the reference" \
        t_mask "$name" 1 "1 2 3 4" $args
    # shellcheck disable=SC2086
    check "mask $name, not causal, R = 1 and 3: equal the reference" \
        t_mask "$name" 0 "1 3" $args
done
IFS=$_ifs

# the traffic: a window shorter than a rank's rows reaches only the next
# rank (each rank but the last sends its K/V once, forward); documents that
# end on rank boundaries send nothing; unmasked, every rank sends R - 1
stat_of() { # LOG PASS FIELD RANK
    sed -n "s/^stats: $2 rank=$4 .* $3=\([0-9]*\).*/\1/p" "$1"
}
t_traffic() {
    _pack=$((120 * 2 * 32 * 2 * 4))
    mpirun_np 4 "$DTENGINE" attn --generate $T,4,2,32 --seed 1 --layout contiguous --causal \
        --backward --stats >"$TMPD/tr.plain" 2>&1 || { cat "$TMPD/tr.plain"; return 1; }
    mpirun_np 4 "$DTENGINE" attn --generate $T,4,2,32 --seed 1 --layout contiguous --causal \
        --backward --stats --sliding-window 64 >"$TMPD/tr.win" 2>&1 ||
        { cat "$TMPD/tr.win"; return 1; }
    mpirun_np 4 "$DTENGINE" attn --generate $T,4,2,32 --seed 1 --layout contiguous --causal \
        --backward --stats --doc-lengths 120,240,120 >"$TMPD/tr.doc" 2>&1 ||
        { cat "$TMPD/tr.doc"; return 1; }
    for _r in 0 1 2 3; do
        _p=$(stat_of "$TMPD/tr.plain" fwd bytes_sent $_r)
        _w=$(stat_of "$TMPD/tr.win" fwd bytes_sent $_r)
        _wb=$(stat_of "$TMPD/tr.win" bwd bytes_sent $_r)
        _ws=$(stat_of "$TMPD/tr.win" fwd steps $_r)
        _d=$(stat_of "$TMPD/tr.doc" fwd bytes_sent $_r)
        _dd=$(stat_of "$TMPD/tr.doc" bwd bytes_sent $_r)
        echo "rank $_r: forward bytes unmasked $_p, window $_w (steps $_ws, backward $_wb), documents $_d"
        [ "$_p" = $((3 * _pack)) ] || return 1
        # backward: K/V out to the next rank, the previous one's gradient
        # back to it
        _want=$_pack _wsteps=2 _wback=$((2 * _pack))
        [ $_r = 3 ] && _want=0 _wback=$_pack
        [ $_r = 0 ] && _wsteps=1 _wback=$_pack
        [ "$_w" = "$_want" ] && [ "$_ws" = "$_wsteps" ] && [ "$_wb" = "$_wback" ] || return 1
        # documents [0, 120) [120, 360) [360, 480): only rank 1 to rank 2
        _dw=0 _db=0
        [ $_r = 1 ] && _dw=$_pack _db=$_pack
        [ $_r = 2 ] && _db=$_pack
        [ "$_d" = "$_dw" ] && [ "$_dd" = "$_db" ] || return 1
    done
}
check "masks skip transfers: a window sends only to the next rank, documents only where they span ranks" \
    t_traffic

# the compressed form reads the same pattern: the same bits
t_csr() {
    mrun 3 zigzag "$TMPD/dense" --causal --block-mask "$TMPD/blocks.npy" --mask-block 40 \
        >"$TMPD/dense.log" 2>&1 || { cat "$TMPD/dense.log"; return 1; }
    mrun 3 zigzag "$TMPD/csr" --causal --block-mask "$TMPD/rows.npy,$TMPD/cols.npy" \
        --mask-block 40 >"$TMPD/csr.log" 2>&1 || { cat "$TMPD/csr.log"; return 1; }
    for _x in o lse dq dk dv; do
        cmp "$TMPD/dense.$_x.npy" "$TMPD/csr.$_x.npy" || return 1
    done
}
check "--block-mask ROWPTR.npy,COLS.npy (CSR) gives the dense mask's results to the bit" t_csr

# a mask that allows every pair takes the masked path (blocks sent only
# where needed: here everywhere) and gives the unmasked ring's bits
t_allow_all() {
    for _l in contiguous zigzag; do
        mrun 3 $_l "$TMPD/plain.$_l" --causal >"$TMPD/plain.log" 2>&1 ||
            { cat "$TMPD/plain.log"; return 1; }
        mrun 3 $_l "$TMPD/every.$_l" --causal --sliding-window $T --doc-lengths $T \
            >"$TMPD/every.log" 2>&1 || { cat "$TMPD/every.log"; return 1; }
        for _x in o lse dq dk dv; do
            cmp "$TMPD/plain.$_l.$_x.npy" "$TMPD/every.$_l.$_x.npy" || return 1
        done
    done
}
check "a mask that allows every pair gives the unmasked results to the bit (R = 3, both layouts)" \
    t_allow_all

# dilated attention with a mask, its segments across ranks
t_dilated() {
    mref "$TMPD/dref" --causal --segments 96,240 --dilations 1,2 --doc-lengths 100,1,139,60,180 \
        --sliding-window 70 || return 1
    for _rl in 1:contiguous 2:contiguous 4:contiguous 4:balanced; do
        _r=${_rl%%:*} _l=${_rl#*:}
        mrun $_r $_l "$TMPD/dil$_r" --causal --segments 96,240 --dilations 1,2 \
            --doc-lengths 100,1,139,60,180 --sliding-window 70 >"$TMPD/dil.log" 2>&1 ||
            { cat "$TMPD/dil.log"; return 1; }
        mcmp "$TMPD/dil$_r" "$TMPD/dref" || { echo "R=$_r $_l differs"; return 1; }
    done
}
check "dilated attention with documents and a window, R = 1 2 4 (and 4 balanced): equal the reference" \
    t_dilated

# the balanced layout against zigzag
t_balance() {
    for _l in zigzag balanced; do
        mpirun_np 4 "$DTENGINE" attn --generate 4096,4,2,32 --seed 1 --layout $_l \
            --out "$TMPD/bal.o.npy" --doc-lengths 1500,300,77,1200,1019 --stats \
            >"$TMPD/bal.$_l.log" 2>&1 || { cat "$TMPD/bal.$_l.log"; return 1; }
    done
    _z=$(sed -n 's/^stats: work .* imbalance=\([0-9.]*\)$/\1/p' "$TMPD/bal.zigzag.log")
    _b=$(sed -n 's/^stats: work .* imbalance=\([0-9.]*\)$/\1/p' "$TMPD/bal.balanced.log")
    echo "documents 1500,300,77,1200,1019 on 4 ranks: imbalance zigzag $_z, balanced $_b"
    awk -v z="$_z" -v b="$_b" 'BEGIN { exit !(z > 1.5 && b < 1.1) }'
}
check "layout balanced: uneven documents' work within 10% of even on 4 ranks (zigzag: > 50% off)" \
    t_balance

# bad masks: refused naming what and where, exit 2, nothing written

bad() { # NEEDLE ARGS...: dtengine attn refuses ARGS with exit 2 naming NEEDLE
    _needle=$1
    shift
    run_rc 2 "$DTENGINE" attn --generate $T,4,2,32 --seed 1 --out "$TMPD/bad.o.npy" "$@" &&
        out_has "$_needle" && [ ! -e "$TMPD/bad.o.npy" ]
}
t_bad() {
    "$NPYTOOL" gen --shape 12,12 --seed 1 --stream 1 "$TMPD/float.npy" || return 1
    "$NPYTOOL" blocks --blocks 10 --seed 1 "$TMPD/b10.npy" || return 1
    bad "sum to 479, not to the sequence length 480" --doc-lengths 240,239 &&
        bad "document 1 has length 0" --doc-lengths 240,0,240 &&
        bad "expected lengths separated by commas" --doc-lengths 240,x &&
        bad "sliding-window: value .0. out of range" --sliding-window 0 &&
        bad "mask-block 7 does not divide the sequence length 480" \
            --block-mask "$TMPD/blocks.npy" --mask-block 7 &&
        bad "blocks.npy: shape \(12, 12\); \(20, 20\) or \(4, 20, 20\) expected" \
            --block-mask "$TMPD/blocks.npy" --mask-block 24 &&
        bad "b10.npy: shape \\(10, 10\\); \\(12, 12\\)" --block-mask "$TMPD/b10.npy" --mask-block 40 &&
        bad "float.npy: dtype float32; bool or uint8 expected" \
            --block-mask "$TMPD/float.npy" --mask-block 40 &&
        bad "block-mask needs --mask-block" --block-mask "$TMPD/blocks.npy" || return 1
    # a pattern per head for 4 heads, given 2 query heads
    run_rc 2 "$DTENGINE" attn --generate $T,2,2,32 --seed 1 --block-mask "$TMPD/blocks4.npy" \
        --mask-block 40 && out_has "blocks4.npy: shape \\(4, 12, 12\\)"
}
check "bad masks are refused naming what is wrong, exit 2" t_bad

finish
