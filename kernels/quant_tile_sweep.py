"""Int4 products of 16 to 256 rows on the GPU: the engine's way (chapter 15g: its tile kernel below 128 rows, the whole
weight unpacked for cuBLAS from 128 up) against tile sizes of the same kernel, and against a variant that takes the
zero point and the scale out of the inner loop. Checked against chapter 8b's reference on fresh random inputs, then
timed as `quant_gemm_bench.py` times (CUDA-graph replays over weight copies that miss L2) beside the bf16 GEMM.

    python kernels/quant_tile_sweep.py [--out DIR]     # GPU
    python kernels/quant_tile_sweep.py --smoke          # CPU, Triton's interpreter, small shapes, checks only

The variant ("zs"): with a group of 128 along K and one tile of K inside a group, w = (u - z) s, so
x w = s (x u) - s z (the row sums of x over the tile): the dot reads u converted to half precision (small integers,
exact), and the zero point and scale touch the (rows, columns) tile once a step instead of every weight.
"zsT" swaps the operands (out^T = W^T x^T: the unpacked weight tile is the dot's first operand, which Hopper's
tensor cores can read from registers). SPLIT_K 0 in a tile: K split until the grid has 264 programs.
Writes quant_tile_sweep.csv and prints each method's sum over a decoder layer's four products at each row count.
"""
import argparse
import os
import sys
from pathlib import Path

if '--smoke' in sys.argv:
    os.environ['TRITON_INTERPRET'] = '1'  # (read when the kernels are defined: before triton is imported)

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from paged_infer.model.quantization import dequantize_int  # noqa: E402
from paged_infer.ops.quant_gemm import _split_store, int_gemm, split_buffers  # noqa: E402
from quant_gemm_bench import SHAPES, random_int, time_graph, write_rows  # noqa: E402

ROWS = (16, 64, 128, 256)
TILES = [  # the engine's kernel with these tiles (SPLIT_K 1: at 64 rows and up the grid is full enough)
    dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, SPLIT_K=1, num_warps=8, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, SPLIT_K=1, num_warps=8, num_stages=3),
]
ZS_TILES = [  # the zero-and-scale-after variant; SPLIT_K 0: split until the grid has 264 programs
    dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=0, num_warps=4, num_stages=4),
    dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, SPLIT_K=0, num_warps=4, num_stages=4),
    dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, SPLIT_K=0, num_warps=4, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, SPLIT_K=1, num_warps=8, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, SPLIT_K=1, num_warps=8, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, SPLIT_K=1, num_warps=8, num_stages=3),
    dict(BLOCK_M=64, BLOCK_N=256, BLOCK_K=64, SPLIT_K=1, num_warps=8, num_stages=4),
]
ZST_TILES = [  # the same with the operands swapped (the weight tile as the dot's first operand: out^T = W^T x^T)
    dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=0, num_warps=4, num_stages=4),
    dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, SPLIT_K=0, num_warps=4, num_stages=4),
    dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, SPLIT_K=0, num_warps=4, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, SPLIT_K=1, num_warps=8, num_stages=3),
    dict(BLOCK_M=64, BLOCK_N=256, BLOCK_K=64, SPLIT_K=1, num_warps=8, num_stages=4),
]


