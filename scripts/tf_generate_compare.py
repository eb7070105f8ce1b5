#!/usr/bin/env python3
"""tf_generate_compare.py OUT_DIR [--moex PATH] [--device N] [--keep]

Whole-model generation, transformers beside `moex generate --device cuda`, on a
GPU machine with torch and transformers (5.x) installed.

1. Writes a random checkpoint with qwen3-30b-a3b's layer shapes and 4 layers
   (hidden 2048, 128 experts, top-8, moe_intermediate 768, 32 query / 4 kv
   heads of 128, vocabulary 151936) to OUT_DIR/checkpoint, stored in bf16.
   The lm_head is scaled up so that most greedy steps have a top-2 logit gap
   above 1e-3 (ties would make token comparisons meaningless).
2. f32, TF32 off: a 32-token prompt and 32 new tokens (greedy). Prints the
   per-step top-2 gaps, then moex's tokens and last-prompt logits beside
   transformers' (same checkpoint, same prompt, `--dtype f32`).
3. bf16: a 512-token prompt and 128 new tokens. Prefill and decode tokens/s of
   transformers' generate and of moex generate (without and with
   --cuda-graph), each after one untimed warm-up generation in the same
   process; moex's GPU memory (weights, KV cache, workspace).

Writes OUT_DIR/compare.json with every number printed. Exit status 0 when the
f32 tokens agree up to the first step whose top-2 gap is below 1e-3.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import torch

HIDDEN, EXPERTS, TOP_K, MOE_I, HEADS, KV_HEADS, HEAD_DIM, VOCAB, LAYERS = 2048, 128, 8, 768, 32, 4, 128, 151936, 4
F32_PROMPT, F32_NEW = 32, 32
BF16_PROMPT, BF16_NEW = 512, 128
GAP = 1e-3


def write_checkpoint(path):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=6144, moe_intermediate_size=MOE_I,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
        num_experts=EXPERTS, num_experts_per_tok=TOP_K, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], rms_norm_eps=1e-6, max_position_embeddings=4096,
        tie_word_embeddings=False, initializer_range=0.02)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        # logits ~ N(0, (4 * 0.02)^2 * 2048): std ~3.6, the top-2 gap of 151936 draws is ~0.7 on average
        model.lm_head.weight.mul_(4.0)
    model = model.to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    del model
    torch.cuda.empty_cache()


def load(path, dtype):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to("cuda").eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def tf_generate(model, prompt, new):
    ids = torch.tensor([prompt], device="cuda")
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    torch.cuda.synchronize()
    tokens = out.sequences[0, len(prompt):].tolist()
    logits = [l[0].float() for l in out.logits]
    return tokens, logits


def tf_timing(model, prompt, new):
    ids = torch.tensor([prompt], device="cuda")
    kw = dict(do_sample=False)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)  # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
    prefill = t1 - t0
    decode = max((t2 - t1) - prefill, 1e-9)
    return len(prompt) / prefill, (new - 1) / decode


def moex_run(moex, path, prompt, new, dtype, device, extra=()):
    cmd = [moex, "generate", path, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", str(new),
           "--device", "cuda", "--dtype", dtype, "--ignore-eos", *extra]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(device))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd[:3]), r.returncode, r.stderr.strip()[-2000:]))
    return r.stdout


def moex_rates(text):
    rates = {}
    for line in text.splitlines():
        for key in ("prefill", "decode"):
            if line.startswith(key + ":") and "(" in line:
                rates[key] = float(line.rsplit("(", 1)[1].split()[0])
    return rates


def find_moex(given):
    """The moex binary: given, else build-gpu/moex, then build/moex of this tree; exits when there is none."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    moex = given or next((p for p in (os.path.join(root, "build-gpu", "moex"), os.path.join(root, "build", "moex"))
                          if os.path.exists(p)), None)
    if not moex:
        sys.exit("no moex binary found; build it or pass --moex")
    return moex


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="output folder")
    ap.add_argument("--moex", default=None, help="the moex binary (default: build-gpu/moex, then build/moex)")
    ap.add_argument("--device", type=int, default=0, help="GPU index")
    ap.add_argument("--keep", action="store_true", help="reuse OUT/checkpoint when it exists")
    a = ap.parse_args()
    moex = find_moex(a.moex)
    if not torch.cuda.is_available():
        sys.exit("torch sees no GPU")
    torch.cuda.set_device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(a.out, exist_ok=True)
    ckpt = os.path.join(a.out, "checkpoint")
    if not (a.keep and os.path.exists(os.path.join(ckpt, "config.json"))):
        shutil.rmtree(ckpt, ignore_errors=True)
        t = time.perf_counter()
        write_checkpoint(ckpt)
        print("checkpoint written to %s in %.0f s" % (ckpt, time.perf_counter() - t))
    report = {}
    g = torch.Generator().manual_seed(1)
    prompt32 = torch.randint(0, VOCAB, (F32_PROMPT,), generator=g).tolist()
    prompt512 = torch.randint(0, VOCAB, (BF16_PROMPT,), generator=g).tolist()

    # ---- f32: tokens and logits
    model = load(ckpt, torch.float32)
    tf_tokens, tf_logits = tf_generate(model, prompt32, F32_NEW)
    del model
    torch.cuda.empty_cache()
    gaps = []
    for l in tf_logits:
        top = torch.topk(l, 2).values
        gaps.append(float(top[0] - top[1]))
    print("f32 transformers tokens:", tf_tokens)
    print("f32 per-step top-2 gaps:", " ".join("%.3g" % x for x in gaps))
    print("steps with a gap > %g: %d of %d" % (GAP, sum(x > GAP for x in gaps), len(gaps)))
    out = json.loads(moex_run(moex, ckpt, prompt32, F32_NEW, "f32", a.device, ["--json", "--logits"]))
    mx_tokens = out["new_ids"][0]
    mx_logits = torch.tensor(out["last_prompt_logits"][0])
    ref = tf_logits[0].cpu()
    diff = (mx_logits - ref).abs()
    first_small = next((i for i, x in enumerate(gaps) if x <= GAP), len(gaps))
    agree = next((i for i, (x, y) in enumerate(zip(tf_tokens, mx_tokens)) if x != y), min(len(tf_tokens), len(mx_tokens)))
    print("f32 moex tokens:        ", mx_tokens)
    print("f32 tokens agree for the first %d of %d steps (the first gap <= %g is at step %d)" %
          (agree, len(tf_tokens), GAP, first_small))
    print("f32 last-prompt logits: max |moex - transformers| = %.3g (mean %.3g, |logits| up to %.3g)" %
          (float(diff.max()), float(diff.mean()), float(ref.abs().max())))
    print("experts map after generation:", out.get("experts_implementation"))
    report["f32"] = dict(tf_tokens=tf_tokens, moex_tokens=mx_tokens, gaps=gaps, agree_steps=agree,
                         first_small_gap=first_small, logits_max_abs_diff=float(diff.max()),
                         logits_mean_abs_diff=float(diff.mean()), experts_map=out.get("experts_implementation"))

    # ---- bf16: throughput
    model = load(ckpt, torch.bfloat16)
    tf_pre, tf_dec = tf_timing(model, prompt512, BF16_NEW)
    del model
    torch.cuda.empty_cache()
    # one untimed generation first in the same process (--warmup 1), as transformers gets above
    text = moex_run(moex, ckpt, prompt512, BF16_NEW, "bf16", a.device, ["--warmup", "1"])
    mx = moex_rates(text)
    mxg = moex_rates(moex_run(moex, ckpt, prompt512, BF16_NEW, "bf16", a.device, ["--cuda-graph", "--warmup", "1"]))
    memory = next((l for l in text.splitlines() if l.startswith("gpu memory:")), "gpu memory: not reported")
    print("bf16 %d-token prompt + %d new tokens (tokens/s):" % (BF16_PROMPT, BF16_NEW))
    print("  %-26s prefill %10.1f  decode %8.1f" % ("transformers", tf_pre, tf_dec))
    print("  %-26s prefill %10.1f  decode %8.1f" % ("moex", mx.get("prefill", 0), mx.get("decode", 0)))
    print("  %-26s prefill %10.1f  decode %8.1f" % ("moex --cuda-graph", mxg.get("prefill", 0), mxg.get("decode", 0)))
    print("  moex %s" % memory)
    print("  ratios moex/transformers: prefill %.2fx, decode %.2fx (with --cuda-graph: %.2fx, %.2fx)" %
          (mx.get("prefill", 0) / tf_pre, mx.get("decode", 0) / tf_dec, mxg.get("prefill", 0) / tf_pre,
           mxg.get("decode", 0) / tf_dec))
    report["bf16"] = dict(transformers=dict(prefill=tf_pre, decode=tf_dec), moex=mx, moex_graph=mxg, moex_memory=memory)
    with open(os.path.join(a.out, "compare.json"), "w") as f:
        json.dump(report, f, indent=1)
    sys.exit(0 if agree >= first_small else 1)


if __name__ == "__main__":
    main()
