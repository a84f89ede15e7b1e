#!/bin/sh
# SPDX-License-Identifier: MIT
#
# The shape of the tree, checked (STYLE.md "Shape of the tree"):
#  1. tiers: a folder includes only from itself and the folders below it
#     (the table below); an include that points up or sideways fails;
#  2. engine's order: inside engine/, a part includes only from itself and
#     the parts below it, bottom up
#         cpu data comm attn model wlink cmd main
#     (a part is a folder, engine/comm/, or a top-level module, engine/cpu.c
#     and .h); a part missing from the order fails until it is given a place;
#  3. one definition: a non-static dt_* or dtctl_* function is defined in at
#     most one source outside tests/ and bench/, and dtctl_* ones (dtctl's
#     names) only in cli/;
#  4. no call cycles: in each folder, the graph "source A calls, by name, a
#     dt_* or dtctl_* function that source B defines" has no cycle of any
#     length (a lower file calls back through a function pointer or hook it
#     was given, and taking a function's address is not a call);
#  5. no build outputs in git: no tracked file starts with the ELF magic;
#  6. nothing left out of the tarball: every tracked source, header, script
#     and page (.c .h .cu .cuh .sh .py .sql .md and man pages) is named in
#     Makefile.am, where `make dist` takes its list from (a tree without a
#     Makefile.am is not checked).
#     5 and 6 only in a git checkout whose top is SRCDIR: a tarball (make
#     distcheck) has no .git, and the rules are skipped there without a word.
# Comments and string literals are not code: a name in them is no call.
# Usage: contrib/check-tree.sh [SRCDIR]. Prints every offence (FILE:LINE:
# first) and exits 1 if there is one, 0 otherwise. make check runs it
# (tests/integration/tree.sh), which also plants each offence in a copy.

root=${1:-.}
cd "$root" || exit 2
LC_ALL=C
export LC_ALL

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
dirs="common spec io db plan kernels engine coordinator agent cli"

# engine's parts, bottom up, from what each includes today:
#   cpu    engine/cpu.[ch], the CPU's features and the BLAS core: common/
#          and kernels/ only
#   data   loader, recall task, generator: common/ and io/ only
#   comm   the transports (MPI, the GPU ring's NCCL and local ones, the
#          PMIx id exchange); they know nothing of attention
#   attn   ring and dilated attention over comm's transports
#   model  model and optimizer, over attn and comm (and data's generator)
#   wlink  engine/wlink.[ch], the worker's channel to its agent, which the
#          commands report through
#   cmd    the commands (attn, train, prefill), over all of the above
#   main   engine/main.c
engine_order="cpu data comm attn model wlink cmd main"

tmp=${TMPDIR:-/tmp}/dt-tree.$$
trap 'rm -f "$tmp".*' EXIT
bad=0
report() { # FILE: offences found, if any
    if [ -s "$1" ]; then
        cat "$1"
        bad=1
    fi
}

# ---- one pass over the sources -------------------------------------------
# Records, one a line:
#   I FILE LINE TARGET   #include "TARGET" (a path with a folder: "x/y.h")
#   D NAME FILE LINE     a definition of a non-static dt_*/dtctl_* function
#                        (a line that starts one at column 0, return type,
#                        then NAME( and no ';': the house format)
#   C NAME FILE LINE     a call of NAME (NAME followed by "(") outside a
#                        comment, a string and a declaration
for d in $dirs; do
    [ -d "$d" ] && find "$d" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \)
