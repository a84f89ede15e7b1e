#!/bin/sh
# SPDX-License-Identifier: MIT
#
# device.sh: everything dt checks on a GPU, in one command, on a bare GPU
# node (a CUDA driver, Python with torch and NVIDIA's pip wheels; none of
# Debian's libraries). The programs are built elsewhere (make
# tests/gpu/test_attn_cuda tests/gpu/test_layers_cuda tests/gpu/test_ring_cuda
# tests/gpu/test_cudnn_plans bench/bench_attn_cuda, where CUDA compiles) and
# carried here; this script builds nothing. Attention runs under both
# block kernels: cuDNN's (DT_ATTN_KERNEL=cudnn, libcudnn.so.9 from the
# nvidia-cudnn wheel) and dt's own (DT_ATTN_KERNEL=dt).
#
# It finds the wheels' library folders (site-packages/nvidia/*/lib, and
# torch/lib) and puts them on LD_LIBRARY_PATH so that libcublasLt.so.13,
# libnccl.so.2 and libcudnn.so.9 resolve, saying what it found; checks every program with ldd
# (a library "not found" fails that program, named); runs the GPU tests
# (exit 0 passed, 77 skipped: no usable device, else failed); then, with
# --bench or --quick, bench/gpu.sh (attention against PyTorch) and
# bench/train_gpu.sh (training tokens/s and MFU against PyTorch). It ends
# with "gpu tests: N passed, N failed, N skipped".
#
# usage: sh tests/gpu/device.sh [--bench | --quick] [BUILDDIR]
#   run from the repository root; BUILDDIR (default .) holds tests/gpu/ and
#   bench/ programs. --bench: the full benchmark; --quick: T <= 16384.
# Time: the whole run stops starting steps at DT_GPU_DEADLINE seconds
# (default 540; 270 with --quick) and every step is killed at its own limit
# when timeout(1) exists, so one hung program cannot take the session.
# DT_GPU_ONLY: an extended regular expression; only the steps whose name
# matches run (a device session short of time reruns what changed);
# DT_GPU_LOGDIR: keep each step's output there (one .log per step);
# the failed checks of all steps are repeated before the summary.
# Exit: 0 all passed; 1 a failure; 77 nothing ran (all skipped); 2 usage.

set -u

usage() {
    echo "usage: sh tests/gpu/device.sh [--bench | --quick] [BUILDDIR]" >&2
    exit 2
}

bench=
quick=
builddir=
for a in "$@"; do
    case $a in
    --bench) bench=1 ;;
    --quick)
        bench=1
        quick=--quick
        ;;
    -h | --help) usage ;;
    -*)
        echo "tests/gpu/device.sh: unknown option: $a" >&2
        usage
        ;;
    *)
        [ -z "$builddir" ] || usage
        builddir=$a
        ;;
    esac
done
[ -n "$builddir" ] || builddir=.
if [ ! -f tests/gpu/gpucheck.h ] || [ ! -f bench/gpu.sh ]; then
    echo "tests/gpu/device.sh: run me from the repository root (no tests/gpu/gpucheck.h" \
        "or bench/gpu.sh in $(pwd))" >&2
    exit 2
fi

t0=$(date +%s)
if [ -n "$quick" ]; then deadline=${DT_GPU_DEADLINE:-270}; else deadline=${DT_GPU_DEADLINE:-540}; fi
case $deadline in
'' | *[!0-9]*)
    echo "tests/gpu/device.sh: DT_GPU_DEADLINE=$deadline: whole seconds" >&2
    exit 2
    ;;
esac
have_timeout=
command -v timeout >/dev/null 2>&1 && have_timeout=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dt-gpu.XXXXXX") || exit 1
if [ -n "${DT_GPU_LOGDIR:-}" ]; then
    logdir=$DT_GPU_LOGDIR
    mkdir -p "$logdir" || exit 1
else
    logdir=$tmp
fi
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

passed=0
failed=0
skipped=0
summary=

# note NAME RESULT SECONDS WHY: one line of the final summary
note() {
    summary="$summary
  $(printf '%-22s %-4s %5ss' "$1" "$2" "$3")${4:+  $4}"
    case $2 in
    PASS) passed=$((passed + 1)) ;;
    SKIP) skipped=$((skipped + 1)) ;;
    *) failed=$((failed + 1)) ;;
    esac
}

