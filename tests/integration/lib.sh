#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Shared setup for the integration scripts; sourced, never run. It finds the
# built binaries (DT_BUILDDIR, set by `make check`, or the tree this script
# sits in), makes one private temporary directory ($TMPD) that is removed on
# exit, runs ranks under mpirun (`mpirun_np R CMD...`), counts checks
# (`check NAME CMD...`, then `finish`) and damages files for the fault
# tests in ways verified to change them (`corrupt_bytes`, `shorten_file`).
# Exit codes follow the automake test driver: 0 pass, 1 a check failed, 77
# skip (with the reason), 99 hard error (the test itself could not run). It
# is not a test framework: no fixtures, no parallelism, POSIX sh only.

set -u

DT_TESTDIR=$(cd "$(dirname "$0")" && pwd) || exit 99
DT_TESTNAME=$(basename "$0" .sh)
: "${DT_SRCDIR:=$(cd "$DT_TESTDIR/../.." && pwd)}"
: "${DT_BUILDDIR:=$(cd "$DT_TESTDIR/../.." && pwd)}"
: "${MPIRUN:=mpirun}"
DTENGINE=$DT_BUILDDIR/engine/dtengine
NPYTOOL=$DT_BUILDDIR/tests/tools/npytool

# die MSG: the test could not run (missing binary, cannot make inputs)
die() {
    echo "ERROR: $DT_TESTNAME: $*"
    echo "ERROR: $DT_TESTNAME: $*" >&2
    exit 99
}

# skip MSG: something the test needs is missing here; say what
skip() {
    echo "SKIP: $DT_TESTNAME: $*"
    echo "SKIP: $DT_TESTNAME: $*" >&2
    exit 77
}

for _lib_bin in "$DTENGINE" "$NPYTOOL"; do
    [ -x "$_lib_bin" ] ||
        die "$_lib_bin is not built (make engine/dtengine tests/tools/npytool; DT_BUILDDIR=$DT_BUILDDIR)"
done

TMPD=$(mktemp -d "${TMPDIR:-/tmp}/dt-$DT_TESTNAME.XXXXXX") || die "mktemp -d failed"
trap 'rm -rf "$TMPD"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# ---- mpirun -----------------------------------------------------------------

# Open MPI refuses root without these; containers and CI often run as root.
if [ "$(id -u)" = 0 ]; then
    OMPI_ALLOW_RUN_AS_ROOT=1
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
fi
# More ranks than cores is the point of these tests. Single-copy (CMA)
# transfers fail in containers without ptrace rights; copy through shared
# memory instead, which is all a test needs.
OMPI_MCA_rmaps_base_oversubscribe=1
OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe OMPI_MCA_btl_vader_single_copy_mechanism

DT_TIMEOUT=
if command -v timeout >/dev/null 2>&1; then
    DT_TIMEOUT=timeout
fi

# mpirun_np R CMD...: CMD as R ranks on this host, killed after 300 s
mpirun_np() {
    _mp_np=$1
    shift
    if [ -n "$DT_TIMEOUT" ]; then
        "$DT_TIMEOUT" 300 "$MPIRUN" --oversubscribe --mca pml ob1 --mca btl self,vader \
            -np "$_mp_np" "$@"
    else
        "$MPIRUN" --oversubscribe --mca pml ob1 --mca btl self,vader -np "$_mp_np" "$@"
    fi
}

# need_mpirun: skip unless mpirun exists and can start two ranks here
need_mpirun() {
    command -v "$MPIRUN" >/dev/null 2>&1 || skip "mpirun not found (MPIRUN=$MPIRUN)"
    if ! mpirun_np 2 true >"$TMPD/mpirun-probe.out" 2>&1; then
        sed 's/^/    /' "$TMPD/mpirun-probe.out" | head -20
        skip "$MPIRUN cannot start 2 processes on this host (output above)"
    fi
}

# ---- checks -------------------------------------------------------------------

DT_PASSED=0
DT_FAILED=0
DT_CHECK_LAST=$(date +%s)

# check NAME CMD...: run CMD; print `ok NAME` (with CMD's output when it is
# one line), or `FAIL NAME` with the exit status and CMD's output indented.
# Each line ends with [+N s]: the seconds since the previous check ended
# (or the script began), its setup included: where a script's time goes.
# DT_CHECK_ONLY (an extended regular expression, for a developer rerunning
# what changed; CI never sets it): the checks whose name does not match
# are left out, neither run nor counted (a script's own setup still runs).
check() {
    _ck_name=$1
    shift
    if [ -n "${DT_CHECK_ONLY:-}" ] && ! printf '%s\n' "$_ck_name" | grep -Eq -- "$DT_CHECK_ONLY"; then
        return 0
    fi
    "$@" >"$TMPD/check.out" 2>&1
    _ck_rc=$?
    _ck_now=$(date +%s)
    _ck_s=$((_ck_now - DT_CHECK_LAST))
    DT_CHECK_LAST=$_ck_now
    if [ "$_ck_rc" -eq 0 ]; then
        DT_PASSED=$((DT_PASSED + 1))
        if [ "$(wc -l <"$TMPD/check.out")" -eq 1 ]; then
            echo "ok $_ck_name # $(cat "$TMPD/check.out") [+$_ck_s s]"
        else
            echo "ok $_ck_name [+$_ck_s s]"
        fi
    else
        DT_FAILED=$((DT_FAILED + 1))
        echo "FAIL $_ck_name (exit $_ck_rc) [+$_ck_s s]"
        head -n 40 "$TMPD/check.out" | sed 's/^/    /'
    fi
    return 0
}

