#!/bin/sh
# SPDX-License-Identifier: MIT
#
# What a user of `dtengine attn` sees. Every bad input (shapes that do not
# fit, a dtype or memory order it cannot read, a sequence the ranks cannot
# split, inconsistent dilated branches, a missing file, an unknown option)
# must give exit status 2, a message on stderr that names the problem, and
# leave nothing in the output directory: no output file and no `.*.tmp.*`.
# Also the happy path: the one summary line, and --out-dir shards whose
# positions follow the zigzag layout and which, put back in position order,
# equal the gathered --out file. One rank runs without mpirun (a singleton
# job), more ranks under mpirun. Numerics are ring.sh's and dilated.sh's job.

# shellcheck disable=SC2086 # $Q and $KV are meant to split into words
. "$(dirname "$0")/lib.sh"
need_mpirun

# Work inside $TMPD with relative names: Q and KV below are word lists, and
# the messages under test name these short paths.
cd "$TMPD" || die "cannot cd to $TMPD"
T=512
H=4
HKV=2
D=32
IN=in

# ---- inputs -------------------------------------------------------------------

# write_npy FILE DESCR FORTRAN SHAPE NBYTES: a version 1.0 .npy header for the
# dict {descr, fortran_order, shape} padded to 64 bytes, then NBYTES zeros
write_npy() {
    _w_dict="{'descr': '$2', 'fortran_order': $3, 'shape': $4, }"
    _w_hlen=$(((10 + ${#_w_dict} + 1 + 63) / 64 * 64 - 10))
    {
        printf '\223NUMPY\001\000'
        # shellcheck disable=SC2059 # the format is the two length bytes in octal
        printf "\\$(printf %03o $((_w_hlen % 256)))\\$(printf %03o $((_w_hlen / 256)))"
        printf "%-$((_w_hlen - 1))s\n" "$_w_dict"
        dd if=/dev/zero bs="$5" count=1 2>/dev/null
    } >"$1" || die "cannot write $1"
}

gen_qkv "$IN" $T $H $HKV $D 1
gen() {
    "$NPYTOOL" gen --shape "$1" --seed 2 --stream 9 "$IN/$2" || die "npytool gen $2 failed"
}
gen $T,1,$D v_hkv1.npy
gen 256,$HKV,$D k_t256.npy
gen 256,$HKV,$D v_t256.npy
gen $T,$HKV,16 k_d16.npy
gen $T,$HKV,16 v_d16.npy
gen $T,$((H * D)) q_2d.npy
gen $T,6,$D q_h6.npy
gen $T,$HKV,$D dout_small.npy
gen 514,$H,$D q_t514.npy
gen 514,$HKV,$D k_t514.npy
gen 514,$HKV,$D v_t514.npy
write_npy "$IN/q_f8.npy" '<f8' False "($T, $H, $D)" $((T * H * D * 8))
write_npy "$IN/q_fortran.npy" '<f4' True "($T, $H, $D)" $((T * H * D * 4))
write_npy "$IN/q_bigend.npy" '>f4' False "($T, $H, $D)" $((T * H * D * 4))
write_npy "$IN/q_short.npy" '<f4' False "($T, $H, $D)" $((T * H * D * 4 - 4))
echo "not an array" >"$IN/q_text.npy" || die "cannot write q_text.npy"

# ---- bad input ------------------------------------------------------------------

NBAD=0

# run_attn R OUTDIR ARGS...: dtengine attn on R ranks (R=1: no mpirun);
# stdout and stderr go to OUTDIR.stdout and OUTDIR.stderr. dtengine attn is
# causal by default (a spec's default); these checks were written for the
# non-causal attention of ARGS that say neither --causal nor --no-causal.
run_attn() {
    _ra_r=$1 _ra_dir=$2
    shift 2
    case " $* " in
    *" --causal "* | *" --no-causal "* | *" --spec "*) ;;
    *) set -- "$@" --no-causal ;;
    esac
    if [ "$_ra_r" = 1 ]; then
        "$DTENGINE" attn "$@" >"$_ra_dir.stdout" 2>"$_ra_dir.stderr"
    else
        mpirun_np "$_ra_r" "$DTENGINE" attn "$@" >"$_ra_dir.stdout" 2>"$_ra_dir.stderr"
    fi
}

# expect_bad R WORD ARGS...: dtengine attn ARGS --out DIR/o.npy --lse
# DIR/lse.npy on R ranks, DIR a new empty directory, must exit 2, mention
# WORD on stderr (case-insensitive) and leave DIR empty. When ARGS hold
# --out-dir or --out, no --out/--lse is added; then DIR/x is meant to be the
# output directory, which must not be created.
expect_bad() {
    _eb_r=$1 _eb_word=$2
    shift 2
    NBAD=$((NBAD + 1))
    _eb_dir=$TMPD/bad$NBAD
    mkdir "$_eb_dir" || return 99
    case " $* " in
    *" --out-dir "* | *" --out "*) run_attn "$_eb_r" "$_eb_dir" "$@" ;;
    *) run_attn "$_eb_r" "$_eb_dir" "$@" --out "$_eb_dir/o.npy" --lse "$_eb_dir/lse.npy" ;;
    esac
    _eb_rc=$?
    _eb_ok=0
    if [ "$_eb_rc" -ne 2 ]; then
        echo "exit status $_eb_rc, want 2"
        _eb_ok=1
    fi
    if ! grep -qi -e "$_eb_word" "$_eb_dir.stderr"; then
        echo "stderr does not mention '$_eb_word'"
        _eb_ok=1
    fi
    for _eb_f in "$_eb_dir"/* "$_eb_dir"/.*; do
        case $_eb_f in
        */. | */.. | */'*' | */'.*') ;;
        *)
            echo "left behind: $_eb_f"
            _eb_ok=1
            ;;
        esac
    done
    if [ "$_eb_ok" -ne 0 ]; then
        echo "stderr:"
        sed 's/^/  /' "$_eb_dir.stderr"
    else
        # the message itself, for the log
        grep -i -e "$_eb_word" "$_eb_dir.stderr" | head -n 1
    fi
    return "$_eb_ok"
}

