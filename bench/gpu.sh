#!/bin/sh
# SPDX-License-Identifier: MIT
#
# gpu.sh: GPU attention speed of dt against PyTorch, measured side by side
# in one run on one GPU. Runs BUILDDIR/bench/bench_attn_cuda three times
# (blocks through cuDNN, DT_ATTN_KERNEL=cudnn, with a cuBLASLt GEMM for the
# machine's matrix rate and the one-GPU ring; the same blocks with the
# backward nondeterministic, --nondeterministic, as the job key
# deterministic = no runs them; then dt's own kernels, DT_ATTN_KERNEL=dt,
# blocks only) and bench/sdpa_torch.py (PyTorch's
# scaled_dot_product_attention, every backend it has, whose backward is
# nondeterministic), then joins their ROW/BEST lines into markdown tables:
# one per direction (forward, backward, forward + backward) with dt through
# cuDNN deterministic (the default) and not, dt's own kernels, PyTorch's
# best backend and the ratios, and the ring's overhead and memory per
# rank. Without cuDNN on the node the first run says so (its KERNEL
# line) and runs dt's kernels. Asserts nothing about speed.
#
# usage: bench/gpu.sh [--quick] BUILDDIR
#   --quick   T <= 16384 and 3 repetitions (a few minutes less)
# Environment: DT_BENCH_BUDGET (seconds for both programs together; default
# 480, 200 with --quick): each program stops starting new rows at its share
# (dt through cuDNN 30 %, nondeterministic 15 %, dt's own kernels 15 %,
# PyTorch 35 %) and, where timeout(1) exists, is killed 90 s after
# it. PYTHON (default python3 from PATH).
# Exit: 0; 1 when a program failed or the baseline is missing; 2 usage;
# 77 when bench_attn_cuda finds no usable GPU.

set -u

usage() {
    echo "usage: bench/gpu.sh [--quick] BUILDDIR" >&2
    exit 2
}

quick=
builddir=
for a in "$@"; do
    case $a in
    --quick) quick=--quick ;;
    -h | --help) usage ;;
    -*)
        echo "bench/gpu.sh: unknown option: $a" >&2
        usage
        ;;
    *)
        [ -z "$builddir" ] || usage
        builddir=$a
        ;;
    esac
done
[ -n "$builddir" ] || usage

srcdir=$(cd "$(dirname "$0")/.." && pwd) || exit 1
bin=$builddir/bench/bench_attn_cuda
pyscript=$srcdir/bench/sdpa_torch.py
python=${PYTHON:-python3}
if [ ! -x "$bin" ]; then
    echo "bench/gpu.sh: $bin: not found or not executable (build it where CUDA is: make" \
        "bench/bench_attn_cuda)" >&2
    exit 1
fi
if [ ! -f "$pyscript" ]; then
    echo "bench/gpu.sh: $pyscript: not found" >&2
    exit 1
fi

budget=${DT_BENCH_BUDGET:-}
if [ -z "$budget" ]; then
    if [ -n "$quick" ]; then budget=200; else budget=480; fi
fi
case $budget in
'' | *[!0-9]*)
    echo "bench/gpu.sh: DT_BENCH_BUDGET=$budget: whole seconds" >&2
    exit 2
    ;;
esac
dt_budget=$((budget * 30 / 100))
nd_budget=$((budget * 15 / 100))
own_budget=$((budget * 15 / 100))
py_budget=$((budget * 35 / 100))
[ "$dt_budget" -ge 10 ] || dt_budget=10
[ "$nd_budget" -ge 10 ] || nd_budget=10
[ "$own_budget" -ge 10 ] || own_budget=10
[ "$py_budget" -ge 10 ] || py_budget=10

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dt-gpu-bench.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

# run OUTFILE LIMIT CMD...: CMD's output shown and kept in OUTFILE, its
# exit status in OUTFILE.rc (124 when timeout(1) stopped it, 1 when the
# shell could not even record it)
run() {
    out=$1
    limit=$2
    shift 2
    if command -v timeout >/dev/null 2>&1; then
        set -- timeout -k 10 "$limit" "$@"
    fi
    echo 1 >"$out.rc"
    {
        "$@"
        echo $? >"$out.rc"
    } 2>&1 | tee "$out"
}

echo "# dt GPU attention benchmark"
echo
if command -v nvidia-smi >/dev/null 2>&1; then
    gpu=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1 | head -n 1)
else
    gpu="unknown (nvidia-smi not on PATH)"
