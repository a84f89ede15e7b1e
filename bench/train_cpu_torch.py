# SPDX-License-Identifier: MIT
"""train_cpu_torch.py: the PyTorch baseline of bench/train_cpu.sh.

Trains Hugging Face transformers' LlamaForCausalLM in the shape of dt's
`tiny` preset (dim 256, 4 layers, 8 heads / 2 kv heads, ffn 768, vocab 512,
tied embeddings, RoPE theta 10000, RMSNorm eps 1e-5) on the CPU in fp32,
attention through PyTorch's scaled_dot_product_attention, with
torch.optim.AdamW and the recipe `dtengine train` uses (lr 3e-3, betas
0.9/0.95, weight decay 0.1, eps 1e-5, global-norm clipping at 1.0), one
sequence of T random tokens per step, torch.set_num_threads(N). Prints one
line:

    ROW torch THREADS T STEP_S STEP_S ...      (every step's seconds)
    ROW torch THREADS T error WHY

Not a benchmark of its own: bench/train_cpu.sh runs it beside dtengine
and makes the table. Needs torch and transformers.
"""
import argparse
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    cfg = LlamaConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                      num_key_value_heads=2, intermediate_size=768, vocab_size=512,
                      max_position_embeddings=a.seq_len, rope_theta=10000.0,
                      rms_norm_eps=1e-5, tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    try:
        model = LlamaForCausalLM(cfg).float()
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95),
                                weight_decay=0.1, eps=1e-5)
        g = torch.Generator().manual_seed(1)
        times = []
        for _ in range(a.steps):
            x = torch.randint(0, 512, (1, a.seq_len), generator=g)
            t0 = time.perf_counter()
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
        print("ROW torch %d %d %s" % (a.threads, a.seq_len, " ".join("%.4f" % t for t in times)),
              flush=True)
    except Exception as e:  # noqa: BLE001 - report any failure as a row
        print("ROW torch %d %d error %s: %s" % (a.threads, a.seq_len, type(e).__name__,
                                              str(e)[:120]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