Q="--q $IN/q.npy"
KV="--k $IN/k.npy --v $IN/v.npy"

# shapes
check "K and V of different shapes" expect_bad 1 shape $Q --k "$IN/k.npy" --v "$IN/v_hkv1.npy"
check "T of K differs from Q" expect_bad 1 k_t256.npy $Q --k "$IN/k_t256.npy" \
    --v "$IN/v_t256.npy"
check "D of K differs from Q" expect_bad 1 k_d16.npy $Q --k "$IN/k_d16.npy" \
    --v "$IN/v_d16.npy"
check "2-D Q" expect_bad 1 q_2d.npy --q "$IN/q_2d.npy" $KV
check "Hkv does not divide H" expect_bad 1 divide --q "$IN/q_h6.npy" --k "$IN/q.npy" \
    --v "$IN/q.npy"
# bad$((NBAD + 1)) is the directory the next expect_bad makes and checks
B=$TMPD/bad$((NBAD + 1))
check "dout of another shape" expect_bad 1 dout_small.npy $Q $KV --dout "$IN/dout_small.npy" \
    --dq "$B/dq.npy" --dk "$B/dk.npy" --dv "$B/dv.npy"
# files it cannot read
check "float64 Q" expect_bad 1 dtype --q "$IN/q_f8.npy" $KV
check "big-endian Q" expect_bad 1 dtype --q "$IN/q_bigend.npy" $KV
check "Fortran-order Q" expect_bad 1 fortran --q "$IN/q_fortran.npy" $KV
check "truncated Q" expect_bad 1 truncated --q "$IN/q_short.npy" $KV
check "Q not an .npy file" expect_bad 1 q_text.npy --q "$IN/q_text.npy" $KV
check "missing Q file" expect_bad 1 no_such.npy --q "$IN/no_such.npy" $KV
mkdir "$IN/q_dir.npy" && mkfifo "$IN/q_fifo.npy" || die "cannot make a directory and a FIFO"
check "Q is a directory (exit 2, not 1)" expect_bad 1 "q_dir.npy: is a directory" \
    --q "$IN/q_dir.npy" $KV