@triton.jit
def _int4_zs_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, part_ptr, lock_ptr, M, N, K, stride_xm, stride_qk,
                    stride_sg, stride_om,
                    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    SPLIT_K: tl.constexpr, SWAP: tl.constexpr):
    """x (M, K) @ the int4 weight: the dot on the raw integers, zero point and scale applied to the tile's partial sum.
    SWAP: the weight tile is the dot's first operand (out^T = W^T x^T), as mixed-precision kernels do for few rows."""
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rw = tl.arange(0, BLOCK_K // 8)
    shifts = tl.arange(0, 8) * 4
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_split = K // SPLIT_K
    for k0 in range(pid_k * k_split, (pid_k + 1) * k_split, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        g = k0 // GROUP
        s = tl.load(s_ptr + g * stride_sg + rn, mask=rn < N, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + g * stride_sg + rn, mask=rn < N, other=0.0).to(tl.float32)
        if SWAP:
            xt = tl.load(x_ptr + rm[None, :] * stride_xm + k[:, None], mask=rm[None, :] < M, other=0.0)  # (BK, BM)
            q = tl.load(qw_ptr + (k0 // 8 + rw)[None, :] * stride_qk + rn[:, None], mask=rn[:, None] < N, other=0)
            u = tl.reshape((q[:, :, None] >> shifts[None, None, :]) & 15, (BLOCK_N, BLOCK_K))
            xu = tl.dot(u.to(xt.dtype), xt)  # (BN, BM); small integers: exact in half precision
            xsum = tl.sum(xt.to(tl.float32), axis=0)
            acc += (xu - z[:, None] * xsum[None, :]) * s[:, None]
        else:
            x = tl.load(x_ptr + rm[:, None] * stride_xm + k[None, :], mask=rm[:, None] < M, other=0.0)
            q = tl.load(qw_ptr + (k0 // 8 + rw)[:, None] * stride_qk + rn[None, :], mask=rn[None, :] < N, other=0)
            u = tl.reshape((q[:, None, :] >> shifts[None, :, None]) & 15, (BLOCK_K, BLOCK_N))
            xu = tl.dot(x, u.to(x.dtype))
            xsum = tl.sum(x.to(tl.float32), axis=1)
            acc += (xu - xsum[:, None] * z[None, :]) * s[None, :]
    if SWAP:
        acc = tl.trans(acc)
    keep = (rm[:, None] < M) & (rn[None, :] < N)
    tile = pid_m * tl.num_programs(1) + pid_n
    _split_store(out_ptr, part_ptr, lock_ptr, acc, rm[:, None] * stride_om + rn[None, :], rm[:, None] * N + rn[None, :],
                 keep, tile, pid_k, M * N, SPLIT_K)


def int4_zs(x, qweight, scales, zeros, group, c, swap=False):
    M, K = x.shape
    N = qweight.shape[1]
    c = dict(c)
    tiles = triton.cdiv(M, c['BLOCK_M']) * triton.cdiv(N, c['BLOCK_N'])
    if c['SPLIT_K'] == 0:
        split = 1
        while tiles * split < 264 and K % (c['BLOCK_K'] * split * 2) == 0 and K // (split * 2) >= 512:
            split *= 2
        c['SPLIT_K'] = split
    assert group % c['BLOCK_K'] == 0 and K % (c['BLOCK_K'] * c['SPLIT_K']) == 0
    out = x.new_empty(M, N)
    grid = (triton.cdiv(M, c['BLOCK_M']), triton.cdiv(N, c['BLOCK_N']), c['SPLIT_K'])
    part, locks = split_buffers(M, N, tiles, c['SPLIT_K'], x.device)
    _int4_zs_kernel[grid](x, qweight, scales, zeros, out, part, locks, M, N, K, x.stride(0), qweight.stride(0),
                          scales.stride(0), out.stride(0), GROUP=group, SWAP=swap, **c)
    return out


def methods(x, w):
    "name -> (call, config) for one input and one weight (qweight, scales, zeros)."
    m = {'int4 (engine)': (lambda: int_gemm(x, *w, 4, 128), 'engine')}
    for j, c in enumerate(TILES):
        m[f'int4 tile{j}'] = (lambda c=c: int_gemm(x, *w, 4, 128, c), c)
    for j, c in enumerate(ZS_TILES):
        m[f'int4 zs{j}'] = (lambda c=c: int4_zs(x, *w, 128, c), c)
    for j, c in enumerate(ZST_TILES):
        m[f'int4 zsT{j}'] = (lambda c=c: int4_zs(x, *w, 128, c, swap=True), c)
    return m


def check(shapes, rows, device, dtype) -> list:
    "Every method against the float reference on fresh random inputs; the failures."
    failures = []
    torch.manual_seed(2)
    for name, (K, N) in shapes.items():
        w = random_int(K, N, 4, 128, K + N, device)
        for M in rows:
            x = torch.randn(M, K, device=device, dtype=dtype)
            want = x.float() @ dequantize_int(*w, 4).float()
            for method, (call, c) in methods(x, w).items():
                try:
                    got = call().float()
                except Exception as e:
                    failures.append(f'{name} M={M} {method}: {type(e).__name__}: {str(e)[:100]}')
                    continue
                err = ((got - want).abs().max() / want.abs().max()).item()
                if err > 2e-2:
                    failures.append(f'{name} M={M} {method}: rel err {err:.3g}')
    return failures


def bench(out: Path):
    rows = []
    for name, (K, N) in SHAPES.items():
        n4 = K * N // 2 + 4 * K // 128 * N
        copies = max(1, min(32, -(-200_000_000 // n4)))  # as many as `time_graph` replays
        w16 = [torch.randn(N, K, device='cuda', dtype=torch.bfloat16) * 0.02 for _ in range(-(-100_000_000 // (K * N)))]
        int4 = [random_int(K, N, 4, 128, i) for i in range(copies)]
        for M in ROWS:
            x = torch.randn(M, K, device='cuda', dtype=torch.bfloat16)
            cases = {'bf16': (lambda i: lambda: x @ w16[i % len(w16)].T, 2 * K * N, '')}
            for method, (_, c) in methods(x, int4[0]).items():
                cases[method] = (lambda i, method=method: methods(x, int4[i % copies])[method][0], n4, c)
            for method, (make, nbytes, cfg) in cases.items():
                try:
                    us = time_graph(make, nbytes)
                except Exception as e:
                    print(f'{name:8s} M={M:4d} {method:16s} failed: {type(e).__name__}: {str(e)[:120]}', flush=True)
                    continue
                rows.append(dict(layer=name, K=K, N=N, M=M, method=method, us=round(us, 2), config=str(cfg)))
                print(f'{name:8s} M={M:4d} {method:16s} {us:9.2f} us  {cfg}', flush=True)
        cases = int4 = w16 = None  # (freed before the next shape)
        torch.cuda.empty_cache()
    write_rows(rows, out / 'quant_tile_sweep.csv', ROWS)

def main():
    p = argparse.ArgumentParser()
    p.add_argument('--out', default='kernels/results/quant/h100')
    p.add_argument('--smoke', action='store_true', help="CPU: Triton's interpreter on small shapes, checks only")
    a = p.parse_args()
    if a.smoke:
        failures = check({'small': (1024, 256)}, (3, 64), 'cpu', torch.float16)
        print('smoke checks, failures:', len(failures), *failures, sep='\n')
        sys.exit(1 if failures else 0)
    print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__, flush=True)
    failures = check(SHAPES, ROWS, 'cuda', torch.bfloat16)
    print('checked every method at', ROWS, 'rows on the 8B layer shapes; failures:', len(failures), *failures,
          sep='\n', flush=True)
    bench(Path(a.out))


if __name__ == '__main__':
    main()