echo "== device"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 ||
        echo "nvidia-smi failed (exit $?)"
else
    echo "nvidia-smi: not on PATH"
fi
if [ -n "$have_timeout" ]; then
    echo "deadline ${deadline} s; every step under timeout(1)"
else
    echo "deadline ${deadline} s; no timeout(1) here: steps run unbounded"
fi

echo
echo "== libraries"
python=${PYTHON:-python3}
libdirs=
if command -v "$python" >/dev/null 2>&1; then
    # the wheels' folders: nvidia/<pkg>/lib (CUDA 13 wheels put cuBLAS in
    # nvidia/cu13/lib, NCCL in nvidia/nccl/lib) in every site-packages, then
    # torch/lib; found without importing torch (seconds saved)
    libdirs=$("$python" - <<'EOF'
import glob
import importlib.util
import os
import site
import sys

roots = []
try:
    import nvidia
    roots += list(getattr(nvidia, "__path__", []))
except Exception as e:
    print("note: import nvidia: %s" % e, file=sys.stderr)
paths = list(sys.path)
try:
    paths += site.getsitepackages() + [site.getusersitepackages()]
except Exception:
    pass
for p in paths:
    roots.append(os.path.join(p, "nvidia"))
dirs = []
for r in roots:
    for pat in ("*/lib", "*/lib64"):
        for d in sorted(glob.glob(os.path.join(r, pat))):
            d = os.path.realpath(d)
            if os.path.isdir(d) and d not in dirs:
                dirs.append(d)
spec = importlib.util.find_spec("torch")
if spec is not None:
    for p in spec.submodule_search_locations or []:
        d = os.path.realpath(os.path.join(p, "lib"))
        if os.path.isdir(d) and d not in dirs:
            dirs.append(d)
for d in dirs:
    print(d)
EOF
)
else
    echo "$python: not on PATH: cannot look for NVIDIA's wheels"
fi
path=
for d in $libdirs; do
    [ -d "$d" ] || continue
    echo "  wheel libraries: $d"
    path=${path:+$path:}$d
done
[ -n "$path" ] || echo "  no wheel library folders found"
# then the toolkit's and the driver's folders, where the node has them
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64 \
    /usr/local/nvidia/lib; do
    if [ -d "$d" ]; then
        echo "  system libraries: $d"
        path=${path:+$path:}$d
    fi
done
export LD_LIBRARY_PATH="$path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
oldifs=$IFS
for lib in libcublasLt.so.13 libnccl.so.2 libcuda.so.1; do
    where=
    IFS=:
    for d in $LD_LIBRARY_PATH; do
        if [ -n "$d" ] && [ -e "$d/$lib" ]; then
            where=$d/$lib
            break
        fi
    done
    IFS=$oldifs
    if [ -z "$where" ] && command -v ldconfig >/dev/null 2>&1; then
        where=$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l { print $NF; exit }')
        [ -n "$where" ] && where="$where (ld.so.cache)"
    fi
    echo "  $lib: ${where:-NOT FOUND}"
done

# check_bin NAME PATH: 0 when PATH exists and every library resolves
check_bin() {
    if [ ! -f "$2" ]; then
        echo "FAIL $1: $2 is missing: build it where CUDA is (make $2) and carry it"
        note "$1" FAIL 0 "missing: $2"
        return 1
    fi
    if [ ! -x "$2" ]; then
        echo "FAIL $1: $2 is not executable"
        note "$1" FAIL 0 "not executable: $2"
        return 1
    fi
    if command -v ldd >/dev/null 2>&1; then
        nf=$(ldd "$2" 2>&1 | grep 'not found')
        if [ -n "$nf" ]; then
            echo "FAIL $1: libraries not found (LD_LIBRARY_PATH above):"
            echo "$nf"
            note "$1" FAIL 0 "libraries not found: $(echo "$nf" | awk '{ printf "%s ", $1 }')"
            return 1
        fi
    fi
    return 0
}

