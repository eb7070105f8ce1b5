#!/usr/bin/env python3
"""tf_model_speed.py OUT_DIR --shape deepseek-v3|gpt-oss-20b [--moex PATH] [--device N] [--keep] [--tiny]
                   [--f32-check] [--dequantize] [--checkpoint-only]

Prefill and decode speed of a whole model, transformers beside `moex generate --device cuda`, on a
GPU machine with torch and transformers (5.x), on a random checkpoint in the format the family ships:

  deepseek-v3   DeepSeek-V3's real sizes for 2 MoE layers (hidden 7168, 128 heads, q_lora_rank 1536,
                kv_lora_rank 512, qk 128 + 64 rope, v 128, 256 experts of 2048, top-8 in 8 groups of
                which 4 are kept, one shared expert, yarn rope with factor 40, vocabulary 129280), every
                linear layer but the router and lm_head in FP8 e4m3 with 128 x 128 float block scales
                (`weight_scale_inv`), each expert in its own tensors, as DeepSeek ships it (about 23 GB).
  gpt-oss-20b   gpt-oss-20b's sizes for 4 layers (hidden 2880, 64 heads and 8 kv heads of 64, sinks,
                sliding (128) and full layers, 32 experts of 2880, top-4, yarn with factor 32,
                vocabulary 201088), the experts in MXFP4 as OpenAI ships them (`*_blocks`, `*_scales`).

The checkpoint is written to OUT_DIR/checkpoint. transformers runs the same weights, dequantized to
bf16 in memory (it runs neither format on this machine without extra kernels). moex runs the checkpoint
as it is: deepseek-v3 with FP8 experts (the attention's FP8 projections dequantized at load), gpt-oss-20b
with FP4 experts (their activations rounded to e2m1 per 32, as moex's FP4 path does on both devices);
--dequantize runs moex on the dequantized experts instead. bf16 compute, a 512-token prompt, 128 new
tokens, greedy; each side warmed up once in its process. Prints and writes OUT_DIR/speed.json: tokens/s
of both, the ratios, moex's GPU memory and its KV cache bytes per token, how far apart the two sides'
last-prompt logits are, and how many of the greedy tokens agree (random weights: near-ties make the
tokens diverge; a sanity check, not a test); with --f32-check the same logits in f32 on both sides.

--tiny: the same families at toy sizes on the CPU (transformers on the CPU, moex generate --device cpu),
to check the script itself on a machine without a GPU.
"""
import argparse
import json
import math
import os
import re
import shutil
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tf_generate_compare import find_moex, moex_rates  # noqa: E402

PROMPT, NEW = 512, 128
FP8_MAX, BLOCK = 448.0, 128

DEEPSEEK = dict(
    vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=2,
    num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1, n_routed_experts=256,
    routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128,
    qk_nope_head_dim=128, n_group=8, topk_group=4, num_experts_per_tok=8, first_k_dense_replace=0,
    norm_topk_prob=True, max_position_embeddings=163840, rms_norm_eps=1e-6, rope_interleave=True,
    tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, original_max_position_embeddings=4096,
                         beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0))
GPT_OSS = dict(
    vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=4, num_attention_heads=64,
    num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4, sliding_window=128,
    layer_types=["sliding_attention", "full_attention"] * 2, attention_bias=True, swiglu_limit=7.0,
    max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
    rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, original_max_position_embeddings=4096,
                         beta_fast=32.0, beta_slow=1.0, truncate=False))
TINY = {"deepseek-v3": dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=4, n_routed_experts=16, n_group=4, topk_group=2, q_lora_rank=64,
                            kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
                            vocab_size=512),
        "gpt-oss-20b": dict(hidden_size=128, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=32, num_local_experts=8, vocab_size=512, sliding_window=16)}


