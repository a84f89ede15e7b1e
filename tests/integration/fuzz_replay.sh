#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Every parser of untrusted bytes against its fuzz corpus: the protocol's
# frame decoder (msg, corpus tests/fuzz/corpus) and the engine's file
# readers (safetensors header with the training-shard slice check,
# checkpoint manifest, .npy header, token file header (llm.c shard or
# .npy token ids); corpora
# tests/fuzz/corpus-TARGET). Every seed is replayed through
# tests/fuzz/fuzz_TARGET.c built as a plain program
# (tests/fuzz/fuzz_TARGET_replay); then, where
# clang's libFuzzer is at hand, each target is built from the current
# sources into a temporary directory with $FUZZ_CC (default clang-14, then
# clang) and fuzzed for DT_FUZZ_SECONDS (default 15; 0 skips it) with
# -max_len=4096 over a temporary copy of its corpus. Without a clang that
# links libFuzzer the fuzzing checks are skipped with a message. Any
# crash, sanitizer report, failed consistency check or leak fails the test
# and its reproducer is kept in $DT_BUILDDIR/tests/fuzz/findings-TARGET/.
# The source tree is only read. Exit codes as in lib.sh: 0 pass, 1 a check
# failed, 99 the test could not run.

set -u

DT_TESTDIR=$(cd "$(dirname "$0")" && pwd) || exit 99
DT_TESTNAME=$(basename "$0" .sh)
: "${DT_SRCDIR:=$(cd "$DT_TESTDIR/../.." && pwd)}"
: "${DT_BUILDDIR:=$(cd "$DT_TESTDIR/../.." && pwd)}"
: "${DT_FUZZ_SECONDS:=15}"
TARGETS="msg safetensors manifest npy tokshard"

# corpus TARGET: its seed directory (the decoder's came first: no suffix)
corpus() {
    if [ "$1" = msg ]; then
        echo "$DT_SRCDIR/tests/fuzz/corpus"
    else
        echo "$DT_SRCDIR/tests/fuzz/corpus-$1"
    fi
}

die() {
    echo "ERROR: $DT_TESTNAME: $*"
    echo "ERROR: $DT_TESTNAME: $*" >&2
    exit 99
}

case $DT_FUZZ_SECONDS in
'' | *[!0-9]*) die "DT_FUZZ_SECONDS must be a whole number of seconds, not '$DT_FUZZ_SECONDS'" ;;
esac
for t in $TARGETS; do
    [ -x "$DT_BUILDDIR/tests/fuzz/fuzz_${t}_replay" ] ||
        die "tests/fuzz/fuzz_${t}_replay is not built (make check builds it; DT_BUILDDIR=$DT_BUILDDIR)"
    [ -d "$(corpus "$t")" ] || die "no corpus at $(corpus "$t")"
done

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

# ---- replay: every seed, no libFuzzer needed ---------------------------------