cp "$IN/q.npy" "$IN/q_trail.npy" && printf 'extra' >>"$IN/q_trail.npy" || die "cannot write q_trail.npy"
check "Q with bytes after its data" expect_bad 1 "q_trail.npy: 5 bytes after the data" \
    --q "$IN/q_trail.npy" $KV
check "Q is a FIFO (refused, not waited on)" expect_bad 1 "q_fifo.npy: not a regular file" \
    --q "$IN/q_fifo.npy" $KV
# splitting over ranks
check "T=512 over 3 ranks" expect_bad 3 divisible $Q $KV
check "T=514 zigzag over 2 ranks (2R=4)" expect_bad 2 divisible --q "$IN/q_t514.npy" \
    --k "$IN/k_t514.npy" --v "$IN/v_t514.npy" --layout zigzag
check "T=512 over 3 ranks, --out-dir not created" expect_bad 3 divisible $Q $KV \
    --out-dir "$TMPD/bad$((NBAD + 1))/x"
check "unknown layout" expect_bad 1 layout $Q $KV --layout diagonal
# dilated branches
check "2 segments, 1 dilation" expect_bad 1 dilation $Q $KV --segments 64,128 --dilations 1
check "segments without dilations" expect_bad 1 dilations $Q $KV --segments 64
check "w=100 not a multiple of r=3" expect_bad 1 multiple $Q $KV --segments 100 --dilations 3
check "w not a multiple of r on 4 ranks" expect_bad 4 multiple $Q $KV --segments 128,100 \
    --dilations 2,8
# options
check "unknown option" expect_bad 1 bogus $Q $KV --bogus
check "unknown option on 2 ranks" expect_bad 2 bogus $Q $KV --bogus
check "no inputs" expect_bad 1 generate --causal

# the device
check "unknown device" expect_bad 1 device $Q $KV --device tpu
check "--dtype without --device cuda" expect_bad 1 "device cuda" $Q $KV --dtype fp16
check "unknown dtype" expect_bad 1 dtype $Q $KV --device cuda --dtype fp8

# --device cuda where no GPU can run it: a dtengine built without CUDA says
# so (exit 2); one built with CUDA on a machine without a usable device
# fails naming the CUDA error, as a device fault (exit 7, dtengine(1): under
# an agent the node is suspect). Either way nothing is written.
expect_no_gpu() {
    _ng_dir=$TMPD/nogpu
    mkdir "$_ng_dir" || return 99
    run_attn 1 "$_ng_dir" $Q $KV --device cuda --out "$_ng_dir/o.npy"
    _ng_rc=$?
    case $_ng_rc in
    7) _ng_word="cuda" ;;
    2) _ng_word="built without CUDA" ;;
    *) echo "exit status $_ng_rc, want 7 or 2"; return 1 ;;
    esac
    if ! grep -qi -e "$_ng_word" "$_ng_dir.stderr"; then
        echo "exit $_ng_rc but stderr does not mention '$_ng_word':"
        sed 's/^/  /' "$_ng_dir.stderr"
        return 1
    fi
    if [ -e "$_ng_dir/o.npy" ]; then
        echo "o.npy written"
        return 1
    fi
    echo "exit $_ng_rc: $(grep -i -e "$_ng_word" "$_ng_dir.stderr" | head -n 1)"
}
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "# a GPU is present: --device cuda without a GPU is not checked here"
else
    check "--device cuda without a usable GPU" expect_no_gpu
fi

# An output that cannot be written after another was opened: the first
# must not be left behind, nor its temporary file.
check "--lse into a missing directory" expect_bad 2 no_such_dir $Q $KV \
    --out "$TMPD/bad$((NBAD + 1))/o.npy" --lse "$TMPD/no_such_dir/lse.npy"

# ---- happy path --------------------------------------------------------------------

# summary_line FILE R: exactly one line, with the keys a user reads
summary_line() {
    cat "$1"
    [ "$(wc -l <"$1")" -eq 1 ] || {
        echo "want exactly one line"
        return 1
    }
    for _sl_k in "tokens=$T " "ranks=$2 " "layout=" "seconds=" "gflops="; do
        grep -q -e "$_sl_k" "$1" || {
            echo "no '$_sl_k'"
            return 1
        }
    done
}
check "--generate R=1 run" run_attn 1 "$TMPD/gen1" --generate $T,$H,$HKV,$D --seed 1 --causal
check "--generate R=1 prints one summary line" summary_line "$TMPD/gen1.stdout" 1
check "--generate R=2 run" run_attn 2 "$TMPD/gen2" --generate $T,$H,$HKV,$D --seed 1
check "--generate R=2 prints one summary line" summary_line "$TMPD/gen2.stdout" 2

