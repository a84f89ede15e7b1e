#!/bin/sh
# SPDX-License-Identifier: MIT
#
# The shape of the tree, checked (STYLE.md "Shape of the tree"):
#  1. tiers: a folder includes only from itself and the folders below it
#     (the table below); an include that points up or sideways fails;
#  2. one definition: a non-static dt_* function is defined in at most one
#     source outside tests/ and bench/;
#  3. no cycles between files: two sources of one folder never call each
#     other's dt_* functions by name (a lower file calls back through a
#     function pointer or hook it was given).
# Usage: contrib/check-tree.sh [SRCDIR]. Prints every offence as FILE:LINE
# and exits 1 if there is one, 0 otherwise. make check runs it
# (tests/integration/tree.sh), which also checks that it can fail.

root=${1:-.}
cd "$root" || exit 2

# folder: the folders its sources may include from (itself always)
allowed() {
    case $1 in
    common) echo "" ;;
    spec) echo "common" ;;
    io) echo "common spec" ;;
    db) echo "common spec" ;;
    plan) echo "common spec" ;;
    kernels) echo "common spec" ;; # spec/dtype.h
    engine) echo "common spec io kernels" ;;
    coordinator) echo "common spec plan io db" ;;
    agent) echo "common spec io" ;;
    cli) echo "common spec plan io" ;;
    *) echo "-" ;; # tests, bench, contrib: anything
    esac
}

bad=0
for dir in common spec io db plan kernels engine coordinator agent cli; do
    [ -d "$dir" ] || continue
    ok=" $dir $(allowed "$dir") "
    # "DIR/x.h" includes only: <...> and "config.h" are not the tree's
    find "$dir" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) |
        sort | while read -r f; do
        grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[a-z_]*/' "$f" |
            while IFS= read -r hit; do
                line=${hit%%:*}
                inc=$(printf '%s\n' "$hit" | sed 's/^[^"]*"\([a-z_]*\)\/.*/\1/')
                case $ok in
                *" $inc "*) ;;
                *) echo "$f:$line: $dir/ includes from $inc/ (allowed: $(allowed "$dir" | sed 's/^$/nothing/'))" ;;
                esac
            done
    done
done >"${TMPDIR:-/tmp}/dt-tree.$$"
if [ -s "${TMPDIR:-/tmp}/dt-tree.$$" ]; then
    cat "${TMPDIR:-/tmp}/dt-tree.$$"
    bad=1
fi

# Non-static dt_* definitions: a line that starts a definition at column 0
# (return type, then dt_name( ... and no ';' on the line: the house format).
find common spec io db plan kernels engine coordinator agent cli -type f \
    \( -name '*.c' -o -name '*.cu' \) 2>/dev/null | sort | while read -r f; do
    awk -v f="$f" '
        /^(static|extern|typedef|#|[ \t\/*}])/ { next }
        match($0, /[ *]dt_[a-z0-9_]+\(/) {
            name = substr($0, RSTART + 1, RLENGTH - 2)
            if (index($0, ";") == 0) print name, f ":" NR
        }' "$f"
done | sort | awk '
    { files[$1] = files[$1] " " $2; split($2, p, ":");
      if (!(($1, p[1]) in seen)) { seen[$1, p[1]] = 1; n[$1]++ } }
    END { for (k in n) if (n[k] > 1) printf "%s is defined in %d sources:%s\n", k, n[k], files[k] }
' >"${TMPDIR:-/tmp}/dt-defs.$$"
if [ -s "${TMPDIR:-/tmp}/dt-defs.$$" ]; then
    sort "${TMPDIR:-/tmp}/dt-defs.$$"
    bad=1
fi

# Calls between the sources of one folder: "A calls B" when A names a dt_*
# function that B defines (non-static, the definitions found above) and
# calls it (name followed by "("). Two files that call each other fail.
for dir in $(find common spec io db plan kernels engine coordinator agent cli -type d 2>/dev/null); do
    srcs=$(find "$dir" -maxdepth 1 -type f \( -name '*.c' -o -name '*.cu' \) | sort)
    [ -n "$srcs" ] || continue
    for f in $srcs; do
        awk -v f="$f" '
            /^(static|extern|typedef|#|[ \t\/*}])/ { next }
            match($0, /[ *]dt_[a-z0-9_]+\(/) {
                if (index($0, ";") == 0) print substr($0, RSTART + 1, RLENGTH - 2), f
            }' "$f"
    done >"${TMPDIR:-/tmp}/dt-fdefs.$$"
    for f in $srcs; do
        # calls in f (comments and strings are not stripped: a name in a
        # comment followed by "(" counts, which errs on the strict side)
        grep -o 'dt_[a-z0-9_]*[[:space:]]*(' "$f" | sed 's/[[:space:]]*($//' | sort -u |
            while read -r name; do
                awk -v n="$name" -v f="$f" '$1 == n && $2 != f { print f, $2 }' \
                    "${TMPDIR:-/tmp}/dt-fdefs.$$"
            done
    done | sort -u >"${TMPDIR:-/tmp}/dt-calls.$$"
    awk '{ e[$1 " " $2] = 1 } END {
        for (k in e) { split(k, p, " "); if (p[1] < p[2] && ((p[2] " " p[1]) in e))
            printf "%s and %s call each other\n", p[1], p[2] } }' "${TMPDIR:-/tmp}/dt-calls.$$"
done >"${TMPDIR:-/tmp}/dt-cycles.$$"
if [ -s "${TMPDIR:-/tmp}/dt-cycles.$$" ]; then
    sort "${TMPDIR:-/tmp}/dt-cycles.$$"
    bad=1
fi
rm -f "${TMPDIR:-/tmp}/dt-tree.$$" "${TMPDIR:-/tmp}/dt-defs.$$" "${TMPDIR:-/tmp}/dt-fdefs.$$" \
    "${TMPDIR:-/tmp}/dt-calls.$$" "${TMPDIR:-/tmp}/dt-cycles.$$"
exit $bad