# step NAME LIMIT CMD...: run CMD (killed after LIMIT seconds, never past
# the deadline), its output shown and kept in $logdir, and note its result
step() {
    name=$1
    limit=$2
    shift 2
    if [ -n "${DT_GPU_ONLY:-}" ] && ! printf '%s\n' "$name" | grep -Eq -- "$DT_GPU_ONLY"; then
        echo "== $name: not run (DT_GPU_ONLY=$DT_GPU_ONLY)"
        return
    fi
    now=$(date +%s)
    left=$((deadline - (now - t0)))
    if [ "$left" -lt 15 ]; then
        echo "SKIP $name: the deadline of ${deadline} s is reached"
        note "$name" FAIL 0 "not run: deadline reached"
        return
    fi
    [ "$limit" -le "$left" ] || limit=$left
    log=$logdir/$(printf '%s' "$name" | tr -c 'A-Za-z0-9_.-' '_').log
    echo
    echo "== $name (limit ${limit} s)"
    start=$(date +%s)
    echo 1 >"$tmp/rc"
    {
        if [ -n "$have_timeout" ]; then
            timeout -k 10 "$limit" "$@"
        else
            "$@"
        fi
        echo $? >"$tmp/rc"
    } 2>&1 | tee "$log"
    rc=$(cat "$tmp/rc")
    el=$(($(date +%s) - start))
    case $rc in
    0) note "$name" PASS "$el" "" ;;
    77) note "$name" SKIP "$el" "exit 77: no usable GPU (see its output)" ;;
    124 | 137) note "$name" FAIL "$el" "timed out after ${limit} s (exit $rc)" ;;
    *) note "$name" FAIL "$el" "exit $rc" ;;
    esac
    echo "== $name: exit $rc, ${el} s"
}

if [ -n "$quick" ]; then tlimit=150; else tlimit=180; fi
# cuDNN's graphs as dt builds them, planned whole on this GPU's cuDNN
# (kernels/cuda/attn_cudnn.c; in make check they stop before loading the module)
if check_bin test_cudnn_plans "$builddir/tests/gpu/test_cudnn_plans"; then
    step "test_cudnn_plans" 120 env DT_SRCDIR="$PWD" "$builddir/tests/gpu/test_cudnn_plans"
fi
# the kernels against the CPU reference: dt's own (the default of
# test_attn_cuda), then blocks through cuDNN; the ring under both
for t in test_attn_cuda test_layers_cuda; do
    bin=$builddir/tests/gpu/$t
    if check_bin "$t" "$bin"; then
        step "$t" "$tlimit" "$bin"
    fi
done
if check_bin test_ring_cuda "$builddir/tests/gpu/test_ring_cuda"; then
    step "test_ring_cuda DT_ATTN_KERNEL=dt" "$tlimit" env DT_ATTN_KERNEL=dt \
        "$builddir/tests/gpu/test_ring_cuda"
fi
if [ -x "$builddir/tests/gpu/test_attn_cuda" ]; then
    step "test_attn_cuda DT_ATTN_KERNEL=cudnn" "$tlimit" env DT_ATTN_KERNEL=cudnn \
        "$builddir/tests/gpu/test_attn_cuda"
    step "test_ring_cuda DT_ATTN_KERNEL=cudnn" "$tlimit" env DT_ATTN_KERNEL=cudnn \
        "$builddir/tests/gpu/test_ring_cuda"
fi
# the forward's 8-warp variant (DT_ATTN_FWD_WARPS=8) passes the same checks
if [ -x "$builddir/tests/gpu/test_attn_cuda" ]; then
    step "test_attn_cuda DT_ATTN_FWD_WARPS=8" "$tlimit" env DT_ATTN_FWD_WARPS=8 \
        "$builddir/tests/gpu/test_attn_cuda"
fi
# the sm_90 warpgroup forward (DT_ATTN_KERNEL=wgmma: wgmma.mma_async,
# not the default until it has passed here and been timed), on H100/H200
if [ -x "$builddir/tests/gpu/test_attn_cuda" ] &&
    nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | grep -q '^9\.0'; then
    step "test_attn_cuda DT_ATTN_KERNEL=wgmma" "$tlimit" env DT_ATTN_KERNEL=wgmma \
        "$builddir/tests/gpu/test_attn_cuda"
    step "test_ring_cuda DT_ATTN_KERNEL=wgmma" "$tlimit" env DT_ATTN_KERNEL=wgmma \
        "$builddir/tests/gpu/test_ring_cuda"
