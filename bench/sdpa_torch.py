# SPDX-License-Identifier: MIT
#
# sdpa_torch.py: the named baseline of bench/bench_attn_cuda. PyTorch's
# torch.nn.functional.scaled_dot_product_attention on the shapes of part (a)
# of that benchmark (B = 1, H = 2048 / D heads, layout (1, H, T, D), T in
# {4096, 16384, 65536}, D in {64, 128}, causal and not), once per backend
# that torch.nn.attention.sdpa_kernel offers (flash, efficient, cudnn); a
# backend that refuses a shape (or runs out of memory) is skipped with its
# reason, never a crash.
#
# Timing: torch.cuda.Event around each repetition, median of --reps after
# warm-up. fwd: one forward. bwd: torch.autograd.grad of a retained forward
# graph (the backward alone, all it runs). fwdbwd: forward then backward.
# FLOPs exactly as bench_attn_cuda counts them: forward 4 T^2 H D, half of
# it when causal; backward 2.5 times the forward; fwdbwd 3.5 times.
#
# Output: a table, and for bench/gpu.sh one line per (direction, shape,
# backend) and the best backend per (direction, shape):
#   ROW fwd bf16 T=4096 H=32 D=64 causal=1 backend=flash ms=0.1234 tflops=456.78
#   BEST fwd bf16 T=4096 H=32 D=64 causal=1 backend=cudnn ms=0.1111 tflops=512.34
# Exit 0; 77 with a message when torch or a CUDA device is missing; 2 usage.
# Python 3 and torch only. Not a test: asserts nothing.

import argparse
import statistics
import sys
import time
import warnings


def parse_args():
    p = argparse.ArgumentParser(description="PyTorch SDPA baseline for bench_attn_cuda")
    p.add_argument("--quick", action="store_true", help="T <= 16384, 3 repetitions")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--reps", type=int, default=0, help="repetitions (default 10, 3 with --quick)")
    p.add_argument("--budget", type=float, default=0.0,
                   help="seconds; rows not started by then are skipped (default 300, 120 quick)")
    a = p.parse_args()
    if a.reps <= 0:
        a.reps = 3 if a.quick else 10
    if a.budget <= 0:
        a.budget = 120.0 if a.quick else 300.0
    return a


def fwd_flops(T, H, D, causal):
    f = 4.0 * T * T * H * D
    return f / 2 if causal else f


def first_line(e):
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:200].replace('"', "'")