done | sort >"$tmp.files"
awk '
function clean(s,    out, t, c) { # s without comments and literals
    out = ""
    while (s != "") {
        if (incom) {
            if (!(c = index(s, "*/")))
                return out
            s = substr(s, c + 2)
            incom = 0
            out = out " "
            continue
        }
        if (!match(s, "/[*]|//|\"|\047"))
            return out s
        out = out substr(s, 1, RSTART - 1)
        t = substr(s, RSTART, RLENGTH)
        s = substr(s, RSTART + RLENGTH)
        if (t == "/*") {
            incom = 1
        } else if (t == "//") {
            return out
        } else {
            while (s != "") {
                c = substr(s, 1, 1)
                s = substr(s, 2)
                if (c == "\\")
                    s = substr(s, 2)
                else if (c == t)
                    break
            }
            out = out t t
        }
    }
    return out
}
{
    f = $0
    src = f ~ /\.(c|cu)$/
    incom = 0
    n = 0
    while ((getline raw < f) > 0) {
        n++
        if (raw ~ /^[ \t]*#[ \t]*include[ \t]*"[a-z_]+\//) {
            t = raw
            sub(/^[^"]*"/, "", t)
            sub(/".*/, "", t)
            print "I", f, n, t
            continue
        }
        if (!src)
            continue
        s = clean(raw)
        top = s !~ /^(static|extern|typedef|#|[ \t\/*}])/ && s != ""
        if (top && match(s, /[ *](dt|dtctl)_[a-z0-9_]+\(/)) {
            if (index(s, ";") == 0)
                print "D", substr(s, RSTART + 1, RLENGTH - 2), f, n
            continue
        }
        while (match(s, /(^|[^A-Za-z0-9_])(dt|dtctl)_[a-z0-9_]+[ \t]*\(/)) {
            t = substr(s, RSTART, RLENGTH)
            s = substr(s, RSTART + RLENGTH)
            sub(/^[^d]*/, "", t)
            sub(/[ \t]*\($/, "", t)
            print "C", t, f, n
        }
    }
    close(f)
}' "$tmp.files" >"$tmp.recs"

# ---- 1, 2: includes --------------------------------------------------------
for d in $dirs; do
    echo "T $d $(allowed "$d")"
done >"$tmp.tiers"
awk -v order="$engine_order" '
function part(p,    a) { # "engine/attn/x.h" -> attn, "engine/cpu.h" -> cpu
    split(p, a, "/")
    if (a[3] == "") sub(/\.[a-z]+$/, "", a[2])
    return a[2]
}
BEGIN {
    np = split(order, o, " ")
    for (i = 1; i <= np; i++) rank[o[i]] = i
}
$1 == "T" { ok[$2] = " " $2 " "; for (i = 3; i <= NF; i++) ok[$2] = ok[$2] $i " "
            names[$2] = NF > 2 ? substr($0, length($1 $2) + 3) : "nothing"; next }
$1 == "I" {
    split($2, p, "/"); dir = p[1]; split($4, q, "/"); inc = q[1]
    if (index(ok[dir], " " inc " ") == 0) {
        printf "%s:%d: %s/ includes from %s/ (allowed: %s)\n", $2, $3, dir, inc, names[dir]
        next
    }
    if (dir != "engine" || inc != "engine") next
    a = part($2); b = part($4)
    if (!(a in rank)) {
        if (!(a in told))
            printf "%s:%d: engine part %s has no place in engine\047s order (%s): give it one in contrib/check-tree.sh\n", $2, $3, a, order
        told[a] = 1
    } else if (!(b in rank)) {
        printf "%s:%d: engine part %s includes %s of part %s, which has no place in engine\047s order (%s)\n", $2, $3, a, $4, b, order
    } else if (rank[b] > rank[a]) {
        printf "%s:%d: engine part %s includes %s of part %s, above it (engine\047s order, bottom up: %s)\n", $2, $3, a, $4, b, order
    }
}' "$tmp.tiers" "$tmp.recs" >"$tmp.inc"
report "$tmp.inc"

# ---- 3: one definition, dtctl_* in cli/ ------------------------------------
awk '$1 == "D" { print $2, $3 ":" $4 }' "$tmp.recs" | sort | awk '
    { files[$1] = files[$1] " " $2; split($2, p, ":");
      if (!(($1, p[1]) in seen)) { seen[$1, p[1]] = 1; n[$1]++ } }
    END { for (k in n) if (n[k] > 1) printf "%s is defined in %d sources:%s\n", k, n[k], files[k] }
' | sort >"$tmp.defs"
awk '$1 == "D" && $2 ~ /^dtctl_/ && $3 !~ /^cli\// {
    printf "%s:%d: %s is defined outside cli/ (dtctl_* functions are dtctl\047s)\n", $3, $4, $2 }' \
    "$tmp.recs" >>"$tmp.defs"
report "$tmp.defs"

# ---- 4: call cycles within a folder ----------------------------------------
awk '
function dir(f) { sub(/\/[^\/]*$/, "", f); return f }
function dfs(u,    vs, n, i, v, k, m, c, lo) {
    color[u] = 1
    stk[++sp] = u
    n = split(adj[u], vs, " ")
    for (i = 1; i <= n; i++) {
        v = vs[i]
        if (color[v] == 0) {
            dfs(v)
        } else if (color[v] == 1) { # on the stack: stk[k..sp] -> v is a cycle
            for (k = sp; stk[k] != v; k--)
                ;
            m = 0
            for (; k <= sp; k++) c[m++] = stk[k]
            lo = 0 # print it from its first file
            for (k = 1; k < m; k++) if (c[k] < c[lo]) lo = k
            line = "call cycle in " dir(u) "/:"
            for (k = 0; k <= m; k++) line = line (k ? " -> " : " ") c[(lo + k) % m]
            print line
            for (k = 0; k < m; k++)
                printf "    %s calls %s (defined in %s)\n", at[c[(lo + k) % m], c[(lo + k + 1) % m]],
                    fn[c[(lo + k) % m], c[(lo + k + 1) % m]], c[(lo + k + 1) % m]
        }
    }
    sp--
    color[u] = 2
}
NR == FNR { if ($1 == "D") def[$2] = def[$2] " " $3; next } # first pass: definitions
$1 == "C" && ($2 in def) {
    n = split(def[$2], ds, " ")
    for (i = 1; i <= n; i++) {
        b = ds[i]
        if (b == $3 || dir(b) != dir($3) || (($3, b) in at)) continue
        at[$3, b] = $3 ":" $4
        fn[$3, b] = $2
        adj[$3] = adj[$3] " " b
        node[$3] = node[b] = 1
    }
}
END {
    nn = 0
    for (u in node) nodes[++nn] = u
    for (i = 2; i <= nn; i++) # insertion sort: a stable order, stable output
        for (j = i; j > 1 && nodes[j - 1] > nodes[j]; j--) {
            t = nodes[j]; nodes[j] = nodes[j - 1]; nodes[j - 1] = t
        }
    for (i = 1; i <= nn; i++) if (color[nodes[i]] == 0) dfs(nodes[i])
}' "$tmp.recs" "$tmp.recs" >"$tmp.cycles"
report "$tmp.cycles"

# ---- 5: tracked ELF files --------------------------------------------------
if command -v git >/dev/null 2>&1 &&
    top=$(git rev-parse --show-toplevel 2>/dev/null) && [ "$top" = "$(pwd -P)" ]; then
    git ls-files | while IFS= read -r f; do
        [ -f "$f" ] && [ ! -L "$f" ] && printf '%s\n' "$f"
    done | awk '{
        if ((getline b < $0) > 0 && substr(b, 1, 4) == "\177ELF")
            printf "%s: a build output (ELF) tracked by git: git rm --cached %s\n", $0, $0
        close($0)
    }' >"$tmp.elf"
    report "$tmp.elf"

    # ---- 6: tracked files make dist would leave out -------------------------
    if [ -f Makefile.am ]; then
        git ls-files | grep -E '\.(c|h|cu|cuh|sh|py|sql|md|[1-8])$' | while IFS= read -r f; do
            grep -qF -- "$f" Makefile.am ||
                printf '%s: tracked but named nowhere in Makefile.am: make dist leaves it out\n' "$f"
        done >"$tmp.dist"
        report "$tmp.dist"
    fi
fi
exit $bad