fi

# dtengine attn --device cuda end to end (tests/gpu/e2e.sh), when
# tests/gpu/bundle.sh's archive was extracted into BUILDDIR: the engine
# needs Open MPI, PMIx and BLAS, which a bare node lacks.
if [ -d "$builddir/gpu-bundle" ]; then
    saved=$LD_LIBRARY_PATH
    export LD_LIBRARY_PATH="$builddir/gpu-bundle/lib:$LD_LIBRARY_PATH"
    if check_bin dtengine-bundle "$builddir/gpu-bundle/dtengine"; then
        step "dtengine --device cuda" 300 sh tests/gpu/e2e.sh "$builddir/gpu-bundle" "$tmp/e2e"
        step "a Hugging Face model on the GPU" 120 sh tests/gpu/hf.sh "$builddir/gpu-bundle" \
            "$tmp/hf"
        step "activation recomputation on the GPU" 120 sh tests/gpu/recompute.sh \
            "$builddir/gpu-bundle" "$tmp/recompute"
    fi
    export LD_LIBRARY_PATH="$saved"
else
    echo
    echo "== dtengine --device cuda: no $builddir/gpu-bundle (tests/gpu/bundle.sh): not run"
fi

if [ -n "$bench" ]; then
    bin=$builddir/bench/bench_attn_cuda
    if check_bin bench_attn_cuda "$bin"; then
        left=$((deadline - ($(date +%s) - t0)))
        # gpu.sh shares its budget between dt and PyTorch and kills each
        # program 90 s after its share; the step's limit is the hard stop
        budget=$((left - 60))
        [ "$budget" -ge 30 ] || budget=30
        step "bench/gpu.sh $quick" "$left" env DT_BENCH_BUDGET="$budget" sh bench/gpu.sh $quick \
            "$builddir"
    fi
fi

# training tokens/s and MFU against PyTorch (bench/train_gpu.sh), with the
# bundle's dtengine
if [ -n "$bench" ] && [ -x "$builddir/gpu-bundle/dtengine" ]; then
    left=$((deadline - ($(date +%s) - t0)))
    saved=$LD_LIBRARY_PATH
    export LD_LIBRARY_PATH="$builddir/gpu-bundle/lib:$LD_LIBRARY_PATH"
    step "bench/train_gpu.sh $quick" "$left" env DT_BENCH_BUDGET="$((left - 30))" \
        sh bench/train_gpu.sh $quick "$builddir/gpu-bundle/dtengine"
    export LD_LIBRARY_PATH="$saved"
fi

# a tuning sweep on the quick shapes, to compare with the default in the
# tables above: the forward with 8 warps per block (DT_ATTN_FWD_WARPS=8) and
# the sm_90 warpgroup forward (DT_ATTN_KERNEL=wgmma; see
# kernels/cuda/attn_fwd.cu); not with --quick
if [ -n "$bench" ] && [ -z "$quick" ]; then
    bin=$builddir/bench/bench_attn_cuda
    if [ -x "$bin" ]; then
        step "bench fwd DT_ATTN_KERNEL=wgmma" 120 env DT_ATTN_KERNEL=wgmma "$bin" --quick \
            --no-ring --budget 90
        [ -n "$quick" ] ||
            step "bench fwd DT_ATTN_FWD_WARPS=8" 120 env DT_ATTN_FWD_WARPS=8 "$bin" --quick --no-ring
    fi
fi

# the failed checks again, so that the end of a long log holds them
digest=
for f in "$logdir"/*.log; do
    [ -f "$f" ] || continue
    lines=$(grep -E '^FAIL' "$f" | head -n 20)
    [ -n "$lines" ] && digest="$digest
-- $(basename "$f" .log):
$lines"
done
if [ -n "$digest" ]; then
    echo
    echo "== failed checks (the first 20 of each step)$digest"
fi

echo
echo "== summary ($(($(date +%s) - t0)) s)$summary"
echo "gpu tests: $passed passed, $failed failed, $skipped skipped"
if [ "$failed" -gt 0 ]; then
    exit 1
fi
if [ "$passed" -eq 0 ]; then
    exit 77
fi
exit 0
