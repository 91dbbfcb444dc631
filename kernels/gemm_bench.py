"""The GEMMs of a decode step at batch M, each against the best this GPU gives: is the 8B step's 1.25x-of-floor target
within reach of any GEMM we could call?

    python kernels/gemm_bench.py --shape llama-3.1-8b --m 256 [--inductor] [--out FILE]   # default: kernels/results/gemm/<machine>/gemm_<shape>.json

For each projection of the shape (qkv, o, gate_up, down, lm head; the engine's stacked weights, (N, K) bf16 as
nn.Linear keeps them), at M rows:
- `linear`: F.linear(x, W), what the engine calls (cuBLAS's heuristic pick);
- `linear_t`: x @ W^T with W^T stored (K, N) contiguous (the other cuBLAS layout);
- `lt_pref`: F.linear with torch's preferred BLAS set to cublasLt;
- `triton`: a plain Triton GEMM (grouped tile order) autotuned over tiles, stages and warps;
- `inductor` (with --inductor): torch.compile max-autotune's pick (ATen and Triton templates, persistent TMA ones
  included), its autotune table in inductor.log next to the JSON.
Each is timed as CUDA-graph replays (triton.testing.do_bench_cudagraph, median: no host launch time, as in the
engine's decode graphs; the script's first version timed Python launch loops, and the Triton and inductor calls,
~65 us of host time each, hid the small GEMMs' GPU time) over enough weight copies that none sits in L2, and given as
TFLOP/s, as a share of the measured dense bf16 ceiling (a large square cuBLAS GEMM timed the same way) and of the
weight bytes over the measured copy bandwidth. Each output must match `linear`'s within ~8 bf16 ulps of the largest output; a variant that fails (a wrong
result, a capture or compile error) gets an error row and the run goes on.
"""
import argparse, gc, json, math, os, sys
from pathlib import Path

import torch, torch.nn.functional as F
import triton, triton.language as tl
from triton.testing import do_bench_cudagraph

from paged_infer.bench.workloads import SHAPES


def projections(shape: str) -> dict:
    "name -> (N, K) of each GEMM a decode step runs for `shape` (per layer, and the LM head once)."
    c = SHAPES[shape]; h, i, v = c['hidden_size'], c['intermediate_size'], c['vocab_size']
    nq, nkv = c['num_attention_heads'], c['num_key_value_heads']; d = c.get('head_dim', h // nq)
    return dict(qkv=((nq + 2 * nkv) * d, h), o=(h, nq * d), gate_up=(2 * i, h), down=(h, i), lm_head=(v, h))


def _configs():
    cs = []
    for bm in (64, 128):
        for bn in (64, 128, 256):
            for bk, stages in ((64, 3), (64, 4), (64, 5), (128, 3)):
                for warps in (4, 8):
                    if (bm * bk + bk * bn) * 2 * stages > 200 * 1024 or (bm == 64 and bn == 256 and warps == 4): continue
                    cs.append(triton.Config(dict(BM=bm, BN=bn, BK=bk, GROUP_M=8), num_stages=stages, num_warps=warps))
    return cs


@triton.autotune(configs=_configs(), key=['M', 'N', 'K'])
@triton.jit
def _mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbn, sbk, scm, scn,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    gm = min(num_m - first_m, GROUP_M)
    pm = first_m + (pid % group) % gm
    pn = (pid % group) // gm
    rm, rn, rk = pm * BM + tl.arange(0, BM), pn * BN + tl.arange(0, BN), tl.arange(0, BK)
    a = a_ptr + rm[:, None] * sam + rk[None, :] * sak
    b = b_ptr + rk[:, None] * sbk + rn[None, :] * sbn  # W is (N, K): the (BK, BN) tile read K-major
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        left = K - k * BK
        acc += tl.dot(tl.load(a, mask=(rm[:, None] < M) & (rk[None, :] < left), other=0.0),
                      tl.load(b, mask=(rk[:, None] < left) & (rn[None, :] < N), other=0.0))
        a += BK * sak; b += BK * sbk
    c = c_ptr + rm[:, None] * scm + rn[None, :] * scn
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def triton_linear(x, w):
    M, K = x.shape; N = w.shape[0]
    out = torch.empty(M, N, device=x.device, dtype=x.dtype)
    grid = lambda meta: (triton.cdiv(M, meta['BM']) * triton.cdiv(N, meta['BN']),)
    _mm_kernel[grid](x, w, out, M, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1), out.stride(0), out.stride(1))
    return out


