"""Float8 products of few rows: chapter 15g's `_fp8_gemm_kernel`, which computes `w @ x.T` (the weight's features are
the dot's M, the rows its N), against the same kernel written the plain way, `x @ w.T` (`_fp8_plain_kernel` here, the
chapter's kernel until 2026-12-08), in one process on the GPU. At 16 rows a tile the plain dot is too small for
Hopper's float8 warp-group instruction: compiled for sm_90, its K loop converts every float8 value to float16 (`F2FP`,
64 an iteration of a thread) and multiplies on the Ampere-style `HMMA`. Swapped, the loop is float8 `QGMMA` with no
conversion (`--sass`, no GPU needed).

Each variant is checked against `torch._scaled_mm` on fresh random inputs (the chapter's odd shapes too), then a
decoder layer's four products of the Llama-3.1-8B shape (per-token activation scales, the quantization of x
included) are timed at 1, 8, 16 and 32 rows as `quant_gemm_bench.py` times them (CUDA-graph replays over weight
copies that miss L2), beside bf16 and `torch._scaled_mm`, with a few other launches of the committed kernel.

    python kernels/fp8_rows_ab.py [--no-grid] [--out DIR]   # GPU: fp8_rows_ab.csv, fp8_rows_pick.json, fp8_dot_rows.txt
    python kernels/fp8_rows_ab.py --sass                    # CPU: the K loop of both kernels in sm_90 machine code
    python kernels/fp8_rows_ab.py --smoke                   # CPU, Triton's interpreter: both kernels on small shapes

(Until 2026-12-08 the roles were the other way round: the committed kernel was the plain one, and this file held the
swapped one as the candidate; results/quant/h100/MANIFEST.md has both runs.)
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

if '--smoke' in sys.argv:
    os.environ['TRITON_INTERPRET'] = '1'

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from paged_infer.ops.quant_gemm import (_fp8_gemm_kernel, _split_store, fp8_dot, fp8_gemm_config,  # noqa: E402
                                        quantize_fp8_rows_triton, split_buffers)

ROWS = (1, 8, 16, 32)


@triton.jit
def _fp8_plain_kernel(x_ptr, w_ptr, xs_ptr, ws_ptr, out_ptr, part_ptr, lock_ptr, M, N, K, stride_xm, stride_wn,
                      stride_om,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    "`_fp8_gemm_kernel` written the plain way: acc (BLOCK_M, BLOCK_N) = x (BLOCK_M, K) @ w.T."
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_split = K // SPLIT_K
    for k0 in range(pid_k * k_split, (pid_k + 1) * k_split, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + k[None, :], mask=rm[:, None] < M, other=0.0)
        w = tl.load(w_ptr + rn[:, None] * stride_wn + k[None, :], mask=rn[:, None] < N, other=0.0,
                    eviction_policy='evict_first')
        acc = tl.dot(x, tl.trans(w), acc)
    xs = tl.load(xs_ptr + rm, mask=rm < M, other=0.0)
    ws = tl.load(ws_ptr + rn, mask=rn < N, other=0.0)
    y = acc * xs[:, None] * ws[None, :]
    keep = (rm[:, None] < M) & (rn[None, :] < N)
    tile = pid_m * tl.num_programs(1) + pid_n
    _split_store(out_ptr, part_ptr, lock_ptr, y, rm[:, None] * stride_om + rn[None, :], rm[:, None] * N + rn[None, :],
                 keep, tile, pid_k, M * N, SPLIT_K)


GRID = [  # (block_n, block_k, programs, num_stages) of the committed kernel, 4 warps; its default: (64, 128, 132, 4)
    (64, 256, 264, 4), (64, 128, 264, 3), (64, 128, 528, 4)]
PLAIN_LAUNCH = dict(programs=264, num_stages=3)  # the plain kernel's launch when it was committed


def plain(x, w, ws, config=None):
    "x (M, K) bf16 @ the float8 weight w (N, K) with feature scales ws (N,): x quantized per row, the plain kernel."
    M, K = x.shape
    N = w.shape[0]
    x8, xs = quantize_fp8_rows_triton(x)
    c = config or fp8_gemm_config(M, N, K, **PLAIN_LAUNCH)
    grid = (triton.cdiv(M, c['BLOCK_M']), triton.cdiv(N, c['BLOCK_N']), c['SPLIT_K'])
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    part, locks = split_buffers(M, N, grid[0] * grid[1], c['SPLIT_K'], x.device)
    _fp8_plain_kernel[grid](x8, w, xs, ws, out, part, locks, M, N, K, x8.stride(0), w.stride(0), out.stride(0), **c)
    return out


def committed(x, w, ws, config=None):
    "The engine's way for few rows: x quantized per row, then `_fp8_gemm_kernel` (`w @ x.T`)."
    x8, xs = quantize_fp8_rows_triton(x)
    return fp8_dot(x8, w, xs, ws, x.dtype, config)


def scaled_mm(x, w, ws):
    x8, xs = quantize_fp8_rows_triton(x)
    return torch._scaled_mm(x8, w.T, scale_a=xs, scale_b=ws[None, :], out_dtype=x.dtype)


def methods(x, w, ws, grid=True) -> dict:
    M, K = x.shape
    N = w.shape[0]
    calls = {'fp8 committed': lambda: committed(x, w, ws), 'fp8 x @ w.T': lambda: plain(x, w, ws),
             'fp8 torch._scaled_mm': lambda: scaled_mm(x, w, ws)}
    for bn, bk, pr, st in GRID if grid else []:
        c = fp8_gemm_config(M, N, K, block_n=bn, block_k=bk, programs=pr, num_stages=st)
        calls[f'launch BN{bn} BK{bk} P{pr} st{st}'] = lambda c=c: committed(x, w, ws, c)
    return calls


def random_fp8(K, N, seed, device='cuda'):
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(N, K, generator=gen) * 20).clamp(-448, 448).to(torch.float8_e4m3fn).to(device)
    ws = (torch.rand(N, generator=gen) * 1e-3 + 1e-4).to(device)
    return w, ws


def smoke() -> list:
    "Both kernels, with and without a K split, against the float8 values multiplied in float32 (Triton's interpreter)."
    failures = []
    for M, N, K in [(1, 192, 512), (5, 64, 256), (20, 128, 512)]:
        w, ws = random_fp8(K, N, M, 'cpu')
        x = torch.randn(M, K, dtype=torch.bfloat16)
        x8, xs = quantize_fp8_rows_triton(x)
        want = (x8.float() @ w.float().T) * xs * ws[None, :]
        for name, got in [('committed', committed(x, w, ws)), ('x @ w.T', plain(x, w, ws)),
                          ('committed, one program a tile', committed(x, w, ws, fp8_gemm_config(M, N, K, programs=1)))]:
            err = ((got.float() - want).abs().max() / want.abs().max()).item()
            if err > 1e-2:
                failures.append(f'{M}x{N}x{K} {name}: rel err {err:.3g}')
    return failures


def sass():
    "The K loop of the plain and the committed (swapped) kernel at 16 rows a tile, compiled for sm_90 on this computer."
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from sass_census import NVDISASM, inner_loop
    sig = {'x_ptr': '*fp8e4nv', 'w_ptr': '*fp8e4nv', 'xs_ptr': '*fp32', 'ws_ptr': '*fp32', 'out_ptr': '*bf16',
           'part_ptr': '*fp32', 'lock_ptr': '*i32', 'M': 'i32', 'N': 'i32', 'K': 'i32', 'stride_xm': 'i32',
           'stride_wn': 'i32', 'stride_om': 'i32'}
    for fn, bn in ((_fp8_plain_kernel, 64), (_fp8_gemm_kernel, 64), (_fp8_gemm_kernel, 128)):
        const = dict(BLOCK_M=16, BLOCK_N=bn, BLOCK_K=128, SPLIT_K=4)
        attrs = {(i,): [['tt.divisibility', 16]] for i in range(13) if i != 7}  # (M, the row count, is any number)
        k = triton.compile(ASTSource(fn, dict(sig, **{c: 'constexpr' for c in const}), const, attrs),
                           target=GPUTarget('cuda', 90, 32), options=dict(num_warps=4, num_stages=3))
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / 'kernel.cubin'
            path.write_bytes(k.asm['cubin'])
            text = subprocess.run([str(NVDISASM), '-c', str(path)], capture_output=True, text=True, check=True).stdout
        ops = collections.Counter(op.split('.')[0] for op in inner_loop(text))
        print(f'{fn.fn.__name__}, 16 rows x {bn} features x 128 K a tile: {sum(ops.values())} instructions a K loop '
              f'iteration of a thread\n    ' + '  '.join(f'{op} {n}' for op, n in ops.most_common()))


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--out', default='kernels/results/quant/h100')
    p.add_argument('--sass', action='store_true')
    p.add_argument('--no-grid', dest='grid', action='store_false', help='the committed launch only')
    p.add_argument('--smoke', action='store_true')
    a = p.parse_args()
    if a.sass:
        print('triton', triton.__version__, 'target sm_90')
        return sass()
    if a.smoke:
        failures = smoke()
        print('smoke checks, failures:', len(failures), *failures, sep='\n')
        sys.exit(1 if failures else 0)
    from quant_gemm_bench import SHAPES, time_graph, write_rows
    print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__, flush=True)
    failures = []
    torch.manual_seed(5)
    for name, (K, N) in SHAPES.items():
        w, ws = random_fp8(K, N, K + N)
        for M in ROWS:
            x = torch.randn(M, K, device='cuda', dtype=torch.bfloat16)
            want = scaled_mm(x, w, ws).float()
            for method, call in methods(x, w, ws, a.grid).items():
                err = ((call().float() - want).abs().max() / want.abs().max()).item()
                if err > 1e-2:
                    failures.append(f'{name} M={M} {method}: rel err {err:.3g}')
    for M, N, K in [(7, 208, 512), (40, 128, 2048), (100, 96, 256)]:  # the chapter's odd shapes, split or not
        w, ws = random_fp8(K, N, M)
        x = torch.randn(M, K, device='cuda', dtype=torch.bfloat16)
        want = scaled_mm(x, w, ws).float()
        for config in [None, fp8_gemm_config(M, N, K, block_n=32, programs=1)]:
            err = ((committed(x, w, ws, config).float() - want).abs().max() / want.abs().max()).item()
            if err > 1e-2:
                failures.append(f'{M}x{N}x{K} {config}: rel err {err:.3g}')
    print('checked every variant against torch._scaled_mm; failures:', len(failures), *failures[:20], sep='\n',
          flush=True)
    rows = []
    for name, (K, N) in SHAPES.items():
        copies = max(1, min(32, -(-200_000_000 // (K * N))))
        w16 = [torch.randn(N, K, device='cuda', dtype=torch.bfloat16) * 0.02 for _ in range(-(-100_000_000 // (K * N)))]
        f8 = [random_fp8(K, N, i) for i in range(copies)]
        for M in ROWS:
            x = torch.randn(M, K, device='cuda', dtype=torch.bfloat16)
            cases = {'bf16': (lambda i: lambda: x @ w16[i % len(w16)].T, 2 * K * N)}
            for method in methods(x, *f8[0], a.grid):
                cases[method] = (lambda i, method=method: methods(x, *f8[i % copies], a.grid)[method], K * N)
            for method, (make, nbytes) in cases.items():
                us = time_graph(make, nbytes)
                rows.append(dict(layer=name, K=K, N=N, M=M, method=method, us=round(us, 2)))
                print(f'{name:8s} M={M:3d} {method:34s} {us:9.2f} us', flush=True)
        f8 = w16 = None
        torch.cuda.empty_cache()
    picks = {}
    print('the fastest of each row count, a decoder layer (the four products), microseconds:')
    for M in ROWS:
        us = {}
        for r in rows:
            if r['M'] == M:
                us[r['method']] = us.get(r['method'], 0) + r['us']
        best = sorted(us.items(), key=lambda kv: kv[1])
        print(f'M={M:3d} bf16 {us["bf16"]:.1f}  committed {us["fp8 committed"]:.1f}  x @ w.T {us["fp8 x @ w.T"]:.1f}  '
              f'scaled_mm {us["fp8 torch._scaled_mm"]:.1f}  fastest: ' + '; '.join(f'{k} {v:.1f}' for k, v in best[:3]),
              flush=True)
        swap = min((kv for kv in best if kv[0].startswith(('launch B', 'fp8 committed'))), key=lambda kv: kv[1])
        picks[M] = dict(method=swap[0], us=round(swap[1], 2))
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / 'fp8_rows_pick.json').write_text(json.dumps(picks, indent=1) + '\n')
    dot_rows = 0  # the most rows up to which the committed kernel is at least as fast as torch._scaled_mm
    for M in ROWS:
        layer = {m: sum(r['us'] for r in rows if r['M'] == M and r['method'] == m)
                 for m in ('fp8 committed', 'fp8 torch._scaled_mm')}
        if layer['fp8 committed'] > layer['fp8 torch._scaled_mm']:
            break
        dot_rows = M
    print('FP8_DOT_ROWS for the committed kernel, from these rows:', dot_rows, flush=True)
    (Path(a.out) / 'fp8_dot_rows.txt').write_text(f'{dot_rows}\n')
    write_rows(rows, Path(a.out) / 'fp8_rows_ab.csv', ROWS)


if __name__ == '__main__':
    main()
