#!/bin/sh
# SPDX-License-Identifier: MIT
#
# checks.sh: what the device scripts (e2e.sh, hf.sh, recompute.sh) share;
# sourced, never run. They take BUNDLEDIR WORKDIR (the engine and its
# libraries from tests/gpu/bundle.sh, and a scratch folder); this sets b
# and dir, makes dir, counts checks (verdict WHAT OK) and ends with
# "N passed, N failed" (summary, whose status is the script's).

set -u
[ $# -eq 2 ] || {
    echo "usage: sh $0 BUNDLEDIR WORKDIR   (LD_LIBRARY_PATH set by the caller)" >&2
    exit 2
}
b=$1 dir=$2
mkdir -p "$dir" || exit 1
passed=0
failed=0

# verdict WHAT OK: one line, counted (OK is 1 for a pass)
verdict() {
    if [ "$2" = 1 ]; then
        echo "ok   $1"
        passed=$((passed + 1))
    else
        echo "FAIL $1"
        failed=$((failed + 1))
    fi
}

summary() {
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}