def fp8_quantize(w):
    """w [N, K] -> (q e4m3 [N, K], scale_inv f32 [ceil(N/128), ceil(K/128)], w dequantized), transformers' recipe."""
    N, K = w.shape
    sn, sk = math.ceil(N / BLOCK), math.ceil(K / BLOCK)
    pad = torch.zeros(sn * BLOCK, sk * BLOCK, dtype=torch.float32, device=w.device)
    pad[:N, :K] = w.float()
    tiles = pad.reshape(sn, BLOCK, sk, BLOCK)
    amax = tiles.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, FP8_MAX / torch.where(amax > 0, amax, torch.ones_like(amax)), torch.ones_like(amax))
    inv = (1.0 / scale).float()
    q = (tiles * scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    deq = (q.float() * inv[:, None, :, None]).reshape(sn * BLOCK, sk * BLOCK)[:N, :K]
    return q.reshape(sn * BLOCK, sk * BLOCK)[:N, :K].contiguous(), inv.contiguous(), deq


def mxfp4_quantize(w):
    """w [N, K] (rows = outputs) -> (blocks uint8 [N, K/32, 16], scales uint8 [N, K/32], w dequantized):
    per 32 inputs the power-of-two scale that puts the largest value at or below 6, values rounded to
    the nearest e2m1 code (low nibble first, exponents stored + 127)."""
    N, K = w.shape
    lut = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], device=w.device)
    x = w.float().reshape(N, K // 32, 32)
    amax = x.abs().amax(dim=-1).clamp_min(1e-30)
    e = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scale = torch.exp2(e)
    y = (x / scale[..., None]).abs()
    idx = (y[..., None] - lut).abs().argmin(dim=-1)
    code = idx + 8 * (x < 0).to(idx.dtype)
    deq = lut[idx] * torch.where(x < 0, -1.0, 1.0) * scale[..., None]
    code = code.reshape(N, K // 32, 16, 2)
    blocks = (code[..., 0] | (code[..., 1] << 4)).to(torch.uint8)
    return blocks.contiguous(), (e + 127).to(torch.uint8).contiguous(), deq.reshape(N, K)


def build(shape, tiny, dev):
    import transformers

    if shape == "deepseek-v3":
        cfg = transformers.DeepseekV3Config(**dict(DEEPSEEK, **(TINY[shape] if tiny else {})))
        cls = transformers.DeepseekV3ForCausalLM
    else:
        cfg = transformers.GptOssConfig(**dict(GPT_OSS, **(TINY[shape] if tiny else {})))
        cls = transformers.GptOssForCausalLM
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(dev):
        model = cls(cfg)
    torch.set_default_dtype(torch.float32)
    with torch.no_grad():  # weights large enough that the logits are decisive
        for name, p in model.named_parameters():
            if "norm" in name and p.dim() == 1:
                p.uniform_(0.8, 1.2)
            elif "bias" in name or name.endswith("sinks"):
                p.normal_(0.0, 0.05)
            else:
                p.normal_(0.0, 1.0 / max(p.shape[-1], 1) ** 0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.05)
    return model.eval()


def layer_params(model, layer):
    """(name, parameter) of layer `layer`, or for -1 those outside the layers (embeddings, final norm, lm_head)."""
    pre = "model.layers.%d." % layer
    for name, p in model.named_parameters():
        if name.startswith(pre) if layer >= 0 else not name.startswith("model.layers."):
            yield name, p


def deepseek_tensors(model, layer):
    """Layer `layer`'s tensors in DeepSeek's FP8 layout (the model's weights replaced by their dequantized values);
    layer -1: embeddings, final norm, lm_head."""
    out = {}
    pre = "model.layers.%d." % layer
    for name, p in layer_params(model, layer):
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            base = name.rsplit(".", 1)[0]
            parts = ["gate_proj", "up_proj"] if name.endswith("gate_up_proj") else ["down_proj"]
            rows = p.shape[1] // len(parts)
            for e in range(p.shape[0]):
                for i, part in enumerate(parts):
                    q, inv, deq = fp8_quantize(p.data[e, i * rows:(i + 1) * rows])
                    p.data[e, i * rows:(i + 1) * rows] = deq.to(p.dtype)
                    out["%s.%d.%s.weight" % (base, e, part)] = q.cpu()
                    out["%s.%d.%s.weight_scale_inv" % (base, e, part)] = inv.cpu()
        elif p.dim() == 2 and name.endswith("_proj.weight") or name.endswith("_proj_with_mqa.weight"):
            q, inv, deq = fp8_quantize(p.data)  # attention and shared-expert projections
            p.data.copy_(deq.to(p.dtype))
            out[name] = q.cpu()
            out[name[:-len("weight")] + "weight_scale_inv"] = inv.cpu()
        else:  # norms, router, embeddings, lm_head
            out[name] = p.data.contiguous().cpu()
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias") and name.startswith(pre) and layer >= 0:
            out[name] = b.float().contiguous().cpu()
    return out


def gpt_oss_tensors(model, layer):
    """The same for gpt_oss: the experts in MXFP4 (blocks of the [E, out, in] rows), the rest bf16."""
    out = {}
    for name, p in layer_params(model, layer):
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            blocks, scales = [], []
            for e in range(p.shape[0]):
                b, s, deq = mxfp4_quantize(p.data[e].t().contiguous())  # rows = outputs
                p.data[e] = deq.t().to(p.dtype)
                blocks.append(b.cpu())
                scales.append(s.cpu())
            out[name + "_blocks"] = torch.stack(blocks).contiguous()
            out[name + "_scales"] = torch.stack(scales).contiguous()
        else:
            out[name] = p.data.contiguous().cpu()
    return out


def write_checkpoint(model, shape, path):
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    tensors_of = deepseek_tensors if shape == "deepseek-v3" else gpt_oss_tensors
    weight_map, total = {}, 0
    layers = model.config.num_hidden_layers
    for i, layer in enumerate([-1] + list(range(layers))):
        with torch.no_grad():
            t = tensors_of(model, layer)
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, layers + 1)
        save_file(t, os.path.join(path, fname), metadata={"format": "pt"})
        for k, v in t.items():
            weight_map[k] = fname
            total += v.numel() * v.element_size()
        del t
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump(dict(metadata=dict(total_size=total), weight_map=weight_map), f, indent=1)
    c = model.config.to_dict()
    c["torch_dtype"] = "bfloat16"
    if shape == "deepseek-v3":
        c["quantization_config"] = dict(quant_method="fp8", fmt="e4m3", activation_scheme="dynamic",
                                        weight_block_size=[BLOCK, BLOCK])
    else:
        c["quantization_config"] = dict(quant_method="mxfp4", modules_to_not_convert=[
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"])
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
    return total


def tf_run(model, prompt, new, dev):
    """Greedy tokens, prefill and decode tokens/s (after one warm-up generation)."""
    ids = torch.tensor([prompt], device=dev)
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)
        prefill = float("inf")
        for _ in range(3):  # the best of three prefills (its times vary from run to run)
            sync()
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
            sync()
            prefill = min(prefill, time.perf_counter() - t0)
        t1 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw)
        sync()
        t2 = time.perf_counter()
    decode = max((t2 - t1) - prefill, 1e-9)
    return out[0, len(prompt):].tolist(), len(prompt) / prefill, (new - 1) / decode


def moex_run(moex, path, prompt, new, kind, gpu, extra, dtype="bf16"):
    import subprocess

    cmd = [moex, "generate", path, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", str(new),
           "--device", kind, "--dtype", dtype, "--ignore-eos", "--warmup", "1", *extra]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu))
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd[:3]), r.returncode, r.stderr.strip()[-2000:]))
    return r.stdout, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="output folder")
    ap.add_argument("--shape", required=True, choices=["deepseek-v3", "gpt-oss-20b"])
    ap.add_argument("--moex", default=None, help="the moex binary (default: build-gpu/moex, then build/moex)")
    ap.add_argument("--device", type=int, default=0, help="GPU index")
    ap.add_argument("--keep", action="store_true", help="reuse OUT/checkpoint when it exists (transformers then "
                    "runs the model it rebuilds from the same seed, dequantized again)")
    ap.add_argument("--tiny", action="store_true", help="toy sizes on the CPU (checks the script)")
    ap.add_argument("--checkpoint-only", action="store_true", help="write OUT/checkpoint and the prompt's ids "
                    "(OUT/prompt.txt, comma-separated) and stop: no transformers or moex run")
    ap.add_argument("--f32-check", action="store_true", help="also compare the last-prompt logits in f32 (the "
                    "transformers model converted to f32 after the timing; moex --dtype f32)")
    ap.add_argument("--dequantize", action="store_true", help="moex runs the experts dequantized (moex generate "
                    "--dequantize), not in the checkpoint's format")
    a = ap.parse_args()
    moex = None if a.checkpoint_only else find_moex(a.moex)
    dev, kind = ("cpu", "cpu") if a.tiny else ("cuda", "cuda")
    if not a.tiny:
        if not torch.cuda.is_available():
            sys.exit("torch sees no GPU")
        torch.cuda.set_device(a.device)
    prompt_len, new = (24, 8) if a.tiny else (PROMPT, NEW)
    os.makedirs(a.out, exist_ok=True)
    ckpt = os.path.join(a.out, "checkpoint")
    t = time.perf_counter()
    model = build(a.shape, a.tiny, dev)
    print("%s: model built in %.0f s" % (a.shape, time.perf_counter() - t), flush=True)
    t = time.perf_counter()
    if a.keep and os.path.exists(os.path.join(ckpt, "config.json")):
        with torch.no_grad():  # the same dequantized weights as the checkpoint's
            for layer in [-1] + list(range(model.config.num_hidden_layers)):
                (deepseek_tensors if a.shape == "deepseek-v3" else gpt_oss_tensors)(model, layer)
        size = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt))
    else:
        shutil.rmtree(ckpt, ignore_errors=True)
        size = write_checkpoint(model, a.shape, ckpt)
    print("checkpoint %s: %.1f GB in %.0f s" % (ckpt, size / 1e9, time.perf_counter() - t), flush=True)
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(2, V, (prompt_len,), generator=g).tolist()
    if a.checkpoint_only:
        with open(os.path.join(a.out, "prompt.txt"), "w") as f:
            f.write(",".join(map(str, prompt)))
        return

    with torch.no_grad():  # the last prompt position's logits, for the check against moex's
        tf_logits = model(torch.tensor([prompt], device=dev)).logits[0, -1].float().cpu()
    tf_tokens, tf_pre, tf_dec = tf_run(model, prompt, new, dev)
    print("transformers: prefill %.1f tokens/s, decode %.1f tokens/s" % (tf_pre, tf_dec), flush=True)
    f32 = None
    if a.f32_check:  # the same weights in f32 on both sides: bf16's rounding out of the comparison
        try:
            model = model.float()
            with torch.no_grad():
                f32 = model(torch.tensor([prompt], device=dev)).logits[0, -1].float().cpu()
        except RuntimeError as err:  # out of memory: reported, the speed numbers kept
            print("f32 check skipped: %s" % str(err).splitlines()[0], flush=True)
    del model
    if dev == "cuda":
        torch.cuda.empty_cache()
    extra = ["--dequantize"] if a.dequantize else []
    text, wall = moex_run(moex, ckpt, prompt, new, kind, a.device, extra + ["--json", "--logits"])
    mx_json = json.loads(text[text.index("{"):])
    mx_logits = torch.tensor(mx_json["last_prompt_logits"][0])
    top2 = torch.topk(tf_logits, 2).values
    logit_check = dict(max_abs_diff=float((mx_logits - tf_logits).abs().max()),
                       mean_abs_diff=float((mx_logits - tf_logits).abs().mean()), tf_std=float(tf_logits.std()),
                       tf_top2_gap=float(top2[0] - top2[1]))
    text, wall = moex_run(moex, ckpt, prompt, new, kind, a.device, extra)
    mx = moex_rates(text)
    mxg = moex_rates(moex_run(moex, ckpt, prompt, new, kind, a.device, extra + ["--cuda-graph"])[0]) if not a.tiny else {}
    memory = next((l for l in text.splitlines() if l.startswith("gpu memory:")), "gpu memory: not reported")
    if f32 is not None:
        text32, _ = moex_run(moex, ckpt, prompt, 1, kind, a.device, extra + ["--json", "--logits"], "f32")
        d32 = (torch.tensor(json.loads(text32[text32.index("{"):])["last_prompt_logits"][0]) - f32).abs()
        logit_check["f32_max_abs_diff"], logit_check["f32_mean_abs_diff"] = float(d32.max()), float(d32.mean())
    mx_tokens = mx_json["new_ids"][0]
    agree = next((i for i, (x, y) in enumerate(zip(tf_tokens, mx_tokens)) if x != y), min(len(tf_tokens), len(mx_tokens)))
    report = dict(shape=a.shape, experts="dequantized" if a.dequantize else "as stored", prompt=prompt_len, new=new, checkpoint_bytes=size,
                  transformers=dict(prefill=tf_pre, decode=tf_dec), moex=mx, moex_graph=mxg, moex_memory=memory,
                  moex_wall_s=wall, greedy_tokens_agree=agree, transformers_tokens=tf_tokens, moex_tokens=mx_tokens,
                  last_prompt_logits=logit_check)
    kv_bytes = re.search(r"kv cache [0-9.]+ MiB \(([0-9]+) bytes\)", memory)
    if kv_bytes:  # bytes over max_seq = prompt + new positions of one sequence
        kv = float(kv_bytes.group(1))
        report["moex_kv_cache_bytes_per_token"] = kv / (prompt_len + new)
    print("%s, bf16, experts %s, %d-token prompt + %d new tokens (tokens/s):" %
          (a.shape, report["experts"], prompt_len, new))
    print("  %-20s prefill %10.1f  decode %8.1f" % ("transformers", tf_pre, tf_dec))
    print("  %-20s prefill %10.1f  decode %8.1f" % ("moex", mx.get("prefill", 0), mx.get("decode", 0)))
    if mxg:
        print("  %-20s prefill %10.1f  decode %8.1f" % ("moex --cuda-graph", mxg.get("prefill", 0), mxg.get("decode", 0)))
    print("  moex %s" % memory)
    if "moex_kv_cache_bytes_per_token" in report:
        print("  moex kv cache per token: %.0f bytes" % report["moex_kv_cache_bytes_per_token"])
    best_dec = max(mx.get("decode", 0), mxg.get("decode", 0))
    print("  ratios moex/transformers: prefill %.2fx, decode %.2fx (best of plain and graph)" %
          (mx.get("prefill", 0) / tf_pre, best_dec / tf_dec))
    print("  greedy tokens agree for the first %d of %d steps" % (agree, new))
    print("  last-prompt logits, bf16: max |moex - transformers| %.3g, mean %.3g (transformers' std %.3g, top-2 gap "
          "%.3g)" % (logit_check["max_abs_diff"], logit_check["mean_abs_diff"], logit_check["tf_std"],
                     logit_check["tf_top2_gap"]))
    if "f32_max_abs_diff" in logit_check:
        print("  last-prompt logits, f32: max |moex - transformers| %.3g, mean %.3g" %
              (logit_check["f32_max_abs_diff"], logit_check["f32_mean_abs_diff"]))
    with open(os.path.join(a.out, "speed.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
