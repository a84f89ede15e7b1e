#!/bin/sh
# SPDX-License-Identifier: MIT
#
# sanrun.sh TEST [ARGS...]: one test of a --enable-sanitizers build (the
# LOG_COMPILER of `make check` there), so that any sanitizer report fails
# it. Every process the test starts (daemons, agents, workers under mpirun
# or under an agent, commands run as another user) inherits ASAN_OPTIONS,
# UBSAN_OPTIONS and LSAN_OPTIONS that write each report to a file in a
# fresh directory, tests/san/NAME in the build tree (mode 1777: processes
# run as nobody report there too). After the test the reports are copied
# into its log and a test that passed or skipped fails (exit 1). Leaks
# inside third-party libraries only are suppressed (tests/lsan.supp);
# options already in the environment are kept and win. Not a test itself.

[ $# -ge 1 ] || { echo "usage: sanrun.sh TEST [ARGS...]" >&2; exit 99; }
: "${DT_BUILDDIR:=$(pwd)}"
: "${DT_SRCDIR:=$(cd "$(dirname "$0")/.." && pwd)}"
name=$(basename "$1")
dir=$DT_BUILDDIR/tests/san/$name
rm -rf "$dir" && mkdir -p "$dir" && chmod 1777 "$dir" || {
    echo "sanrun: cannot make $dir"
    exit 99
}

# halt_on_error: the first error ends the process (UBSan: with
# -fno-sanitize-recover too); reports go to DIR/asan.PID, DIR/ubsan.PID.
# fast_unwind_on_malloc=0: allocations made inside libraries built without
# frame pointers (jansson, libpmix) still show the dt caller, which both
# the reader and the suppressions need.
ASAN_OPTIONS="log_path=$dir/asan:halt_on_error=1:detect_leaks=1:fast_unwind_on_malloc=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
UBSAN_OPTIONS="log_path=$dir/ubsan:halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
LSAN_OPTIONS="suppressions=$DT_SRCDIR/tests/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
# the scripts relax what sanitized binaries cannot take (ulimit -v)
DT_SANITIZERS=1
export ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS DT_SANITIZERS

"$@"
rc=$?

n=$(find "$dir" -type f | wc -l)
if [ "$n" -gt 0 ]; then
    echo "sanrun: $n sanitizer report(s) from $name (exit $rc):"
    for f in "$dir"/*; do
        echo "---- $(basename "$f")"
        cat "$f"
    done
    echo "sanrun: $name failed: sanitizer reports above (kept in $dir)"
    case $rc in 0 | 77) rc=1 ;; esac
else
    rmdir "$dir" 2>/dev/null
fi
exit $rc
