#!/bin/sh
# SPDX-License-Identifier: MIT
#
# The frame decoder against its fuzz corpus: replays every seed in
# tests/fuzz/corpus through the fuzz target built as a plain program
# (tests/fuzz/fuzz_msg_replay), then, where clang's libFuzzer is at hand,
# fuzzes for DT_FUZZ_SECONDS (default 30; 0 skips it) with -max_len=4096
# over a temporary copy of the corpus. The libFuzzer binary is built from
# the current sources into a temporary directory with $FUZZ_CC (default
# clang-14, then clang); without one, the tests/fuzz/fuzz_msg left by
# `make fuzz` is used; without either, the fuzzing check is skipped with a
# message. Any crash, sanitizer report or leak fails the test and its
# reproducer is kept in $DT_BUILDDIR/tests/fuzz/. The source tree is only
# read (VPATH builds, make distcheck). Exit codes as in lib.sh: 0 pass,
# 1 a check failed, 99 the test could not run.

set -u

DT_TESTDIR=$(cd "$(dirname "$0")" && pwd) || exit 99
DT_TESTNAME=$(basename "$0" .sh)
: "${DT_SRCDIR:=$(cd "$DT_TESTDIR/../.." && pwd)}"
: "${DT_BUILDDIR:=$(cd "$DT_TESTDIR/../.." && pwd)}"
: "${DT_FUZZ_SECONDS:=30}"
REPLAY=$DT_BUILDDIR/tests/fuzz/fuzz_msg_replay
CORPUS=$DT_SRCDIR/tests/fuzz/corpus

die() {
    echo "ERROR: $DT_TESTNAME: $*"
    echo "ERROR: $DT_TESTNAME: $*" >&2
    exit 99
}

[ -x "$REPLAY" ] || die "$REPLAY is not built (make tests/fuzz/fuzz_msg_replay; DT_BUILDDIR=$DT_BUILDDIR)"
[ -d "$CORPUS" ] || die "no corpus at $CORPUS (DT_SRCDIR=$DT_SRCDIR)"
case $DT_FUZZ_SECONDS in
'' | *[!0-9]*) die "DT_FUZZ_SECONDS must be a whole number of seconds, not '$DT_FUZZ_SECONDS'" ;;
esac

TMPD=$(mktemp -d "${TMPDIR:-/tmp}/dt-$DT_TESTNAME.XXXXXX") || die "mktemp -d failed"
trap 'rm -rf "$TMPD"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

DT_PASSED=0
DT_FAILED=0

pass() {
    DT_PASSED=$((DT_PASSED + 1))
    echo "ok $*"
}

# fail NAME LOG: count a failure and show the end of LOG
fail() {
    DT_FAILED=$((DT_FAILED + 1))
    echo "FAIL $1"
    tail -n 40 "$2" | sed 's/^/    /'
}

# ---- replay: every seed through the decoder, no libFuzzer needed -------------