fi
echo "GPU: $gpu"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), host: $(uname -n)"
echo "budget: ${budget} s (bench_attn_cuda ${dt_budget} + ${nd_budget} + ${own_budget} s," \
    "sdpa_torch.py ${py_budget} s)"
echo

echo "## dt, blocks through cuDNN: DT_ATTN_KERNEL=cudnn $bin $quick"
run "$tmp/dt.out" $((dt_budget + 90)) env DT_ATTN_KERNEL=cudnn "$bin" $quick --budget "$dt_budget"
dt_rc=$(cat "$tmp/dt.out.rc")
if [ "$dt_rc" = 77 ]; then
    echo "bench/gpu.sh: SKIP: bench_attn_cuda found no usable GPU"
    exit 77
fi
echo
echo "## dt, blocks through cuDNN, nondeterministic backward: DT_ATTN_KERNEL=cudnn $bin $quick" \
    "--no-ring --nondeterministic"
run "$tmp/nd.out" $((nd_budget + 90)) env DT_ATTN_KERNEL=cudnn "$bin" $quick --no-ring \
    --nondeterministic --budget "$nd_budget"
nd_rc=$(cat "$tmp/nd.out.rc")
echo
echo "## dt's own kernels: DT_ATTN_KERNEL=dt $bin $quick --no-ring"
run "$tmp/own.out" $((own_budget + 90)) env DT_ATTN_KERNEL=dt "$bin" $quick --no-ring \
    --budget "$own_budget"
own_rc=$(cat "$tmp/own.out.rc")
echo
echo "## baseline: $python $pyscript $quick"
if command -v "$python" >/dev/null 2>&1; then
    run "$tmp/torch.out" $((py_budget + 90)) env PYTHONUNBUFFERED=1 "$python" "$pyscript" $quick \
        --budget "$py_budget"
    py_rc=$(cat "$tmp/torch.out.rc")
else
    echo "bench/gpu.sh: $python: not on PATH" | tee "$tmp/torch.out"
    py_rc=127
fi