# npy_offset FILE: where the data of a .npy file starts
npy_offset() {
    # shellcheck disable=SC2046
    set -- $(od -An -tu1 -j6 -N6 "$1")
    case $1 in
    1) echo $((10 + $3 + 256 * $4)) ;;
    *) echo $((12 + $3 + 256 * $4 + 65536 * $5 + 16777216 * $6)) ;;
    esac
}

# npy_i64 FILE: the values of an int64 .npy file, one a line
npy_i64() {
    od -An -v -td8 -j"$(npy_offset "$1")" "$1" | tr -s ' ' '\n' | sed '/^$/d'
}

# zigzag_pos T R RANK: the positions rank RANK holds, one a line
zigzag_pos() {
    awk -v T="$1" -v R="$2" -v r="$3" 'BEGIN {
        h = T / (2 * R)
        for (i = r * h; i < (r + 1) * h; i++) print i
        for (i = (2 * R - 1 - r) * h; i < (2 * R - r) * h; i++) print i
    }'
}

# shard_files DIR R: exactly o, lse, pos for each rank and the manifest; nothing else
shard_files() {
    _sf_want=$(awk -v R="$2" 'BEGIN {
        print "attn.json"
        for (r = 0; r < R; r++) printf "lse.%d.npy\no.%d.npy\npos.%d.npy\n", r, r, r }' | sort)
    _sf_got=$(ls -A "$1" | sort)
    [ "$_sf_got" = "$_sf_want" ] || {
        echo "files in $1:" $_sf_got
        echo "want:" $_sf_want
        return 1
    }
}

# shard_pos DIR R RANK: pos.RANK.npy is int64 and holds the zigzag positions
shard_pos() {
    _sp_f=$1/pos.$3.npy
    dd if="$_sp_f" bs=128 count=1 2>/dev/null | grep -q "'<i8'" || {
        echo "$_sp_f is not int64"
        return 1
    }
    npy_i64 "$_sp_f" >"$TMPD/pos.got" && zigzag_pos $T "$2" "$3" >"$TMPD/pos.want" &&
        cmp "$TMPD/pos.got" "$TMPD/pos.want" && echo "$(wc -l <"$TMPD/pos.got") positions," \
        "first $(head -n 1 "$TMPD/pos.got"), last $(tail -n 1 "$TMPD/pos.got")"
}

# unshard DIR R NAME ROWFLOATS LIKE OUT: put the rows of NAME.RANK.npy back in
# position order (read from pos.RANK.npy), under the header of LIKE (the
# gathered file). ROWFLOATS = 0 for lse, which is (H, c): its columns move.
unshard() {
    _us_dir=$1 _us_R=$2 _us_name=$3 _us_row=$4 _us_like=$5 _us_out=$6
    _us_off=$(npy_offset "$_us_like")
    dd if="$_us_like" of="$_us_out" bs="$_us_off" count=1 2>/dev/null || return 1
    : >"$_us_out.raw"
    _us_c=$((T / _us_R))
    _us_r=0
    while [ $_us_r -lt "$_us_R" ]; do
        _us_sh=$_us_dir/$_us_name.$_us_r.npy
        dd if="$_us_sh" of="$TMPD/shard.raw" bs="$(npy_offset "$_us_sh")" skip=1 2>/dev/null ||
            return 1
        # runs of consecutive positions: local start, global start, length
        npy_i64 "$_us_dir/pos.$_us_r.npy" | awk '
            NR == 1 || $1 != prev + 1 { if (NR > 1) print ls, gs, n; ls = NR - 1; gs = $1; n = 0 }
            { n++; prev = $1 }
            END { print ls, gs, n }' >"$TMPD/runs"
        while read -r _us_ls _us_gs _us_n; do
            if [ "$_us_row" -gt 0 ]; then
                dd if="$TMPD/shard.raw" of="$_us_out.raw" bs=$((_us_row * 4)) skip="$_us_ls" \
                    seek="$_us_gs" count="$_us_n" conv=notrunc 2>/dev/null || return 1
            else
                _us_h=0
                while [ $_us_h -lt $H ]; do
                    dd if="$TMPD/shard.raw" of="$_us_out.raw" bs=4 \
                        skip=$((_us_h * _us_c + _us_ls)) seek=$((_us_h * T + _us_gs)) \
                        count="$_us_n" conv=notrunc 2>/dev/null || return 1
                    _us_h=$((_us_h + 1))
                done
            fi
        done <"$TMPD/runs"
        _us_r=$((_us_r + 1))
    done
    cat "$_us_out.raw" >>"$_us_out"
}