def main():
    args = parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001 - any import failure means no baseline
        print("SKIP: sdpa_torch.py: cannot import torch: %s" % first_line(e))
        return 77
    if not torch.cuda.is_available():
        print("SKIP: sdpa_torch.py: torch %s sees no CUDA device" % torch.__version__)
        return 77
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:  # noqa: BLE001
        print("SKIP: sdpa_torch.py: torch %s has no torch.nn.attention.sdpa_kernel: %s"
              % (torch.__version__, first_line(e)))
        return 77

    backends = []
    for name, attr in (("flash", "FLASH_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION"),
                       ("cudnn", "CUDNN_ATTENTION")):
        if hasattr(SDPBackend, attr):
            backends.append((name, getattr(SDPBackend, attr)))
        else:
            print("note: SDPBackend.%s not in this torch; skipped" % attr)

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    print("sdpa_torch.py: torch %s, CUDA %s, cuDNN %s, %s, %d SMs; %s, %d repetitions, "
          "budget %.0f s%s" % (torch.__version__, torch.version.cuda,
                               torch.backends.cudnn.version(), props.name,
                               props.multi_processor_count, args.dtype, args.reps, args.budget,
                               ", quick" if args.quick else ""))
    print("FLOPs: forward 4*T^2*H*D (half when causal), backward 2.5x, fwd+bwd 3.5x; "
          "median of %d after warm-up, torch.cuda.Event" % args.reps)
    sys.stdout.flush()

    t_start = time.monotonic()
    Ts = (4096, 16384) if args.quick else (4096, 16384, 65536)
    rows = []  # (dir, T, H, D, causal, backend, ms)
    skipped = []

    def timed(fn, reps):
        """Median ms of fn() over reps, after a warm-up (two when fast)."""
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        first = e0.elapsed_time(e1)
        n = 3 if first > 1000.0 and reps > 3 else reps
        if first < 1000.0:
            fn()
        ms = []
        for _ in range(n):
            e0.record()
            fn()
            e1.record()
            torch.cuda.synchronize()
            ms.append(e0.elapsed_time(e1))
        return statistics.median(ms)

    print("\n%6s %3s %4s %6s %-10s | %9s %8s | %9s %8s | %9s %8s"
          % ("T", "H", "D", "causal", "backend", "fwd ms", "TFLOP/s", "bwd ms", "TFLOP/s",
             "f+b ms", "TFLOP/s"))
    for T in Ts:
        for D in (64, 128):
            H = 2048 // D
            for causal in (0, 1):
                if time.monotonic() - t_start > args.budget:
                    print("SKIP T=%d D=%d causal=%d: the time budget is spent (--budget %.0f)"
                          % (T, D, causal, args.budget))
                    continue
                g = torch.Generator(device=dev)
                g.manual_seed(1234 + T + D + causal)
                shape = (1, H, T, D)
                q = torch.randn(shape, device=dev, dtype=dtype, generator=g)
                k = torch.randn(shape, device=dev, dtype=dtype, generator=g)
                v = torch.randn(shape, device=dev, dtype=dtype, generator=g)
                dout = torch.randn(shape, device=dev, dtype=dtype, generator=g)
                qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))
                fl = fwd_flops(T, H, D, causal)
                for name, be in backends:
                    res = {}
                    kept = []  # the graph timed by bwd(), dropped after the backend
                    try:
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            with sdpa_kernel([be]):
                                def fwd():
                                    with torch.no_grad():
                                        F.scaled_dot_product_attention(q, k, v,
                                                                       is_causal=bool(causal))
                                res["fwd"] = timed(fwd, args.reps)
                                kept.append(F.scaled_dot_product_attention(
                                    qg, kg, vg, is_causal=bool(causal)))

                                def bwd():
                                    torch.autograd.grad(kept[0], (qg, kg, vg), dout,
                                                        retain_graph=True)
                                res["bwd"] = timed(bwd, args.reps)
                                kept.clear()

                                def fwdbwd():
                                    o = F.scaled_dot_product_attention(qg, kg, vg,
                                                                       is_causal=bool(causal))
                                    torch.autograd.grad(o, (qg, kg, vg), dout)
                                res["fwdbwd"] = timed(fwdbwd, args.reps)
                    except Exception as e:  # noqa: BLE001 - a refusal or OOM skips the backend
                        kept.clear()
                        reason = first_line(e)
                        skipped.append((T, D, causal, name, reason))
                        print("SKIP T=%d D=%d causal=%d backend=%s: %s"
                              % (T, D, causal, name, reason))
                        try:
                            torch.cuda.synchronize()
                        except Exception as e2:  # noqa: BLE001 - the context is gone
                            print("sdpa_torch.py: CUDA unusable after %s: %s"
                                  % (name, first_line(e2)))
                            return 1
                        torch.cuda.empty_cache()
                        if not res:
                            continue
                    for dirn, mult in (("fwd", 1.0), ("bwd", 2.5), ("fwdbwd", 3.5)):
                        if dirn in res:
                            rows.append((dirn, T, H, D, causal, name, res[dirn], mult * fl))

                    def cell(dirn, mult):
                        if dirn not in res:
                            return "%9s %8s" % ("-", "-")
                        return "%9.3f %8.1f" % (res[dirn], mult * fl / (res[dirn] * 1e-3) * 1e-12)
                    print("%6d %3d %4d %6s %-10s | %s | %s | %s"
                          % (T, H, D, "yes" if causal else "no", name, cell("fwd", 1.0),
                             cell("bwd", 2.5), cell("fwdbwd", 3.5)))
                    sys.stdout.flush()
                del q, k, v, dout, qg, kg, vg
                torch.cuda.empty_cache()

    print()
    best = {}
    for dirn, T, H, D, causal, name, ms, fl in rows:
        tf = fl / (ms * 1e-3) * 1e-12
        print("ROW %s %s T=%d H=%d D=%d causal=%d backend=%s ms=%.4f tflops=%.2f"
              % (dirn, args.dtype, T, H, D, causal, name, ms, tf))
        key = (dirn, T, H, D, causal)
        if key not in best or tf > best[key][2]:
            best[key] = (name, ms, tf)
    for (dirn, T, H, D, causal), (name, ms, tf) in best.items():
        print("BEST %s %s T=%d H=%d D=%d causal=%d backend=%s ms=%.4f tflops=%.2f"
              % (dirn, args.dtype, T, H, D, causal, name, ms, tf))
    print("\nsdpa_torch.py: %.1f s, %d rows, %d backend/shape pairs skipped"
          % (time.monotonic() - t_start, len(rows), len(skipped)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
