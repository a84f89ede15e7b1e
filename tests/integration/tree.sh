#!/bin/sh
# SPDX-License-Identifier: MIT
#
# The shape of the tree (contrib/check-tree.sh): includes point down the
# tiers and down engine's order of parts, each non-static dt_* and dtctl_*
# function has one definition (dtctl_* ones in cli/), no folder has a call
# cycle between its sources, git tracks no ELF file, and Makefile.am names
# every tracked source, script and page (make dist's list). Passes on this
# tree, and fails on a copy of it with each kind of offence planted, naming
# the offence; what is not an offence (a call through a pointer, a name in
# a comment, an ELF file git does not track) is shown passing on a small
# tree of its own.
. "$(dirname "$0")/lib.sh"

CHECK=$DT_SRCDIR/contrib/check-tree.sh
[ -x "$CHECK" ] || die "$CHECK is missing"

check "the tree passes: tiers, engine's order, one definition each, no call cycles, no tracked ELF, nothing left out of the tarball" \
    "$CHECK" "$DT_SRCDIR"

copy() { # a fresh copy of the source folders in $TMPD/t
    rm -rf "$TMPD/t" && mkdir "$TMPD/t" &&
        (cd "$DT_SRCDIR" && for d in common spec io db plan kernels engine coordinator agent cli; do
            find "$d" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \)
        done) >"$TMPD/files" &&
        (cd "$DT_SRCDIR" && tar -cf - -T "$TMPD/files") | tar -xf - -C "$TMPD/t"
}
empty() { # an empty tree in $TMPD/t, for what must pass
    rm -rf "$TMPD/t" && mkdir -p "$TMPD/t/io" "$TMPD/t/cli" "$TMPD/t/engine/comm"
}
fails() { # WANT...: the check exits 1 on the copy, printing each WANT
    "$CHECK" "$TMPD/t" >"$TMPD/out" 2>&1
    _rc=$?
    cat "$TMPD/out"
    [ $_rc -eq 1 ] || return 1
    for _want in "$@"; do
        grep -q "$_want" "$TMPD/out" || { echo "missing: $_want"; return 1; }
    done
}
passes() { # the check exits 0 on the tree in $TMPD/t, printing nothing
    "$CHECK" "$TMPD/t" >"$TMPD/out" 2>&1
    _rc=$?
    cat "$TMPD/out"
    [ $_rc -eq 0 ] && [ ! -s "$TMPD/out" ]
}
fn() { # FILE NAME CALLS...: append a function NAME to FILE that calls CALLS
    _f=$1 _n=$2
    shift 2
    {
        printf 'int %s(void)\n{\n    int x = 0;\n' "$_n"
        for _c in "$@"; do printf '    x += %s();\n' "$_c"; done
        printf '    return x;\n}\n'
    } >>"$_f"
}
git_tree() { # make $TMPD/t a git checkout with every file in it tracked
    (
        unset GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE GIT_OBJECT_DIRECTORY
        cd "$TMPD/t" && git init -q . && git add -A .
    ) >/dev/null 2>&1
}
elf() { # FILE: the first bytes of an x86-64 ELF executable
    printf '\177ELF\002\001\001\000\000\000\000\000\000\000\000\000\002\000>\000' >"$1"
}

# ---- tiers -------------------------------------------------------------------
copy || die "cannot copy the tree"
echo '#include "engine/attn/attn.h"' >>"$TMPD/t/spec/layout.h"
check "an include up the tiers fails (spec/ including engine/)" \
    fails 'spec/layout.h:[0-9]*: spec/ includes from engine/'

copy || die "cannot copy the tree"
echo '#include "coordinator/coord.h"' >>"$TMPD/t/cli/table.h"
check "an include sideways fails (cli/ including coordinator/)" \
    fails 'cli/table.h:[0-9]*: cli/ includes from coordinator/'

# ---- engine's order ----------------------------------------------------------
copy || die "cannot copy the tree"
printf '#include "engine/attn/attn.h"\n#include "engine/model/model.h"\n' >"$TMPD/t/engine/comm/tree.c"
check "an include up engine's order fails (comm/ including attn/ and model/)" \
    fails 'engine/comm/tree.c:1: engine part comm includes engine/attn/attn.h of part attn, above it (engine.s order, bottom up: cpu data comm attn model wlink cmd main)' \
    'engine/comm/tree.c:2: engine part comm includes engine/model/model.h of part model, above it'

copy || die "cannot copy the tree"
echo '#include "engine/wlink.h"' >>"$TMPD/t/engine/cpu.h"
check "an include up engine's order between top-level modules fails (cpu.h including wlink.h)" \
    fails 'engine/cpu.h:[0-9]*: engine part cpu includes engine/wlink.h of part wlink, above it'

copy || die "cannot copy the tree"
mkdir "$TMPD/t/engine/tree"
echo '#include "engine/comm/comm.h"' >"$TMPD/t/engine/tree/tree.c"
echo '#include "engine/tree/tree.h"' >"$TMPD/t/engine/cmd/tree.c"
check "an engine part missing from the order fails, as a file and as an include" \
    fails 'engine/tree/tree.c:1: engine part tree has no place in engine.s order' \
    'engine/cmd/tree.c:1: engine part cmd includes engine/tree/tree.h of part tree, which has no place in engine.s order'

# ---- one definition ----------------------------------------------------------
copy || die "cannot copy the tree"
printf 'const char *dt_layout_name(int x)\n{\n    return 0;\n}\n' >>"$TMPD/t/io/npy.c"
check "a dt_* function defined in two sources fails, naming both" \
    fails 'dt_layout_name is defined in 2 sources: io/npy.c:[0-9]* spec/layout.c:[0-9]*'

