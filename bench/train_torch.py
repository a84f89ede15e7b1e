# SPDX-License-Identifier: MIT
"""train_torch.py: the PyTorch baseline of bench/train_gpu.sh.

Trains Hugging Face transformers' LlamaForCausalLM (attention through
PyTorch's scaled_dot_product_attention) on one GPU with the recipe dt's
GPU training uses: fp32 master weights and AdamW state (fused AdamW,
betas 0.9/0.95, weight decay 0.1), bf16 autocast compute, global-norm
clipping at 1.0, one sequence of T random tokens per step. Prints one line
per shape:

    ROW torch SHAPE T tokens_per_s STEP_S PEAK_GIB
    ROW torch SHAPE T oom|error WHY

Not a benchmark of its own: bench/train_gpu.sh runs it beside dtengine and
makes the table. Needs torch and transformers (the GPU node has both).
"""
import argparse
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--dim", type=int, required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--kv-heads", type=int, required=True)
    ap.add_argument("--ffn", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model (the ROW is named torch-compiled)")
    a = ap.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=a.dim, num_hidden_layers=a.layers,
                      num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      intermediate_size=a.ffn, vocab_size=a.vocab,
                      max_position_embeddings=a.seq_len, rope_theta=500000.0,
                      rms_norm_eps=1e-5, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    tag = "torch-compiled" if a.compile else "torch"
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg)
        model.train()
        tag = "torch"
        if a.compile:
            if not hasattr(torch, "compile"):
                print(f"ROW torch-compiled {a.name} {a.seq_len} error no torch.compile",
                      flush=True)
                return 0
            model = torch.compile(model)
            tag = "torch-compiled"
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95),
                                weight_decay=0.1, eps=1e-5, fused=True)
        g = torch.Generator(device="cuda").manual_seed(1)
        times = []
        for step in range(a.steps):
            x = torch.randint(0, a.vocab, (1, a.seq_len), device="cuda", generator=g)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=x, labels=x).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        rest = times[1:] if len(times) > 1 else times  # step 0 is warm-up
        step_s = sum(rest) / len(rest)
        peak = torch.cuda.max_memory_allocated() / 2**30
        print(f"ROW {tag} {a.name} {a.seq_len} {a.seq_len / step_s:.1f} {step_s:.4f} "
              f"{peak:.1f}", flush=True)
    except torch.OutOfMemoryError as e:
        print(f"ROW {tag} {a.name} {a.seq_len} oom {str(e).splitlines()[0][:120]}", flush=True)
    except Exception as e:  # noqa: BLE001 - report any failure as a row
        print(f"ROW {tag} {a.name} {a.seq_len} error {type(e).__name__}: {str(e)[:120]}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