# finish: the summary line; exit 1 if any check failed
finish() {
    echo "$DT_PASSED passed, $DT_FAILED failed"
    [ "$DT_FAILED" -eq 0 ] || exit 1
    [ "$DT_PASSED" -gt 0 ] || die "no check ran"
    exit 0
}

# ---- helpers ----------------------------------------------------------------

# run_rc WANT CMD...: CMD must exit WANT; its output (both streams) is kept
# in $TMPD/out for out_has
run_rc() {
    _rr_want=$1
    shift
    "$@" >"$TMPD/out" 2>&1
    _rr_rc=$?
    if [ "$_rr_rc" -ne "$_rr_want" ]; then
        echo "expected exit $_rr_want, got $_rr_rc: $*"
        sed 's/^/  | /' "$TMPD/out" | head -n 30
        return 1
    fi
    return 0
}

# out_has ERE / out_lacks ERE: the last run_rc output matches (does not)
out_has() {
    grep -q -E -e "$1" "$TMPD/out" && return 0
    echo "output lacks /$1/:"
    sed 's/^/  | /' "$TMPD/out" | head -n 30
    return 1
}
out_lacks() {
    grep -q -E -e "$1" "$TMPD/out" || return 0
    echo "output has /$1/:"
    sed 's/^/  | /' "$TMPD/out" | head -n 30
    return 1
}


# gen_qkv DIR T H Hkv D SEED [--f16]: q.npy k.npy v.npy dout.npy in DIR, the
# same values as `dtengine attn --generate T,H,Hkv,D --seed SEED`
gen_qkv() {
    _gq_dir=$1 _gq_q=$2,$3,$5 _gq_kv=$2,$4,$5 _gq_seed=$6
    shift 6
    mkdir -p "$_gq_dir" || die "cannot create $_gq_dir"
    "$NPYTOOL" gen --shape "$_gq_q" --seed "$_gq_seed" --stream 1 "$@" "$_gq_dir/q.npy" &&
        "$NPYTOOL" gen --shape "$_gq_kv" --seed "$_gq_seed" --stream 2 "$@" "$_gq_dir/k.npy" &&
        "$NPYTOOL" gen --shape "$_gq_kv" --seed "$_gq_seed" --stream 3 "$@" "$_gq_dir/v.npy" &&
        "$NPYTOOL" gen --shape "$_gq_q" --seed "$_gq_seed" --stream 4 "$@" "$_gq_dir/dout.npy" ||
        die "npytool gen failed for $_gq_dir"
}

# ---- injected faults ----------------------------------------------------------
# A fault written as a fixed value is no fault where the file already holds
# that value (a byte 'X' over a byte 'X'), and the test then checks nothing.
# These change the file by construction and verify that it changed; they
# return 1, saying why, when it did not.

# corrupt_bytes FILE OFFSET [COUNT]: flip every bit of COUNT (default 1)
# bytes of FILE at OFFSET, in place (its size kept)
corrupt_bytes() {
    _cb_f=$1 _cb_off=$2 _cb_n=${3:-1}
    [ -f "$_cb_f" ] || { echo "corrupt_bytes: $_cb_f: not a file"; return 1; }
    _cb_size=$(wc -c <"$_cb_f" | tr -d ' ')
    [ "$_cb_n" -gt 0 ] && [ $((_cb_off + _cb_n)) -le "$_cb_size" ] || {
        echo "corrupt_bytes: bytes $_cb_off..$((_cb_off + _cb_n - 1)) are not in $_cb_f ($_cb_size bytes)"
        return 1
    }
    _cb_before=$(sha256sum <"$_cb_f")
    _cb_esc=
    for _cb_b in $(od -An -v -tu1 -j "$_cb_off" -N "$_cb_n" "$_cb_f"); do
        _cb_esc="$_cb_esc\\$(printf %03o $((_cb_b ^ 255)))"
    done
    # shellcheck disable=SC2059 # the format is the new bytes in octal
    printf "$_cb_esc" | dd of="$_cb_f" bs=1 seek="$_cb_off" conv=notrunc 2>/dev/null || {
        echo "corrupt_bytes: cannot write $_cb_f"
        return 1
    }
    [ "$(wc -c <"$_cb_f" | tr -d ' ')" = "$_cb_size" ] && [ "$(sha256sum <"$_cb_f")" != "$_cb_before" ] || {
        echo "corrupt_bytes: $_cb_f is not corrupt: its size or content did not change as meant"
        return 1
    }
}

# shorten_file FILE SIZE: cut FILE to SIZE bytes (-N: N bytes fewer); it
# must have been longer
shorten_file() {
    _sf_f=$1
    [ -f "$_sf_f" ] || { echo "shorten_file: $_sf_f: not a file"; return 1; }
    _sf_old=$(wc -c <"$_sf_f" | tr -d ' ')
    case $2 in
    -*) _sf_new=$((_sf_old - ${2#-})) ;;
    *) _sf_new=$2 ;;
    esac
    [ "$_sf_new" -ge 0 ] && [ "$_sf_new" -lt "$_sf_old" ] || {
        echo "shorten_file: $_sf_f has $_sf_old bytes: cannot cut it to $_sf_new"
        return 1
    }
    truncate -s "$_sf_new" "$_sf_f" && [ "$(wc -c <"$_sf_f" | tr -d ' ')" = "$_sf_new" ] || {
        echo "shorten_file: $_sf_f was not cut to $_sf_new bytes"
        return 1
    }
}

# maxerr A B: max |A - B|, or "nan" when it cannot be computed
maxerr() {
    "$NPYTOOL" maxerr "$1" "$2" 2>/dev/null || echo nan
}
