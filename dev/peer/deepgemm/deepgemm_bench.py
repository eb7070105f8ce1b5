#!/usr/bin/env python3
"""DeepGEMM m-grouped GEMM benchmark (peer = deepgemm) for one H200 (SM90).

DeepGEMM: github.com/deepseek-ai/DeepGEMM @ 54e22612409371d6364144b69086735beb54e98b
(v2.6.1, 2026-06-23; CUTLASS f3fde58, fmt 553ec11), `_C` built for CPython 3.12 /
torch 2.11.0+cu130 / CUDA 13.0. What this script needs lies in DG_PAYLOAD_DIR (default
<repo>/peer-run/deepgemm/, a folder git ignores; see dev/peer/README.md):
  deepgemm-pkg.tar.xz  the importable `deep_gemm/` package: python files, the stripped
                       _C.cpython-312-x86_64-linux-gnu.so and include/{deep_gemm,cute,cutlass}
                       (the JIT headers: DeepGEMM passes -I<package dir>/include to NVCC/NVRTC,
                       see csrc/jit/compiler.hpp: library_include_path = library_root / "include")
  jit-cache.tar.xz     kernels pre-compiled offline (NVCC 13.0, sm_90a, 132 SMs) for exactly the
                       calls below; valid only when the package sits at /tmp/dg_run/deep_gemm
                       (the -I path is part of DeepGEMM's cache key). A miss just JIT-compiles.
  BUILD_INFO.json, deepgemm-src.tar.xz (source incl. submodules, for provenance / a rebuild)

Run from the repository root:  python3 dev/peer/deepgemm/deepgemm_bench.py > dg.csv 2> dg.log

stdout (CSV): peer,shape,dtype,layout,part,tokens,ms,tflops
  layout: contiguous | masked | masked-vllm | layer ;  part: gateup | down | layer
  layout=contiguous: GEMM only, rows sorted by expert, each expert padded to 128 (m_indices=-1)
  layout=masked:     GEMM only, [E, max_m, K] with masked_m per expert (decode), max_m=max(128,T),
                     expected_m as SGLang: (T*topk+E)//E;  masked-vllm: the same with expected_m=max_m
                     as vLLM's BatchedDeepGemmExperts (env DG_MASKED_EXPECTED_M=sglang|vllm|both)
  layout=layer:      whole expert layer in torch glue + the two contiguous DeepGEMM GEMMs;
                     part=layer is the whole layer, part=gateup/down the GEMMs inside that layer
  ms = median over >= 10 timed runs (CUDA events, 3 warm-ups, 256 MiB L2 flush before each run)
  tflops counts real (unpadded) rows only: 2*T*topk*N*K per GEMM (6*T*topk*H*I per layer)
  Non-numeric rows: ms=WARN tflops=nmse=<x> (NMSE > 1e-2), ms=ERROR tflops=<message>,
                    ms=SKIP tflops=budget (time budget BUDGET_S exhausted; default 420 s)
stderr: progress, versions, NMSE of each case vs a float32 torch reference on dequantized inputs.

Other modes (no GPU needed): --list-jit-specs (the kernel shapes, for the offline prebuild),
--selftest-cpu (glue and reference math on CPU at tiny sizes with a torch stand-in for DeepGEMM).
"""

import argparse
import ctypes
import glob
import json
import math
import os
import shutil
import statistics
import sys
import tarfile
import time
import traceback
import zlib

T_START = time.time()
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PAYLOAD = os.environ.get('DG_PAYLOAD_DIR', os.path.join(REPO, 'peer-run', 'deepgemm'))
RUN_DIR = os.environ.get('DG_RUN_DIR', '/tmp/dg_run')  # keep /tmp/dg_run: the prebuilt JIT cache keys on it
BUDGET_S = float(os.environ.get('BUDGET_S', '420'))
N_WARMUP = 3
N_ITERS = max(10, int(os.environ.get('DG_BENCH_ITERS', '10')))
FLUSH_BYTES = 256 * 1024 * 1024
ALIGN_M = 128        # DeepGEMM SM90 m-grouped contiguous alignment (get_mk_alignment_for_contiguous_layout)
NMSE_WARN = 1e-2

SHAPES = [
    ('qwen3-30b-a3b', dict(H=2048, I=768, E=128, topk=8)),
    ('deepseek-v3', dict(H=7168, I=2048, E=256, topk=8)),
]
T_CONTIG = [512, 4096, 16384]
T_MASKED = [1, 8, 64, 512]
T_LAYER = [64, 512, 4096, 16384]
DTYPES = ['fp8', 'bf16']


def log(*args):
    print(f'[{time.time() - T_START:7.1f}s]', *args, file=sys.stderr, flush=True)


def emit(shape, dtype, layout, part, tokens, ms, tflops):
    print(f'deepgemm,{shape},{dtype},{layout},{part},{tokens},{ms},{tflops}', flush=True)


def clean(msg):
    return ' '.join(str(msg).replace(',', ';').split())[:240]


def ceil_div(a, b):
    return (a + b - 1) // b


def align(a, b):
    return ceil_div(a, b) * b


def tma_align(mn):
    # get_tma_aligned_size(mn, 4): 16-byte TMA alignment for float32 scales
    return align(mn, 4)