"$NPYTOOL" ref --q "$IN/q.npy" --k "$IN/k.npy" --v "$IN/v.npy" --causal \
    --out "$TMPD/ref.o.npy" --lse "$TMPD/ref.lse.npy" || die "npytool ref failed"
SH=$TMPD/shards
check "--out-dir R=2 zigzag run" run_attn 2 "$SH" $Q $KV --causal --layout zigzag \
    --out-dir "$SH"
check "--out-dir R=2 zigzag: o, lse, pos per rank, attn.json, no temporary files" shard_files "$SH" 2
check "--out-dir R=2 zigzag: the directory 0700, every file 0600 (outputs are private)" \
    sh -c "test \"\$(stat -c %a '$SH' '$SH'/*.npy | sort -u | tr '\n' ' ')\" = '600 700 '"
check "--out-dir R=2 zigzag: pos.0 is zigzag" shard_pos "$SH" 2 0
check "--out-dir R=2 zigzag: pos.1 is zigzag" shard_pos "$SH" 2 1
check "--out R=2 zigzag run" run_attn 2 "$TMPD/full" $Q $KV --causal --layout zigzag \
    --out "$TMPD/full.o.npy" --lse "$TMPD/full.lse.npy"
check "o shards in position order" unshard "$SH" 2 o $((H * D)) "$TMPD/full.o.npy" \
    "$TMPD/un.o.npy"
check "o shards equal the gathered --out" "$NPYTOOL" cmp "$TMPD/un.o.npy" "$TMPD/full.o.npy" \
    --atol 0
check "lse shards in position order" unshard "$SH" 2 lse 0 "$TMPD/full.lse.npy" \
    "$TMPD/un.lse.npy"
check "lse shards equal the gathered --lse" "$NPYTOOL" cmp "$TMPD/un.lse.npy" \
    "$TMPD/full.lse.npy" --atol 0
check "gathered o equals the reference" "$NPYTOOL" cmp "$TMPD/full.o.npy" "$TMPD/ref.o.npy" \
    --atol 1e-5
check "gathered lse equals the reference" "$NPYTOOL" cmp "$TMPD/full.lse.npy" \
    "$TMPD/ref.lse.npy" --atol 1e-5

# DT_ATTN_KERNEL: every kernel this CPU runs matches the reference; a name
# that is no kernel is warned about (escaped) and the run goes on with auto
kernel_run() {
    DT_ATTN_KERNEL=$1 run_attn 2 "$TMPD/k$1" $Q $KV --causal --layout zigzag \
        --out "$TMPD/k$1.o.npy" && "$NPYTOOL" cmp "$TMPD/k$1.o.npy" "$TMPD/ref.o.npy" --atol 1e-5
}
for kern in avx512 avx2 generic blas; do
    check "DT_ATTN_KERNEL=$kern R=2 zigzag causal o equals the reference" kernel_run $kern
done
bogus_kernel() {
    DT_ATTN_KERNEL=$(printf 'avx\033[31m') run_rc 0 "$DTENGINE" attn --generate 64,2,2,64 \
        --seed 1 && out_has "DT_ATTN_KERNEL 'avx\\\\x1b\\[31m' is not one of auto, .*, blas, or" &&
        out_has "using auto" && out_lacks "$(printf '\033')"
}
check "DT_ATTN_KERNEL that is no kernel: warned, escaped, run on auto" bogus_kernel

finish
