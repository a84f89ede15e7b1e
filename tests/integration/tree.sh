#!/bin/sh
# SPDX-License-Identifier: MIT
#
# The shape of the tree (contrib/check-tree.sh): includes point down the
# tiers, each non-static dt_* function has one definition, and no two
# sources of a folder call each other. Passes on this tree, and fails on a
# copy of it with each kind of offence planted, naming the offence.
. "$(dirname "$0")/lib.sh"

CHECK=$DT_SRCDIR/contrib/check-tree.sh
[ -x "$CHECK" ] || die "$CHECK is missing"

check "the tree passes: tiers, one definition each, no call cycles" "$CHECK" "$DT_SRCDIR"

copy() { # a fresh copy of the source folders in $TMPD/t
    rm -rf "$TMPD/t" && mkdir "$TMPD/t" &&
        (cd "$DT_SRCDIR" && for d in common spec io db plan kernels engine coordinator agent cli; do
            find "$d" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \)
        done) >"$TMPD/files" &&
        (cd "$DT_SRCDIR" && tar -cf - -T "$TMPD/files") | tar -xf - -C "$TMPD/t"
}
fails() { # WANT: the check exits 1 on the copy, printing WANT
    "$CHECK" "$TMPD/t" >"$TMPD/out" 2>&1
    _rc=$?
    cat "$TMPD/out"
    [ $_rc -eq 1 ] && grep -q "$1" "$TMPD/out"
}

copy || die "cannot copy the tree"
echo '#include "engine/attn/attn.h"' >>"$TMPD/t/spec/layout.h"
check "an include up the tiers fails (spec/ including engine/)" \
    fails 'spec/layout.h:[0-9]*: spec/ includes from engine/'

copy || die "cannot copy the tree"
echo '#include "coordinator/coord.h"' >>"$TMPD/t/cli/table.h"
check "an include sideways fails (cli/ including coordinator/)" \
    fails 'cli/table.h:[0-9]*: cli/ includes from coordinator/'

copy || die "cannot copy the tree"
printf 'const char *dt_layout_name(int x)\n{\n    return 0;\n}\n' >>"$TMPD/t/io/npy.c"
check "a dt_* function defined in two sources fails, naming both" \
    fails 'dt_layout_name is defined in 2 sources: io/npy.c:[0-9]* spec/layout.c:[0-9]*'

copy || die "cannot copy the tree"
printf 'int dt_tree_a(void);\nint dt_tree_b(void);\n' >>"$TMPD/t/io/npy.h"
printf 'int dt_tree_a(void)\n{\n    return dt_tree_b();\n}\n' >>"$TMPD/t/io/npy.c"
printf 'int dt_tree_b(void)\n{\n    return dt_tree_a();\n}\n' >>"$TMPD/t/io/ckpt.c"
check "two sources of a folder calling each other fail" \
    fails 'io/ckpt.c and io/npy.c call each other'
finish