# ----------------------------------------------------------------------------------------------
# Routing and layouts (CPU, deterministic: shared by the run and by the offline JIT prebuild)
# ----------------------------------------------------------------------------------------------
def routing(torch, shape_name, T, E, topk):
    """Random top-k routing: uniform scores, top-k experts per token, renormalized weights."""
    g = torch.Generator().manual_seed(zlib.crc32(f'{shape_name}:{T}'.encode()))
    scores = torch.rand((T, E), generator=g)
    w, ids = scores.topk(topk, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    return ids.to(torch.int32), w.float()


def expert_counts(torch, ids, E):
    return torch.bincount(ids.flatten().long().cpu(), minlength=E)


def contiguous_m(torch, counts):
    return int(((counts + ALIGN_M - 1) // ALIGN_M * ALIGN_M).sum())


def masked_dims(T, E, topk, policy='sglang'):
    """max_m: per-expert capacity of the [E, max_m, K] buffer (DeepEP low-latency style, >= 128).
    expected_m (DeepGEMM's CPU-side hint; it picks the block config):
      sglang: (T * ep_size * topk + E) // E, then min(expected_m, max_m)   (SGLang DeepEP/NIXL
              dispatcher dispatch_a + forward_deepgemm_masked; ep_size = 1 here)
      vllm:   max_num_tokens = max_m   (vLLM BatchedDeepGemmExperts.apply: expected_m = max_num_tokens)"""
    max_m = max(128, align(T, 128))
    if policy == 'vllm':
        return max_m, max_m
    return max_m, max(1, min(max_m, (T * topk + E) // E))


MASKED_POLICY = os.environ.get('DG_MASKED_EXPECTED_M', 'both')   # sglang | vllm | both
MASKED_LAYOUTS = {'sglang': ['masked'], 'vllm': ['masked-vllm'], 'both': ['masked', 'masked-vllm']}[MASKED_POLICY]


def jit_specs(torch):
    """(kind, num_groups, m, n, k, expected_m) of every DeepGEMM call the benchmark makes."""
    specs = []
    for name, s in SHAPES:
        H, I, E, topk = s['H'], s['I'], s['E'], s['topk']
        for T in sorted(set(T_CONTIG) | set(T_LAYER)):
            ids, _ = routing(torch, name, T, E, topk)
            m = contiguous_m(torch, expert_counts(torch, ids, E))
            for dt in DTYPES:
                specs.append((f'{dt}_contig', E, m, 2 * I, H, 0))
                specs.append((f'{dt}_contig', E, m, H, I, 0))
        for T in T_MASKED:
            for policy in ('sglang', 'vllm'):
                max_m, em = masked_dims(T, E, topk, policy)
                for dt in DTYPES:
                    specs.append((f'{dt}_masked', E, max_m, 2 * I, H, em))
                    specs.append((f'{dt}_masked', E, max_m, H, I, em))
    seen, out = set(), []
    for sp in specs:
        if sp not in seen:
            seen.add(sp)
            out.append(sp)
    return out


# ----------------------------------------------------------------------------------------------
# Quantization (simple torch implementations of the Hopper DeepGEMM recipe)
# ----------------------------------------------------------------------------------------------
def mn_major_sf(torch, sf):
    """Return `sf` (..., MN, SK) float32 with DeepGEMM's SM90 SFA layout: MN-major, MN stride
    padded to 4 (TMA 16 B), batch stride = tma_align(MN) * SK. DeepGEMM then uses it as is
    (get_mn_major_tma_aligned_tensor returns early), so no transpose kernel runs in the GEMM call."""
    *lead, mn, sk = sf.shape
    buf = torch.empty((*lead, sk, tma_align(mn)), dtype=torch.float32, device=sf.device)
    out = buf[..., :mn].transpose(-1, -2)
    out.copy_(sf)
    return out


def empty_mn_major_sf(torch, lead, mn, sk, device):
    buf = torch.empty((*lead, sk, tma_align(mn)), dtype=torch.float32, device=device)
    return buf[..., :mn].transpose(-1, -2)


def quant_act_fp8(torch, x, chunk_rows=16384):
    """Per-token-group (1x128) FP8 e4m3 quantization with float32 scales.
    x: (..., M, K) bf16 -> q (..., M, K) e4m3 (contiguous), sf (..., M, K/128) float32 row-major."""
    *lead, M, K = x.shape
    assert K % 128 == 0
    xf = x.reshape(-1, K)
    R = xf.shape[0]
    q = torch.empty((R, K), dtype=torch.float8_e4m3fn, device=x.device)
    sf = torch.empty((R, K // 128), dtype=torch.float32, device=x.device)
    for r0 in range(0, R, chunk_rows):
        xv = xf[r0:r0 + chunk_rows].view(-1, K // 128, 128).float()
        s = xv.abs().amax(dim=-1).clamp_(min=1e-4).div_(448.0)
        q[r0:r0 + chunk_rows] = (xv / s.unsqueeze(-1)).to(torch.float8_e4m3fn).view(-1, K)
        sf[r0:r0 + chunk_rows] = s
    return q.view(*lead, M, K), sf.view(*lead, M, K // 128)


def quant_weight_fp8(torch, w, chunk=8):
    """Per-block (128x128) FP8 e4m3 quantization. w: (E, N, K) bf16 ->
    q (E, N, K) e4m3, sf (E, N/128, K/128) float32 contiguous (DeepGEMM SM90 SFB layout)."""
    E, N, K = w.shape
    assert N % 128 == 0 and K % 128 == 0
    q = torch.empty((E, N, K), dtype=torch.float8_e4m3fn, device=w.device)
    sf = torch.empty((E, N // 128, K // 128), dtype=torch.float32, device=w.device)
    for e0 in range(0, E, chunk):
        wv = w[e0:e0 + chunk].float().view(-1, N // 128, 128, K // 128, 128)
        s = wv.abs().amax(dim=(2, 4)).clamp_(min=1e-4).div_(448.0)
        q[e0:e0 + chunk] = (wv / s[:, :, None, :, None]).to(torch.float8_e4m3fn).view(-1, N, K)
        sf[e0:e0 + chunk] = s
    return q, sf


def deq_act(torch, q, sf):
    M, K = q.shape
    return (q.float().view(M, K // 128, 128) * sf.float().unsqueeze(-1)).view(M, K)


def deq_weight(torch, q, sf):
    N, K = q.shape
    return (q.float().view(N // 128, 128, K // 128, 128) * sf.float()[:, None, :, None]).view(N, K)


def weight_f32(torch, W, e):
    """Dequantized (fp8) or upcast (bf16) weight of expert e, float32 (N, K)."""
    if isinstance(W, tuple):
        return deq_weight(torch, W[0][e], W[1][e])
    return W[e].float()


class NMSE:
    def __init__(self):
        self.err = 0.0
        self.ref = 0.0

    def add(self, torch, out, ref):
        out = out.float()
        self.err += float(((out - ref) ** 2).sum(dtype=torch.float64))
        self.ref += float((ref ** 2).sum(dtype=torch.float64))

    def value(self):
        if not math.isfinite(self.err):
            return float('inf')
        return self.err / max(self.ref, 1e-30)


# ----------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------
class Timer:
    def __init__(self, torch, device):
        self.torch = torch
        self.on_gpu = device != 'cpu'
        self.flush = torch.empty(FLUSH_BYTES if self.on_gpu else 1024, dtype=torch.int8, device=device)

    def run(self, fn, n_inner=0):
        """fn(ev) -> None; ev is None (warm-up) or a list of 2*n_inner events to record around
        inner regions. Returns (median total ms, [median ms of each inner region])."""
        torch = self.torch
        for _ in range(N_WARMUP):
            fn(None)
        if not self.on_gpu:
            t0 = time.perf_counter()
            fn(None)
            return (time.perf_counter() - t0) * 1e3, [float('nan')] * n_inner
        torch.cuda.synchronize()
        mk = lambda: torch.cuda.Event(enable_timing=True)
        starts, ends = [mk() for _ in range(N_ITERS)], [mk() for _ in range(N_ITERS)]
        inner = [[mk() for _ in range(2 * n_inner)] for _ in range(N_ITERS)]
        for i in range(N_ITERS):
            self.flush.zero_()  # 256 MiB write: L2 (50 MB on H200) holds none of the operands
            starts[i].record()
            fn(inner[i] if n_inner else None)
            ends[i].record()
        torch.cuda.synchronize()
        total = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))
        inner_ms = [statistics.median(inner[i][2 * j].elapsed_time(inner[i][2 * j + 1]) for i in range(N_ITERS))
                    for j in range(n_inner)]
        return total, inner_ms


# ----------------------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------------------
class Ctx:
    def __init__(self, torch, dg, device, shapes, timer, seen_specs):
        self.torch, self.dg, self.device, self.shapes, self.timer = torch, dg, device, shapes, timer
        self.seen_specs = seen_specs


def make_weights(ctx, s, dtype):
    """Gate/up (E, 2I, H) and down (E, H, I) expert weights, ~N(0, 1/K); fp8: (q, sf) tuples."""
    torch = ctx.torch
    E, H, I = s['E'], s['H'], s['I']
    out = {}
    for key, (N, K) in (('w13', (2 * I, H)), ('w2', (H, I))):
        w = torch.randn((E, N, K), dtype=torch.bfloat16, device=ctx.device).mul_(K ** -0.5)
        out[key] = quant_weight_fp8(torch, w) if dtype == 'fp8' else w
    return out


def dg_contig(ctx, dtype, a, W, d, m_indices):
    dg = ctx.dg
    G, N, K = (W[0] if isinstance(W, tuple) else W).shape
    ctx.seen_specs.add((f'{dtype}_contig', G, d.shape[0], N, K, 0))
    if dtype == 'fp8':
        dg.m_grouped_fp8_gemm_nt_contiguous(a, W, d, m_indices, disable_ue8m0_cast=True)
    else:
        dg.m_grouped_bf16_gemm_nt_contiguous(a, W, d, m_indices)


def dg_masked(ctx, dtype, a, W, d, masked_m, expected_m):
    dg = ctx.dg
    G, N, K = (W[0] if isinstance(W, tuple) else W).shape
    ctx.seen_specs.add((f'{dtype}_masked', G, d.shape[1], N, K, expected_m))
    if dtype == 'fp8':
        dg.m_grouped_fp8_gemm_nt_masked(a, W, d, masked_m, expected_m, disable_ue8m0_cast=True)
    else:
        dg.m_grouped_bf16_gemm_nt_masked(a, W, d, masked_m, expected_m)


def contiguous_layout(torch, counts, device):
    """m_indices (M,) int32: expert id for real rows, -1 for the padding of each expert to 128."""
    E = counts.numel()
    padded = (counts + ALIGN_M - 1) // ALIGN_M * ALIGN_M
    M = int(padded.sum())
    e_of_row = torch.repeat_interleave(torch.arange(E), padded)
    start = torch.cumsum(padded, 0) - padded
    rank = torch.arange(M) - start[e_of_row]
    m_indices = torch.where(rank < counts[e_of_row], e_of_row, torch.full_like(e_of_row, -1))
    return m_indices.to(torch.int32).to(device), start, M


def case_contiguous(ctx, name, s, W, dtype, T):
    torch, dev = ctx.torch, ctx.device
    E, topk = s['E'], s['topk']
    ids, _ = routing(torch, name, T, E, topk)
    counts = expert_counts(torch, ids, E)
    m_indices, start, M = contiguous_layout(torch, counts, dev)
    real_rows = T * topk
    log(f'  contiguous {name} {dtype} T={T}: m={M} (real {real_rows}, padding {M - real_rows})')
    rows = []
    for part, key in (('gateup', 'w13'), ('down', 'w2')):
        Wk = W[key]
        G, N, K = (Wk[0] if isinstance(Wk, tuple) else Wk).shape
        torch.manual_seed(1000 + T)
        a = torch.randn((M, K), dtype=torch.bfloat16, device=dev)
        a[m_indices < 0] = 0
        if dtype == 'fp8':
            aq, asf = quant_act_fp8(torch, a)
            A = (aq, mn_major_sf(torch, asf))
        else:
            A = a
        d = torch.empty((M, N), dtype=torch.bfloat16, device=dev)
        t0 = time.time()
        dg_contig(ctx, dtype, A, Wk, d, m_indices)
        if dev != 'cpu':
            torch.cuda.synchronize()
        log(f'    {part}: first call (JIT compile or cache load) {time.time() - t0:.2f}s')
        # correctness: float32 reference on the dequantized inputs, real rows only
        err = NMSE()
        cnt = counts.tolist()
        for e in range(E):
            if cnt[e] == 0:
                continue
            r0, r1 = int(start[e]), int(start[e]) + cnt[e]
            a_e = deq_act(torch, aq[r0:r1], asf[r0:r1]) if dtype == 'fp8' else a[r0:r1].float()
            err.add(torch, d[r0:r1], a_e @ weight_f32(torch, Wk, e).t())
        ms, _ = ctx.timer.run(lambda ev: dg_contig(ctx, dtype, A, Wk, d, m_indices))
        tflops = 2.0 * real_rows * N * K / (ms * 1e-3) / 1e12
        rows.append((part, ms, tflops, err.value()))
        a = A = d = None  # free before the next GEMM of the case
    return rows


def case_masked(ctx, name, s, W, dtype, T, policy='sglang'):
    torch, dev = ctx.torch, ctx.device
    E, topk = s['E'], s['topk']
    ids, _ = routing(torch, name, T, E, topk)
    counts = expert_counts(torch, ids, E)
    max_m, expected_m = masked_dims(T, E, topk, policy)
    masked_m = counts.to(torch.int32).to(dev)
    valid = (torch.arange(max_m)[None, :] < counts[:, None]).to(dev)  # (E, max_m)
    real_rows = T * topk
    log(f'  masked ({policy} expected_m) {name} {dtype} T={T}: max_m={max_m} expected_m={expected_m} '
        f'max_count={int(counts.max())}')
    rows = []
    for part, key in (('gateup', 'w13'), ('down', 'w2')):
        Wk = W[key]
        G, N, K = (Wk[0] if isinstance(Wk, tuple) else Wk).shape
        torch.manual_seed(2000 + T)
        a = torch.randn((E, max_m, K), dtype=torch.bfloat16, device=dev)
        a[~valid] = 0
        if dtype == 'fp8':
            aq, asf = quant_act_fp8(torch, a)
            A = (aq, mn_major_sf(torch, asf))
        else:
            A = a
        d = torch.empty((E, max_m, N), dtype=torch.bfloat16, device=dev)
        t0 = time.time()
        dg_masked(ctx, dtype, A, Wk, d, masked_m, expected_m)
        if dev != 'cpu':
            torch.cuda.synchronize()
        log(f'    {part}: first call (JIT compile or cache load) {time.time() - t0:.2f}s')
        err = NMSE()
        cnt = counts.tolist()
        for e in range(E):
            if cnt[e] == 0:
                continue
            a_e = deq_act(torch, aq[e, :cnt[e]], asf[e, :cnt[e]]) if dtype == 'fp8' else a[e, :cnt[e]].float()
            err.add(torch, d[e, :cnt[e]], a_e @ weight_f32(torch, Wk, e).t())
        ms, _ = ctx.timer.run(lambda ev: dg_masked(ctx, dtype, A, Wk, d, masked_m, expected_m))
        tflops = 2.0 * real_rows * N * K / (ms * 1e-3) / 1e12
        rows.append((part, ms, tflops, err.value()))
        a = A = d = None  # free before the next GEMM of the case
    return rows


def moe_layer(ctx, dtype, x, ids, topk_w, W, E, I, ev=None):
    """One MoE expert layer (router excluded) with torch glue around the two DeepGEMM GEMMs:
    sort tokens by expert, pad each expert to 128 rows, [FP8: per-token-group quant of x before
    the permutation, as vLLM], gate/up GEMM, SiLU(gate)*up, [FP8: second quant], down GEMM,
    weighted sum back to tokens. One host sync (expert counts -> M) sizes the buffers."""
    torch, dev = ctx.torch, x.device
    T, H = x.shape
    topk = ids.shape[1]
    flat = ids.reshape(-1)
    sorted_e, order = torch.sort(flat, stable=True)
    counts = torch.bincount(flat, minlength=E)
    padded = (counts + ALIGN_M - 1) // ALIGN_M * ALIGN_M
    M = int(padded.sum().item())                         # host sync
    pstart = torch.cumsum(padded, 0) - padded
    start = torch.cumsum(counts, 0) - counts
    se = sorted_e.long()
    dest = pstart[se] + (torch.arange(T * topk, device=dev) - start[se])   # row of each sorted (token, k)
    tok = order // topk
    m_indices = torch.full((M,), -1, dtype=torch.int32, device=dev)
    m_indices[dest] = sorted_e.to(torch.int32)
    if dtype == 'fp8':
        xq, xs = quant_act_fp8(torch, x)
        a = torch.empty((M, H), dtype=torch.float8_e4m3fn, device=dev)
        a.view(torch.uint8)[dest] = xq.view(torch.uint8)[tok]
        sfa = empty_mn_major_sf(torch, (), M, H // 128, dev)
        sfa[dest] = xs[tok]
        A = (a, sfa)
    else:
        a = torch.empty((M, H), dtype=torch.bfloat16, device=dev)
        a[dest] = x[tok]
        A = a
    h = torch.empty((M, 2 * I), dtype=torch.bfloat16, device=dev)
    if ev is not None:
        ev[0].record()
    dg_contig(ctx, dtype, A, W['w13'], h, m_indices)
    if ev is not None:
        ev[1].record()
    act = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
    if dtype == 'fp8':
        q2, s2 = quant_act_fp8(torch, act)
        A2 = (q2, mn_major_sf(torch, s2))
    else:
        A2 = act
    o = torch.empty((M, H), dtype=torch.bfloat16, device=dev)
    if ev is not None:
        ev[2].record()
    dg_contig(ctx, dtype, A2, W['w2'], o, m_indices)
    if ev is not None:
        ev[3].record()
    row_of = torch.empty(T * topk, dtype=torch.long, device=dev)
    row_of[order] = dest
    # weighted sum over the top-k copies: (T, 1, topk) @ (T, topk, H), bf16 in, fp32 accumulation
    y = torch.bmm(topk_w.to(torch.bfloat16).unsqueeze(1), o[row_of].view(T, topk, H)).squeeze(1)
    return y


def layer_reference(ctx, dtype, x, ids, topk_w, W, E, I):
    """float32 reference on the dequantized inputs (no second quantization), token-wise per expert."""
    torch = ctx.torch
    T, H = x.shape
    if dtype == 'fp8':
        xq, xs = quant_act_fp8(torch, x)
        xf = deq_act(torch, xq, xs)
    else:
        xf = x.float()
    y = torch.zeros((T, H), dtype=torch.float32, device=x.device)
    idl = ids.long()
    for e in range(E):
        t_idx, k_idx = (idl == e).nonzero(as_tuple=True)
        if t_idx.numel() == 0:
            continue
        hh = xf[t_idx] @ weight_f32(torch, W['w13'], e).t()
        act = torch.nn.functional.silu(hh[:, :I]) * hh[:, I:]
        oo = act @ weight_f32(torch, W['w2'], e).t()
        y.index_add_(0, t_idx, oo * topk_w[t_idx, k_idx].unsqueeze(-1))
    return y


def case_layer(ctx, name, s, W, dtype, T):
    torch, dev = ctx.torch, ctx.device
    E, H, I, topk = s['E'], s['H'], s['I'], s['topk']
    ids, topk_w = routing(torch, name, T, E, topk)
    ids, topk_w = ids.to(dev), topk_w.to(dev)
    torch.manual_seed(3000 + T)
    x = torch.randn((T, H), dtype=torch.bfloat16, device=dev)
    log(f'  layer {name} {dtype} T={T}: m={contiguous_m(torch, expert_counts(torch, ids, E))}')
    t0 = time.time()
    y = moe_layer(ctx, dtype, x, ids, topk_w, W, E, I)
    if dev != 'cpu':
        torch.cuda.synchronize()
    log(f'    first call {time.time() - t0:.2f}s')
    err = NMSE()
    err.add(torch, y, layer_reference(ctx, dtype, x, ids, topk_w, W, E, I))
    ms, (g1, g2) = ctx.timer.run(lambda ev: moe_layer(ctx, dtype, x, ids, topk_w, W, E, I, ev), n_inner=2)
    rr = T * topk
    f1, f2 = 2.0 * rr * 2 * I * H, 2.0 * rr * H * I
    tf = lambda f, t: f / (t * 1e-3) / 1e12
    nm = err.value()
    return [('gateup', g1, tf(f1, g1), nm), ('down', g2, tf(f2, g2), nm), ('layer', ms, tf(f1 + f2, ms), nm)]


def run_all(ctx, t_contig=T_CONTIG, t_masked=T_MASKED, t_layer=T_LAYER, dtypes=DTYPES, masked_layouts=None):
    torch = ctx.torch
    n_bad = 0
    for name, s in ctx.shapes:
        for dtype in dtypes:
            plan = ([('contiguous', T) for T in t_contig] +
                    [(ml, T) for ml in (masked_layouts or MASKED_LAYOUTS) for T in t_masked] +
                    [('layer', T) for T in t_layer])
            W = None
            try:
                if time.time() - T_START < BUDGET_S:
                    t0 = time.time()
                    W = make_weights(ctx, s, dtype)
                    log(f'{name} {dtype}: weights ready in {time.time() - t0:.1f}s')
            except Exception as e:
                log(f'{name} {dtype}: weight setup failed: {e!r}')
                traceback.print_exc(file=sys.stderr)
                for layout, T in plan:
                    for part in (('gateup', 'down', 'layer') if layout == 'layer' else ('gateup', 'down')):
                        emit(name, dtype, layout, part, T, 'ERROR', clean(f'weights: {e!r}'))
                n_bad += 1
                continue
            for layout, T in plan:
                parts = ('gateup', 'down', 'layer') if layout == 'layer' else ('gateup', 'down')
                if W is None or time.time() - T_START > BUDGET_S:
                    for part in parts:
                        emit(name, dtype, layout, part, T, 'SKIP', 'budget')
                    continue
                try:
                    if layout == 'contiguous':
                        rows = case_contiguous(ctx, name, s, W, dtype, T)
                    elif layout == 'layer':
                        rows = case_layer(ctx, name, s, W, dtype, T)
                    else:
                        rows = case_masked(ctx, name, s, W, dtype, T, 'vllm' if layout == 'masked-vllm' else 'sglang')
                    for part, ms, tflops, nm in rows:
                        log(f'    RESULT {name} {dtype} {layout} {part} T={T}: {ms:.4f} ms {tflops:.1f} TFLOP/s NMSE={nm:.3e}')
                    for part, ms, tflops, nm in rows:
                        emit(name, dtype, layout, part, T, f'{ms:.5f}', f'{tflops:.2f}')
                    for part, ms, tflops, nm in rows:
                        if layout == 'layer' and part != 'layer':
                            continue  # one NMSE for the whole layer (its output)
                        if not (nm <= NMSE_WARN):
                            emit(name, dtype, layout, part, T, 'WARN', f'nmse={nm:.3e}')
                            n_bad += 1
                except Exception as e:
                    n_bad += 1
                    log(f'  ERROR {name} {dtype} {layout} T={T}: {e!r}')
                    traceback.print_exc(file=sys.stderr)
                    for part in parts:
                        emit(name, dtype, layout, part, T, 'ERROR', clean(repr(e)))
                finally:
                    if ctx.device != 'cpu':
                        try:
                            torch.cuda.synchronize()
                            torch.cuda.empty_cache()
                        except Exception as e:
                            log(f'  CUDA state after the case: {e!r}')
            del W
            if ctx.device != 'cpu':
                try:
                    torch.cuda.empty_cache()
                except Exception:
                    pass
    return n_bad


# ----------------------------------------------------------------------------------------------
# Setup on the GPU machine
# ----------------------------------------------------------------------------------------------
def extract(tar, dest):
    with tarfile.open(tar) as tf:
        try:
            tf.extractall(dest, filter='data')
        except TypeError:  # Python without tarfile extraction filters
            tf.extractall(dest)


def unpack_payload():
    pkg = os.path.join(PAYLOAD, 'deepgemm-pkg.tar.xz')
    cache = os.path.join(PAYLOAD, 'jit-cache.tar.xz')
    if not os.path.exists(pkg):
        raise FileNotFoundError(f'{pkg} missing (set DG_PAYLOAD_DIR; see dev/peer/README.md)')
    st = os.stat(pkg)
    stamp = os.path.join(RUN_DIR, f'.unpacked-{st.st_size}')
    os.makedirs(RUN_DIR, exist_ok=True)
    if not os.path.exists(stamp) or not os.path.exists(os.path.join(RUN_DIR, 'deep_gemm', '__init__.py')):
        shutil.rmtree(os.path.join(RUN_DIR, 'deep_gemm'), ignore_errors=True)
        t0 = time.time()
        extract(pkg, RUN_DIR)
        open(stamp, 'w').close()
        log(f'unpacked {pkg} -> {RUN_DIR}/deep_gemm in {time.time() - t0:.1f}s')
    jit_dir = os.environ.setdefault('DG_JIT_CACHE_DIR', os.path.join(RUN_DIR, 'jit-cache'))
    if os.path.exists(cache) and not os.path.isdir(os.path.join(jit_dir, 'cache')):
        os.makedirs(jit_dir, exist_ok=True)
        extract(cache, jit_dir)
        log(f'unpacked prebuilt JIT cache -> {jit_dir}')
    return jit_dir


def find_nvcc():
    cands = [os.environ.get('DG_JIT_NVCC_COMPILER'),
             os.path.join(os.environ['CUDA_HOME'], 'bin', 'nvcc') if os.environ.get('CUDA_HOME') else None,
             shutil.which('nvcc'), '/usr/local/cuda/bin/nvcc']
    cands += sorted(glob.glob('/usr/local/cuda-*/bin/nvcc'), reverse=True)
    for c in cands:
        if c and os.path.exists(c):
            return c
    return None


def preload_cuda_libs(torch):
    """_C.so needs libcudart.so.13 and libnvrtc.so.13 (NEEDED, no RPATH): load them globally from
    the default search path, torch's nvidia wheels or the toolkit, so the dlopen of _C resolves."""
    tdir = os.path.dirname(torch.__file__)
    dirs = [os.path.join(tdir, '..', 'nvidia', 'cu13', 'lib'), os.path.join(tdir, '..', 'nvidia', 'cuda_nvrtc', 'lib'),
            os.path.join(tdir, '..', 'nvidia', 'cuda_runtime', 'lib'), os.path.join(tdir, 'lib')]
    ch = os.environ.get('CUDA_HOME', '/usr/local/cuda')
    dirs += [os.path.join(ch, 'lib64'), os.path.join(ch, 'lib'), os.path.join(ch, 'targets', 'x86_64-linux', 'lib')]
    for so in ('libcudart.so.13', 'libnvrtc.so.13'):
        try:
            ctypes.CDLL(so, mode=ctypes.RTLD_GLOBAL)
            continue
        except OSError:
            pass
        for d in dirs:
            p = os.path.join(d, so)
            if os.path.exists(p):
                try:
                    ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
                    log(f'preloaded {p}')
                    break
                except OSError as e:
                    log(f'could not preload {p}: {e}')


def import_deep_gemm(torch):
    nvcc = find_nvcc()
    if nvcc:
        os.environ.setdefault('CUDA_HOME', os.path.dirname(os.path.dirname(nvcc)))
        if os.path.dirname(os.path.dirname(nvcc)) != os.environ['CUDA_HOME']:
            os.environ.setdefault('DG_JIT_NVCC_COMPILER', nvcc)
    else:
        log('WARNING: no nvcc found; falling back to NVRTC (DG_JIT_USE_NVRTC=1): prebuilt NVCC cache unused')
        os.environ.setdefault('DG_JIT_USE_NVRTC', '1')
    preload_cuda_libs(torch)
    sys.path.insert(0, RUN_DIR)
    import deep_gemm
    return deep_gemm, nvcc


def count_cache(jit_dir):
    return len(glob.glob(os.path.join(jit_dir, 'cache', 'kernel.*')))


def gpu_main():
    import torch
    print('peer,shape,dtype,layout,part,tokens,ms,tflops', flush=True)
    log(f'python {sys.version.split()[0]}  torch {torch.__version__} (CUDA {torch.version.cuda})  budget {BUDGET_S:.0f}s')
    try:
        jit_dir = unpack_payload()
        dg, nvcc = import_deep_gemm(torch)
        info = {}
        bi = os.path.join(PAYLOAD, 'BUILD_INFO.json')
        if os.path.exists(bi):
            info = json.load(open(bi))
        log(f'deep_gemm {dg.__version__} from {dg.__file__}; commit {info.get("deepgemm_commit", "?")} '
            f'(cutlass {info.get("cutlass_commit", "?")}, fmt {info.get("fmt_commit", "?")})')
        log(f'nvcc {nvcc}; CUDA_HOME={os.environ.get("CUDA_HOME")}; DG_JIT_CACHE_DIR={jit_dir} '
            f'({count_cache(jit_dir)} cached kernels)')
        if nvcc:
            os.system(f'{nvcc} --version 1>&2')
        if not torch.cuda.is_available():
            raise RuntimeError('no CUDA device visible')
        p = torch.cuda.get_device_properties(0)
        log(f'GPU {p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB; '
            f'deep_gemm.get_num_sms()={dg.get_num_sms()} mk_alignment={dg.get_mk_alignment_for_contiguous_layout()}')
        if (p.major, p.minor) != (9, 0):
            log('WARNING: not an SM90 device; this benchmark targets the Hopper recipe')
    except Exception as e:
        log(f'setup failed: {e!r}')
        traceback.print_exc(file=sys.stderr)
        for name, _ in SHAPES:
            for dtype in DTYPES:
                emit(name, dtype, 'all', 'all', 0, 'ERROR', clean(f'setup: {e!r}'))
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False     # float32 references in IEEE fp32
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision('highest')
    seen = set()
    ctx = Ctx(torch, dg, 'cuda', SHAPES, Timer(torch, 'cuda'), seen)
    n0 = count_cache(jit_dir)
    n_bad = run_all(ctx)
    specs = set(jit_specs(torch))
    log(f'done in {time.time() - T_START:.0f}s; {n_bad} warning/error cases; JIT cache {n0} -> {count_cache(jit_dir)} '
        f'kernels ({count_cache(jit_dir) - n0} compiled here); calls outside the prebuild list: {sorted(seen - specs)}')
    return 0


# ----------------------------------------------------------------------------------------------
# CPU self-test: glue + references with a torch stand-in that follows DeepGEMM's semantics/layouts
# ----------------------------------------------------------------------------------------------
class TorchDeepGemmStandIn:
    """m-grouped GEMMs in torch with DeepGEMM's argument conventions, asserting its SM90 layout rules."""

    def __init__(self, torch):
        self.torch = torch

    def _check_sfa(self, sf, mn, k, groups=None):
        assert sf.dtype == self.torch.float32 and sf.shape[-2:] == (mn, k // 128), sf.shape
        assert sf.stride(-2) == 1 and sf.stride(-1) == tma_align(mn), sf.stride()
        if groups is not None:
            assert sf.stride(0) == tma_align(mn) * (k // 128)

    def _check_sfb(self, sf, g, n, k):
        assert sf.dtype == self.torch.float32 and tuple(sf.shape) == (g, n // 128, k // 128) and sf.is_contiguous()

    def m_grouped_fp8_gemm_nt_contiguous(self, a, b, d, m_indices, disable_ue8m0_cast=False):
        torch = self.torch
        (aq, sfa), (bq, sfb) = a, b
        M, K = aq.shape
        G, N, _ = bq.shape
        self._check_sfa(sfa, M, K)
        self._check_sfb(sfb, G, N, K)
        assert M % ALIGN_M == 0 and m_indices.shape == (M,) and m_indices.dtype == torch.int32
        af = deq_act(torch, aq, sfa)
        for e in m_indices[m_indices >= 0].unique().tolist():
            r = (m_indices == e).nonzero().squeeze(1)
            d[r] = (af[r] @ deq_weight(torch, bq[e], sfb[e]).t()).to(d.dtype)

    def m_grouped_bf16_gemm_nt_contiguous(self, a, b, d, m_indices):
        torch = self.torch
        assert a.dtype == b.dtype == torch.bfloat16 and a.shape[0] % ALIGN_M == 0
        for e in m_indices[m_indices >= 0].unique().tolist():
            r = (m_indices == e).nonzero().squeeze(1)
            d[r] = (a[r].float() @ b[e].float().t()).to(d.dtype)

    def m_grouped_fp8_gemm_nt_masked(self, a, b, d, masked_m, expected_m, disable_ue8m0_cast=False):
        torch = self.torch
        (aq, sfa), (bq, sfb) = a, b
        G, Mx, K = aq.shape
        self._check_sfa(sfa, Mx, K, groups=G)
        self._check_sfb(sfb, G, bq.shape[1], K)
        assert expected_m > 0 and masked_m.dtype == torch.int32
        for e in range(G):
            c = int(masked_m[e])
            if c:
                d[e, :c] = (deq_act(torch, aq[e, :c], sfa[e, :c]) @ deq_weight(torch, bq[e], sfb[e]).t()).to(d.dtype)

    def m_grouped_bf16_gemm_nt_masked(self, a, b, d, masked_m, expected_m):
        for e in range(a.shape[0]):
            c = int(masked_m[e])
            if c:
                d[e, :c] = (a[e, :c].float() @ b[e].float().t()).to(d.dtype)


def selftest_cpu():
    import torch
    torch.manual_seed(0)
    shapes = [('tiny-a', dict(H=256, I=128, E=8, topk=2)), ('tiny-b', dict(H=384, I=256, E=6, topk=3))]
    ctx = Ctx(torch, TorchDeepGemmStandIn(torch), 'cpu', shapes, Timer(torch, 'cpu'), set())
    print('peer,shape,dtype,layout,part,tokens,ms,tflops', flush=True)
    n_bad = run_all(ctx, t_contig=[5, 40], t_masked=[1, 7], t_layer=[3, 33], masked_layouts=['masked', 'masked-vllm'])
    # extra: an independent check of the quantizers against exact values
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    q, s = quant_act_fp8(torch, x)
    nm = NMSE(); nm.add(torch, deq_act(torch, q, s), x.float())
    w = torch.randn(2, 256, 384, dtype=torch.bfloat16)
    wq, ws = quant_weight_fp8(torch, w)
    nw = NMSE(); nw.add(torch, deq_weight(torch, wq[1], ws[1]), w[1].float())
    log(f'quantizer NMSE: act {nm.value():.2e} weight {nw.value():.2e} (fp8 e4m3 ~1e-3 expected)')
    assert nm.value() < 3e-3 and nw.value() < 3e-3
    sf = mn_major_sf(torch, torch.rand(3, 10, 4))
    assert sf.stride() == (48, 1, 12), sf.stride()
    # negative control: a GEMM that misreads the SFA layout (row-major instead of MN-major) must be flagged
    class BrokenSFA(TorchDeepGemmStandIn):
        def _check_sfa(self, *args, **kwargs):
            pass

        def m_grouped_fp8_gemm_nt_contiguous(self, a, b, d, m_indices, disable_ue8m0_cast=False):
            (aq, sfa), bb = a, b
            wrong = torch.as_strided(sfa, sfa.shape, (sfa.shape[1], 1))  # reinterpret the storage row-major
            super().m_grouped_fp8_gemm_nt_contiguous((aq, wrong), bb, d, m_indices)
    bad = Ctx(torch, BrokenSFA(torch), 'cpu', shapes, Timer(torch, 'cpu'), set())
    W = make_weights(bad, shapes[0][1], 'fp8')
    worst = max(r[3] for r in case_contiguous(bad, shapes[0][0], shapes[0][1], W, 'fp8', 40))
    log(f'negative control (misread SFA layout): NMSE {worst:.2e} (must exceed {NMSE_WARN})')
    assert worst > NMSE_WARN
    log(f'self-test: {n_bad} warning/error cases')
    return 1 if n_bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--list-jit-specs', action='store_true', help='print the DeepGEMM call shapes as JSON and exit')
    ap.add_argument('--selftest-cpu', action='store_true', help='CPU check of glue/reference math (tiny sizes)')
    args = ap.parse_args()
    if args.list_jit_specs:
        import torch
        print(json.dumps(jit_specs(torch)))
        return 0
    if args.selftest_cpu:
        return selftest_cpu()
    return gpu_main()


if __name__ == '__main__':
    sys.exit(main())