copy || die "cannot copy the tree"
fn "$TMPD/t/cli/tree_a.c" dtctl_tree_twice
fn "$TMPD/t/cli/tree_b.c" dtctl_tree_twice
check "a dtctl_* function defined in two sources fails, naming both" \
    fails 'dtctl_tree_twice is defined in 2 sources: cli/tree_a.c:1 cli/tree_b.c:1'

copy || die "cannot copy the tree"
fn "$TMPD/t/io/tree.c" dtctl_tree_stray
check "a dtctl_* function defined outside cli/ fails" \
    fails 'io/tree.c:1: dtctl_tree_stray is defined outside cli/'

# ---- call cycles -------------------------------------------------------------
copy || die "cannot copy the tree"
fn "$TMPD/t/io/tree_a.c" dt_tree_a dt_tree_b
fn "$TMPD/t/io/tree_b.c" dt_tree_b dt_tree_a
check "two sources of a folder calling each other fail" \
    fails 'call cycle in io/: io/tree_a.c -> io/tree_b.c -> io/tree_a.c' \
    'io/tree_a.c:4 calls dt_tree_b (defined in io/tree_b.c)' \
    'io/tree_b.c:4 calls dt_tree_a (defined in io/tree_a.c)'

copy || die "cannot copy the tree"
fn "$TMPD/t/io/tree_a.c" dt_tree_a dt_tree_b
fn "$TMPD/t/io/tree_b.c" dt_tree_b dt_tree_c
fn "$TMPD/t/io/tree_c.c" dt_tree_c dt_tree_d
fn "$TMPD/t/io/tree_d.c" dt_tree_d dt_tree_a
check "a call cycle through four sources of a folder fails, printed from its first file" \
    fails 'call cycle in io/: io/tree_a.c -> io/tree_b.c -> io/tree_c.c -> io/tree_d.c -> io/tree_a.c' \
    'io/tree_d.c:4 calls dt_tree_a (defined in io/tree_a.c)'

copy || die "cannot copy the tree"
fn "$TMPD/t/cli/tree_a.c" dtctl_tree_a dtctl_tree_b
fn "$TMPD/t/cli/tree_b.c" dtctl_tree_b dtctl_tree_c
fn "$TMPD/t/cli/tree_c.c" dtctl_tree_c dtctl_tree_a
check "a call cycle of dtctl_* functions in cli/ fails" \
    fails 'call cycle in cli/: cli/tree_a.c -> cli/tree_b.c -> cli/tree_c.c -> cli/tree_a.c'

empty || die "cannot make a tree"
fn "$TMPD/t/io/tree_a.c" dt_tree_a dt_tree_b
fn "$TMPD/t/io/tree_b.c" dt_tree_b dt_tree_c
{
    printf 'int dt_tree_c(void)\n{\n'
    printf '    int (*back)(void) = dt_tree_a; /* not dt_tree_a() */\n'
    printf '    const char *s = "dt_tree_a()";\n'
    printf '    return back() + (s != 0);\n}\n'
} >"$TMPD/t/io/tree_c.c"
fn "$TMPD/t/engine/comm/tree.c" dt_tree_d dt_tree_a
check "a cycle closed by a function pointer, a comment, a string or another folder is none" passes

# ---- tracked ELF files -------------------------------------------------------
if command -v git >/dev/null 2>&1; then
    copy || die "cannot copy the tree"
    mkdir "$TMPD/t/tests" && elf "$TMPD/t/tests/test_tree" && elf "$TMPD/t/engine/tree.o"
    git_tree || die "git init or add failed in the copy"
    check "an ELF file tracked by git fails, naming each" \
        fails 'tests/test_tree: a build output (ELF) tracked by git' \
        'engine/tree.o: a build output (ELF) tracked by git'

    empty || die "cannot make a tree"
    elf "$TMPD/t/io/tree.o"
    check "an ELF file in a tree without .git (a tarball) passes" passes

    empty || die "cannot make a tree"
    printf 'ELF, the format\n' >"$TMPD/t/io/tree.txt"
    git_tree || die "git init or add failed"
    elf "$TMPD/t/io/tree_untracked.o"
    check "an ELF file git does not track passes, and so does a text file" passes

    # ---- tracked files the tarball would lack ------------------------------
    empty || die "cannot make a tree"
    mkdir -p "$TMPD/t/common" "$TMPD/t/bench" &&
        printf 'int dt_tree_x(void);\n' >"$TMPD/t/common/tree.h" &&
        printf 'echo\n' >"$TMPD/t/bench/tree.sh" &&
        printf 'int x;\n' >"$TMPD/t/io/tree.c" &&
        printf 'SOURCES = io/tree.c\n' >"$TMPD/t/Makefile.am" || die "cannot write the tree"
    git_tree || die "git init or add failed"
    check "a tracked header or script Makefile.am does not name fails, naming each" \
        fails 'common/tree.h: tracked but named nowhere in Makefile.am' \
        'bench/tree.sh: tracked but named nowhere in Makefile.am'
    printf 'SOURCES = io/tree.c common/tree.h\nEXTRA_DIST = bench/tree.sh\n' >"$TMPD/t/Makefile.am"
    check "every tracked file named in Makefile.am passes" passes
else
    echo "SKIP (not counted): tracked ELF files: git is not installed here"
fi
finish