for t in $TARGETS; do
    set -- "$(corpus "$t")"/*
    [ -e "$1" ] || die "the corpus $(corpus "$t") is empty"
    n=$#
    if "$DT_BUILDDIR/tests/fuzz/fuzz_${t}_replay" "$@" >"$TMPD/replay-$t.out" 2>&1 &&
        grep -qx "replayed $n inputs" "$TMPD/replay-$t.out"; then
        pass "replay $t # $(tail -n 1 "$TMPD/replay-$t.out")"
    else
        fail "replay $t ($n seeds, exit status or count wrong)" "$TMPD/replay-$t.out"
    fi
done

# ---- fuzz: a bounded libFuzzer run per target ----------------------------------

# The sources of each target besides its fuzz_TARGET.c.
sources() {
    _c="$DT_SRCDIR/common/err.c $DT_SRCDIR/common/mem.c $DT_SRCDIR/common/fileio.c"
    _c="$_c $DT_SRCDIR/common/text.c"
    # spec/model.c resolves its defaults through the key table (spec.c)
    _spec="$DT_SRCDIR/spec/model.c $DT_SRCDIR/spec/spec.c $DT_SRCDIR/spec/vocab.c"
    _spec="$_spec $DT_SRCDIR/spec/attn_spec.c $DT_SRCDIR/spec/mask.c $DT_SRCDIR/spec/mask_rules.c $DT_SRCDIR/spec/layout.c $DT_SRCDIR/spec/dtype.c"
    _spec="$_spec $DT_SRCDIR/common/conf.c"
    case $1 in
    msg) echo "$_c $DT_SRCDIR/common/msg.c $DT_SRCDIR/common/wire.c" ;;
    safetensors | manifest) echo "$_c $DT_SRCDIR/common/sha256.c $DT_SRCDIR/io/json.c" \
        "$DT_SRCDIR/io/safetensors.c $DT_SRCDIR/io/ckpt.c $_spec" ;;
    npy) echo "$_c $DT_SRCDIR/common/half.c $DT_SRCDIR/io/npy.c" ;;
    tokshard) echo "$_c $DT_SRCDIR/common/half.c $DT_SRCDIR/io/npy.c $DT_SRCDIR/io/tokshard.c" ;;
    esac
}

find_cc() {
    _cc=${FUZZ_CC:-}
    if [ -z "$_cc" ]; then
        for _c in clang-14 clang; do
            if command -v "$_c" >/dev/null 2>&1; then
                _cc=$_c
                break
            fi
        done
    fi
    [ -n "$_cc" ] || return 1
    echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' >"$TMPD/probe.c"
    "$_cc" -fsanitize=fuzzer,address "$TMPD/probe.c" -o "$TMPD/probe" >/dev/null 2>&1 || return 1
    echo "$_cc"
}

if [ "$DT_FUZZ_SECONDS" -eq 0 ]; then
    echo "skip fuzz: DT_FUZZ_SECONDS=0"
elif ! CC_FUZZ=$(find_cc); then
    echo "skip fuzz: no clang with libFuzzer (FUZZ_CC=${FUZZ_CC:-clang-14 or clang})"
else
    _jcflags=$(pkg-config --cflags jansson libcrypto 2>/dev/null) || _jcflags=
    _jlibs=$(pkg-config --libs jansson libcrypto 2>/dev/null) || _jlibs="-ljansson -lcrypto"
    _limit=
    if command -v timeout >/dev/null 2>&1; then
        _limit="timeout $((DT_FUZZ_SECONDS + 300))"
    fi
    for t in $TARGETS; do
        # The flags of `make fuzz`: UBSan findings stop the run.
        # shellcheck disable=SC2046,SC2086 # word lists
        if ! "$CC_FUZZ" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
            -g -O1 -std=gnu11 -D_GNU_SOURCE -I"$DT_SRCDIR" -I"$DT_BUILDDIR" $_jcflags \
            "$DT_SRCDIR/tests/fuzz/fuzz_$t.c" $(sources "$t") $_jlibs -lm \
            -o "$TMPD/fuzz_$t" >"$TMPD/build-$t.out" 2>&1; then
            fail "build $t ($CC_FUZZ links libFuzzer but fuzz_$t.c does not build)" \
                "$TMPD/build-$t.out"
            continue
        fi
        # libFuzzer adds what it finds to its first corpus directory: a
        # writable copy, never the source tree.
        mkdir "$TMPD/corpus-$t" "$TMPD/artifacts-$t" || die "cannot create directories in $TMPD"
        cp "$(corpus "$t")"/* "$TMPD/corpus-$t/" || die "cannot copy the corpus"
        chmod u+w "$TMPD/corpus-$t"/*
        # shellcheck disable=SC2086 # _limit is a command and its argument
        (cd "$TMPD" &&
            ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0} \
            UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
            $_limit "$TMPD/fuzz_$t" -max_total_time="$DT_FUZZ_SECONDS" -max_len=4096 -timeout=10 \
                -print_final_stats=1 -artifact_prefix="$TMPD/artifacts-$t/" \
                "$TMPD/corpus-$t") >"$TMPD/fuzz-$t.log" 2>&1
        _rc=$?
        _found=$(find "$TMPD/artifacts-$t" -type f | wc -l)
        _stats=$(grep -E '^Done [0-9]+ runs in' "$TMPD/fuzz-$t.log" | tail -n 1)
        _cov=$(grep -E '^#[0-9]+.*cov: ' "$TMPD/fuzz-$t.log" | tail -n 1 |
            sed -n 's/.*\(cov: [0-9]* ft: [0-9]* corp: [0-9/]*[a-zA-Z]*\).*/\1/p')
        if [ "$_rc" -eq 0 ] && [ "$_found" -eq 0 ] && [ -n "$_stats" ] &&
            ! grep -q 'runtime error:' "$TMPD/fuzz-$t.log"; then
            pass "fuzz $t # $_stats, $_cov, 0 crashes"
        else
            _keep=$DT_BUILDDIR/tests/fuzz/findings-$t
            if [ "$_found" -gt 0 ] && mkdir -p "$_keep" && cp "$TMPD/artifacts-$t"/* "$_keep/"; then
                echo "    reproducers kept in $_keep" \
                    "(replay: $DT_BUILDDIR/tests/fuzz/fuzz_${t}_replay $_keep/*)"
            fi
            fail "fuzz $t (exit $_rc, $_found reproducers)" "$TMPD/fuzz-$t.log"
        fi
    done
fi

echo "$DT_PASSED passed, $DT_FAILED failed"
[ "$DT_FAILED" -eq 0 ] || exit 1
exit 0