echo
echo "## results"
echo
echo "GPU: $gpu"
status=0
awk -v dtf="$tmp/dt.out" -v ndf="$tmp/nd.out" -v ownf="$tmp/own.out" -v thf="$tmp/torch.out" '
function get(k,    i, n) {
    n = length(k) + 1
    for (i = 1; i <= NF; i++)
        if (substr($i, 1, n) == k "=")
            return substr($i, n + 1)
    return ""
}
function num(x) { return x != "" && x != "-" && x ~ /^[0-9.eE+-]+$/ }
function over(a, b) {
    return (num(a) && num(b) && b > 0) ? sprintf("%+.1f%%", 100 * (a / b - 1)) : "n/a"
}
function shown(x) { return num(x) ? x : "n/a" }
FILENAME == dtf && $1 == "GEMM" { gemm = get("tflops"); gemmdt = $2 }
FILENAME == dtf && $1 == "KERNEL" { kern = substr($0, 8) }
FILENAME == ndf && $1 == "ROW" {
    key = $2 SUBSEP get("T") SUBSEP get("D") SUBSEP get("causal")
    nd[key] = get("tflops")
}
FILENAME == ownf && $1 == "ROW" {
    key = $2 SUBSEP get("T") SUBSEP get("D") SUBSEP get("causal")
    own[key] = get("tflops")
}
FILENAME == dtf && $1 == "ROW" {
    key = $2 SUBSEP get("T") SUBSEP get("D") SUBSEP get("causal")
    if (!(key in dt)) { order[++n] = key; hh[key] = get("H") }
    dt[key] = get("tflops")
    dtype = $3
}
FILENAME == dtf && $1 == "RING" { ring[++nr] = $0 }
FILENAME == thf && $1 == "BEST" {
    key = $2 SUBSEP get("T") SUBSEP get("D") SUBSEP get("causal")
    th[key] = get("tflops"); be[key] = get("backend"); thdtype = $3
}
END {
    if (dtype == "") dtype = "?"
    if (gemm != "")
        printf "cuBLASLt %s GEMM 8192^3 (same run): %s TFLOP/s\n", gemmdt, gemm
    if (thdtype == "") thdtype = "none (no BEST lines)"
    printf "dt dtype %s; PyTorch dtype %s; dt block kernel of the first run: %s\n", dtype,
           thdtype, (kern == "" ? "?" : kern)
    printf "FLOPs: forward 4*T^2*H*D (half when causal), backward 2.5x, fwd+bwd 3.5x;"
    printf " B=1, H=Hkv=2048/D\n"
    printf "dt bwd = zero dq,dk,dv + dt_attn_delta_cuda + the block backward (cuDNN: o cast to"
    printf " the dtype first; deterministic, nondet: --nondeterministic);"
    printf " PyTorch bwd = torch.autograd.grad of a kept graph\n"
    split("fwd bwd fwdbwd", dirs, " ")
    split("forward|backward|forward + backward", titles, "|")
    for (d = 1; d <= 3; d++) {
        printf "\n### %s, TFLOP/s\n\n", titles[d]
        print "| T | D | H | causal | dt cuDNN | dt cuDNN nondet | dt own |" \
              " PyTorch best (backend) | dt cuDNN / PyTorch | nondet / PyTorch |" \
              " dt own / PyTorch |"
        print "|---:|---:|---:|:---:|---:|---:|---:|---:|---:|---:|---:|"
        for (i = 1; i <= n; i++) {
            split(order[i], f, SUBSEP)
            if (f[1] != dirs[d]) continue
            k = order[i]
            t = (k in th) ? th[k] : ""
            b = (k in be) ? be[k] : ""
            w = (k in own) ? own[k] : ""
            x = (k in nd) ? nd[k] : ""
            ratio = (num(dt[k]) && num(t) && t > 0) ? sprintf("%.2f", dt[k] / t) : "n/a"
            rn = (num(x) && num(t) && t > 0) ? sprintf("%.2f", x / t) : "n/a"
            ro = (num(w) && num(t) && t > 0) ? sprintf("%.2f", w / t) : "n/a"
            printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", f[2], f[3],
                   hh[k], (f[4] == 1 ? "yes" : "no"), shown(dt[k]), shown(x), shown(w),
                   (num(t) ? t " (" b ")" : "n/a"), ratio, rn, ro
        }
    }
    printf "\n### ring of R ranks on this one GPU (causal, zigzag, H=Hkv=16, D=128),"
    printf " against one dense block over all T; attention: dense or dilated"
    printf " branches w=segments:r=dilations\n\n"
    printf "| T | R | attention | fwd ms | single fwd ms | fwd overhead | bwd ms | single bwd ms |"
    printf " bwd overhead | exposed wait fwd/bwd ms | MiB/rank: tensors + ring = model |"
    printf " MiB/rank measured |\n"
    print "|---:|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for (i = 1; i <= nr; i++) {
        $0 = ring[i]
        if (get("error") != "" || !num(get("fwd_ms"))) {
            printf "| %s | %s | %s | failed: %s |||||||||\n", get("T"), get("R"), get("attn"),
                   substr($0, index($0, "error=") + 6)
            continue
        }
        rb = get("ring_bwd_mib")
        if (get("ring_fwd_mib") + 0 > rb + 0)
            rb = get("ring_fwd_mib")
        printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s / %s | %s + %s = %s | %s |\n",
               get("T"), get("R"), get("attn"), get("fwd_ms"), get("fwd_base_ms"),
               over(get("fwd_ms"), get("fwd_base_ms")), get("bwd_ms"), get("bwd_base_ms"),
               over(get("bwd_ms"), get("bwd_base_ms")), get("fwd_wait_ms"), get("bwd_wait_ms"),
               get("tensors_mib"), rb, get("model_mib"), get("measured_mib")
    }
    if (nr == 0) print "| (no ring rows) ||||||||||||"
}' "$tmp/dt.out" "$tmp/nd.out" "$tmp/own.out" "$tmp/torch.out" || {
    echo "bench/gpu.sh: awk could not build the tables; the raw ROW/BEST/RING lines are above"
    status=1
}

echo
if [ "$dt_rc" != 0 ]; then
    echo "bench/gpu.sh: bench_attn_cuda exited $dt_rc$([ "$dt_rc" = 124 ] && echo ' (timed out)')"
    status=1
fi
if [ "$nd_rc" != 0 ]; then
    echo "bench/gpu.sh: bench_attn_cuda (nondeterministic) exited $nd_rc"
    status=1
fi
if [ "$own_rc" != 0 ]; then
    echo "bench/gpu.sh: bench_attn_cuda (dt's own kernels) exited $own_rc"
    status=1
fi
if [ "$py_rc" != 0 ]; then
    echo "bench/gpu.sh: the PyTorch baseline exited $py_rc$([ "$py_rc" = 124 ] && echo \
        ' (timed out)')$([ "$py_rc" = 77 ] && echo ' (torch or its GPU missing)'): the" \
        "comparison is incomplete"
    status=1
fi
[ "$status" = 0 ] && echo "bench/gpu.sh: done"
exit "$status"