set -- "$CORPUS"/*
[ -e "$1" ] || die "the corpus at $CORPUS is empty"
NSEEDS=$#
if "$REPLAY" "$@" >"$TMPD/replay.out" 2>&1 &&
    grep -qx "replayed $NSEEDS inputs" "$TMPD/replay.out"; then
    pass "replay # $(tail -n 1 "$TMPD/replay.out")"
else
    fail "replay ($NSEEDS seeds, exit status or count wrong)" "$TMPD/replay.out"
fi

# ---- fuzz: a bounded libFuzzer run -------------------------------------------

# A libFuzzer binary from the current sources, or the one `make fuzz` left.
FUZZER=
FUZZ_SKIP=
find_fuzzer() {
    _cc=${FUZZ_CC:-}
    if [ -z "$_cc" ]; then
        for _c in clang-14 clang; do
            if command -v "$_c" >/dev/null 2>&1; then
                _cc=$_c
                break
            fi
        done
    fi
    if [ -n "$_cc" ]; then
        echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' \
            >"$TMPD/probe.c"
        if "$_cc" -fsanitize=fuzzer,address "$TMPD/probe.c" -o "$TMPD/probe" \
            >"$TMPD/probe.out" 2>&1; then
            _jcflags=$(pkg-config --cflags jansson 2>/dev/null) || _jcflags=
            _jlibs=$(pkg-config --libs jansson 2>/dev/null) || _jlibs=-ljansson
            # The flags of `make fuzz`, and UBSan findings stop the run.
            # shellcheck disable=SC2086 # pkg-config output is word lists
            if "$_cc" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
                -g -O1 -std=gnu11 -D_GNU_SOURCE -I"$DT_SRCDIR" -I"$DT_BUILDDIR" $_jcflags \
                "$DT_SRCDIR/tests/fuzz/fuzz_msg.c" "$DT_SRCDIR/common/msg.c" \
                "$DT_SRCDIR/common/err.c" "$DT_SRCDIR/common/mem.c" "$DT_SRCDIR/common/text.c" \
                $_jlibs \
                -o "$TMPD/fuzz_msg" >"$TMPD/build.out" 2>&1; then
                FUZZER=$TMPD/fuzz_msg
                pass "build # $_cc -fsanitize=fuzzer,address,undefined"
            else
                fail "build ($_cc links libFuzzer but fuzz_msg.c does not build)" \
                    "$TMPD/build.out"
            fi
            return
        fi
    fi
    if [ -x "$DT_BUILDDIR/tests/fuzz/fuzz_msg" ]; then
        FUZZER=$DT_BUILDDIR/tests/fuzz/fuzz_msg
        echo "note: no clang with libFuzzer here; using $FUZZER from make fuzz"
        return
    fi
    FUZZ_SKIP="no clang with libFuzzer (FUZZ_CC=${FUZZ_CC:-clang-14 or clang}) and no tests/fuzz/fuzz_msg from make fuzz"
}

if [ "$DT_FUZZ_SECONDS" -eq 0 ]; then
    echo "skip fuzz: DT_FUZZ_SECONDS=0"
else
    find_fuzzer
    if [ -n "$FUZZ_SKIP" ]; then
        echo "skip fuzz: $FUZZ_SKIP"
    elif [ -n "$FUZZER" ]; then
        # libFuzzer adds what it finds to its first corpus directory: a
        # writable copy, never the source tree.
        mkdir "$TMPD/corpus" "$TMPD/artifacts" || die "cannot create directories in $TMPD"
        cp "$CORPUS"/* "$TMPD/corpus/" || die "cannot copy the corpus"
        chmod u+w "$TMPD/corpus"/*
        _limit=
        if command -v timeout >/dev/null 2>&1; then
            _limit="timeout $((DT_FUZZ_SECONDS + 300))"
        fi
        # shellcheck disable=SC2086 # _limit is a command and its argument
        (cd "$TMPD" &&
            ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0} \
            UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
            $_limit "$FUZZER" -max_total_time="$DT_FUZZ_SECONDS" -max_len=4096 -timeout=10 \
                -print_final_stats=1 -artifact_prefix="$TMPD/artifacts/" \
                "$TMPD/corpus") >"$TMPD/fuzz.log" 2>&1
        _rc=$?
        _found=$(find "$TMPD/artifacts" -type f | wc -l)
        _stats=$(grep -E '^Done [0-9]+ runs in' "$TMPD/fuzz.log" | tail -n 1)
        _cov=$(grep -E '^#[0-9]+.*cov: ' "$TMPD/fuzz.log" | tail -n 1 |
            sed -n 's/.*\(cov: [0-9]* ft: [0-9]* corp: [0-9/]*[a-zA-Z]*\).*/\1/p')
        if [ "$_rc" -eq 0 ] && [ "$_found" -eq 0 ] && [ -n "$_stats" ] &&
            ! grep -q 'runtime error:' "$TMPD/fuzz.log"; then
            pass "fuzz # $_stats, $_cov, 0 crashes"
        else
            _keep=$DT_BUILDDIR/tests/fuzz/findings
            if [ "$_found" -gt 0 ] && mkdir -p "$_keep" && cp "$TMPD/artifacts"/* "$_keep/"; then
                echo "    reproducers kept in $_keep (replay: $REPLAY $_keep/*)"
            fi
            fail "fuzz (exit $_rc, $_found reproducers)" "$TMPD/fuzz.log"
        fi
    fi
fi

echo "$DT_PASSED passed, $DT_FAILED failed"
[ "$DT_FAILED" -eq 0 ] || exit 1
exit 0