def timed(fn, copies, rep=300):
    "Median ms of one call, replayed in a CUDA graph, the weight copies taken in turn (so no call finds its weights in L2)."
    def run():
        for c in copies: fn(c)
    gc.collect(); gc.disable()  # no collection (which may unload a Triton module) while a graph is being captured
    try: return do_bench_cudagraph(run, rep=rep, return_mode='median') / len(copies)
    finally: gc.enable()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--shape', default='llama-3.1-8b'); p.add_argument('--m', type=int, nargs='+', default=[256])
    p.add_argument('--only', default=None, help='comma-separated projections (default: all)')
    p.add_argument('--inductor', action='store_true'); p.add_argument('--out', default=None, help='JSON file (default: kernels/results/gemm/<machine>/gemm_<shape>.json)')
    a = p.parse_args()
    if a.out is None:
        from lab import default_out
        a.out = default_out('gemm') / f'gemm_{a.shape}.json'
    out = Path(a.out); out.parent.mkdir(parents=True, exist_ok=True)
    dev, dt = 'cuda', torch.bfloat16
    torch.manual_seed(0)
    # ceilings, measured here: dense bf16 (a large square GEMM) and copy bandwidth (read + write of 2 GiB)
    big = torch.randn(8192, 8192, device=dev, dtype=dt)
    peak = 2 * 8192 ** 3 / (do_bench_cudagraph(lambda: big @ big, rep=500, return_mode='median') * 1e-3)
    src = torch.empty(2 ** 30, device=dev, dtype=dt); dst = torch.empty_like(src)
    bw = 2 * src.numel() * 2 / (do_bench_cudagraph(lambda: dst.copy_(src), rep=300, return_mode='median') * 1e-3)
    del big, src, dst
    res = dict(shape=a.shape, gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               peak_bf16_tflops=peak / 1e12, copy_bw_tbs=bw / 1e12, rows=[])
    print(f'measured: dense bf16 {peak / 1e12:.0f} TFLOP/s, copy {bw / 1e12:.2f} TB/s', flush=True)
    names = a.only.split(',') if a.only else list(projections(a.shape))
    variants = ['linear', 'linear_t', 'lt_pref', 'triton'] + (['inductor'] if a.inductor else [])
    if a.inductor:
        import torch._inductor.config as ic
        ic.max_autotune_gemm_backends = 'ATEN,TRITON'
        ic.triton.enable_persistent_tma_matmul = True
    for M in a.m:
        for name in names:
            N, K = projections(a.shape)[name]
            nbytes = N * K * 2
            ncopy = max(2, math.ceil(400e6 / nbytes))
            ws = [torch.randn(N, K, device=dev, dtype=dt) * K ** -0.5 for _ in range(ncopy)]
            wts = [w.t().contiguous() for w in ws]
            x = torch.randn(M, K, device=dev, dtype=dt)
            ref = F.linear(x, ws[0]).float()
            fns = dict(linear=(lambda w: F.linear(x, w), ws), linear_t=(lambda wt: x @ wt, wts),
                       lt_pref=(lambda w: F.linear(x, w), ws), triton=(lambda w: triton_linear(x, w), ws))
            if a.inductor:  # a fresh compile per shape (dynamo's recompile limit would fall back to eager after 8)
                torch._dynamo.reset(); gc.collect()
                compiled = torch.compile(lambda x, w: F.linear(x, w), mode='max-autotune-no-cudagraphs', dynamic=False)
                fns['inductor'] = (lambda w: compiled(x, w), ws)
            flops = 2 * M * N * K
            for v in variants:
                fn, copies = fns[v]
                blas = torch.backends.cuda.preferred_blas_library()
                if v == 'lt_pref': torch.backends.cuda.preferred_blas_library('cublaslt')
                try:
                    err = (fn(copies[0]).float() - ref).abs().max().item()
                    if err > 2 ** -5 * ref.abs().max().item():  # ~8 bf16 ulps of the largest output: a wrong result, not rounding
                        raise ValueError(f'max error {err:.3g} against F.linear')
                    ms = timed(fn, copies)
                except Exception as e:  # one variant failing (capture, compile, a wrong result) costs its row, not the call
                    res['rows'].append(dict(m=M, proj=name, n=N, k=K, variant=v, error=f'{type(e).__name__}: {e}'[:500]))
                    print(f'M={M:4d} {name:8s} {v:9s} FAILED: {res["rows"][-1]["error"]}', flush=True)
                    continue
                finally: torch.backends.cuda.preferred_blas_library(blas)
                row = dict(m=M, proj=name, n=N, k=K, variant=v, ms=ms, tflops=flops / ms / 1e9, max_abs_err=err,
                           of_peak=flops / (ms * 1e-3) / peak, of_bw=nbytes / (ms * 1e-3) / bw)
                if v == 'triton': row['config'] = str(_mm_kernel.best_config)
                res['rows'].append(row)
                print(f"M={M:4d} {name:8s} N={N:6d} K={K:5d} {v:9s} {ms * 1e3:8.1f} us {row['tflops']:6.0f} TFLOP/s "
                      f"{row['of_peak']:5.0%} of peak {row['of_bw']:5.0%} of bw  err {err:.2e} {row.get('config', '')}", flush=True)
                out.write_text(json.dumps(res, indent=1))
            del ws, wts
            torch.cuda.empty_cache()


if __name__ == '__main__':
    main()
