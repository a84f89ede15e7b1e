# SPDX-License-Identifier: MIT
#
# sdpa_cpu_torch.py: the named baseline of bench/attn_torch.sh. PyTorch's
# torch.nn.functional.scaled_dot_product_attention on the CPU, fp32, with
# torch.set_num_threads(--threads), on the rows given (layout (1, H, T, D),
# is_causal as asked, enable_gqa when Hkv < H).
#
# One run: for each row, one untimed call (warm-up), then one timed call of
# the forward (under torch.no_grad) and one of forward + backward
# (torch.autograd.grad of q, k, v for a random dO). The shell script runs
# this and dtengine alternately and takes the median over runs.
#
# Output, one line per row and pass:
#   ROW T=4096 H=8 Hkv=8 D=64 causal=1 pass=fwd s=0.193301
# Exit 0; 77 with "SKIP: ..." when torch cannot be imported; 2 usage.
# Python 3 and torch only. Not a test: asserts nothing.

import argparse
import sys
import time


def parse_rows(text):
    rows = []
    for part in text.split(";"):
        f = part.split(",")
        if len(f) != 5:
            raise ValueError("row '%s' is not T,H,Hkv,D,causal" % part)
        T, H, Hkv, D, c = (int(x) for x in f)
        if T < 1 or H < 1 or Hkv < 1 or D < 1 or H % Hkv or c not in (0, 1):
            raise ValueError("row '%s' has a bad size" % part)
        rows.append((T, H, Hkv, D, c))
    return rows


def main():
    p = argparse.ArgumentParser(description="PyTorch SDPA on the CPU, baseline of attn_torch.sh")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", required=True, help="T,H,Hkv,D,causal;...")
    a = p.parse_args()
    try:
        rows = parse_rows(a.rows)
    except ValueError as e:
        print("sdpa_cpu_torch.py: %s" % e, file=sys.stderr)
        return 2
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001 - any import failure means no baseline
        print("SKIP: sdpa_cpu_torch.py: cannot import torch: %s" % str(e).splitlines()[0][:200])
        return 77
    torch.set_num_threads(max(1, a.threads))
    blas = [ln for ln in torch.__config__.show().splitlines() if "Math Kernel" in ln or "BLAS" in ln]
    print("# torch %s, CPU capability %s%s" % (torch.__version__,
                                              torch.backends.cpu.get_cpu_capability(),
                                              (", " + blas[0].strip(" -")[:60]) if blas else ""))
    for T, H, Hkv, D, c in rows:
        g = torch.Generator().manual_seed(T * 131 + D)
        q = torch.randn(1, H, T, D, generator=g, requires_grad=True)
        k = torch.randn(1, Hkv, T, D, generator=g, requires_grad=True)
        v = torch.randn(1, Hkv, T, D, generator=g, requires_grad=True)
        do = torch.randn(1, H, T, D, generator=g)
        gqa = Hkv != H

        def fwd():
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=bool(c), enable_gqa=gqa)

        def fwdbwd():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=bool(c), enable_gqa=gqa)
            return torch.autograd.grad(o, (q, k, v), do)

        for name, fn in (("fwd", fwd), ("fwdbwd", fwdbwd)):
            fn()
            t0 = time.perf_counter()
            fn()
            secs = time.perf_counter() - t0
            print("ROW T=%d H=%d Hkv=%d D=%d causal=%d pass=%s s=%.6f" % (T, H, Hkv, D, c, name, secs),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
