"""The int4 row kernel (chapter 15g's `_int_gemv_kernel`, one row of x) as committed against its earlier form, in one
process on the GPU: the earlier `_value` OR-ed the constant 0x4B000000 under each masked value, and the compiler then
loaded the mask into a register before every AND-OR (`kernels/sass_census.py`: 6.11 instructions a weight against
5.28 with the exponent's bits passed as a value; results/cpu_ops/sass_census_magic_2026-12-07.log). Also the
committed kernel with 128 and 256 output columns a program. Each variant is checked against chapter 8b's reference on
fresh random inputs, then a decoder layer's four products of the Llama-3.1-8B shape at one row are timed as
`quant_gemm_bench.py` times them (CUDA-graph replays over weight copies that miss L2), beside bf16.

    python kernels/gemv_magic_ab.py [--out DIR]      # GPU: writes gemv_magic_ab_round0.csv and _round1.csv
    python kernels/gemv_magic_ab.py --smoke           # CPU, Triton's interpreter: the checks on a small shape
    python kernels/gemv_magic_ab.py --grid [--out DIR]  # also each launch of GRID (tiles, warps, programs)
"""
import argparse
import os
import sys
from pathlib import Path

if '--smoke' in sys.argv:
    os.environ['TRITON_INTERPRET'] = '1'

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from paged_infer.model.quantization import dequantize_int  # noqa: E402
from paged_infer.ops.quant_gemm import _as_float, _split_store, int_gemm, int_gemv_config, split_buffers  # noqa: E402
from quant_gemm_bench import SHAPES, random_int, time_graph, write_rows  # noqa: E402


@triton.jit
def _value_const(q, xi, i: tl.constexpr, BITS: tl.constexpr):
    "`_value`'s 'bits' as it was: the exponent's bits a constant."
    MASK: tl.constexpr = (1 << BITS) - 1
    HIGH: tl.constexpr = BITS * (i + 1) > 23
    P: tl.constexpr = BITS * i - 16 if HIGH else BITS * i
    word = q >> 16 if HIGH else q
    return _as_float(word & (MASK << P)), xi * (1.0 / (1 << P))


@triton.jit
def _gemv_const(x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, part_ptr, lock_ptr, N, K, stride_xm, stride_qk, stride_sg,
                stride_om, GROUP: tl.constexpr, BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                SPLIT_K: tl.constexpr):
    "`_int_gemv_kernel` as it was before the exponent's bits became an argument (UNPACK 'bits')."
    m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    PER: tl.constexpr = 32 // BITS
    WORDS: tl.constexpr = BLOCK_K // PER
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rw = tl.arange(0, WORDS)
    acc = tl.zeros((WORDS, BLOCK_N), dtype=tl.float32)
    k_split = K // SPLIT_K
    for k0 in range(pid_k * k_split, (pid_k + 1) * k_split, BLOCK_K):
        q = tl.load(qw_ptr + (k0 // PER + rw)[:, None] * stride_qk + rn[None, :], mask=rn[None, :] < N, other=0,
                    eviction_policy='evict_first')
        part = tl.zeros((WORDS, BLOCK_N), dtype=tl.float32)
        x_sum = tl.zeros((WORDS,), dtype=tl.float32)
        for i in tl.static_range(PER):
            xi = tl.load(x_ptr + m * stride_xm + k0 + rw * PER + i).to(tl.float32)
            x_sum += xi
            u, xu = _value_const(q, xi, i, BITS)
            part += u * xu[:, None]
        g = k0 // GROUP
        s = tl.load(s_ptr + g * stride_sg + rn, mask=rn < N, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + g * stride_sg + rn, mask=rn < N, other=0.0).to(tl.float32)
        acc += s[None, :] * (part - z[None, :] * x_sum[:, None])
    y = tl.sum(acc, axis=0)
    tile = m * tl.num_programs(1) + pid_n
    _split_store(out_ptr, part_ptr, lock_ptr, y, m * stride_om + rn, m * N + rn, rn < N, tile, pid_k,
                 tl.num_programs(0) * N, SPLIT_K)


def gemv_const(x, qweight, scales, zeros, bits=4, group=128):
    "The earlier row kernel, launched as `int_gemm` launches the committed one (default config)."
    M, K = x.shape
    N = qweight.shape[1]
    c = int_gemv_config(M, N, K, group)
    grid = (M, triton.cdiv(N, c['BLOCK_N']), c['SPLIT_K'])
    out = x.new_empty(M, N)
    part, locks = split_buffers(M, N, grid[0] * grid[1], c['SPLIT_K'], x.device)
    _gemv_const[grid](x, qweight, scales, zeros, out, part, locks, N, K, x.stride(0), qweight.stride(0),
                      scales.stride(0), out.stride(0), GROUP=group, BITS=bits, BLOCK_N=c['BLOCK_N'],
                      BLOCK_K=c['BLOCK_K'], SPLIT_K=c['SPLIT_K'], num_warps=c['num_warps'])
    return out


GRID = [  # (block_n, block_k, num_warps, programs): `int_gemv_config`'s launch choices, tried with --grid
    (bn, bk, nw, pr) for bn, nw in ((64, 4), (128, 4), (128, 8), (256, 8)) for bk in (64, 128)
    for pr in (528, 1056, 2112)]


def methods(x, w, grid=False) -> dict:
    "name -> a call computing x @ the weight that `w` (qweight, scales, zeros) stands for."
    M, K = x.shape
    N = w[0].shape[1]
    calls = {
        'int4 row, constant exponent (before)': lambda: gemv_const(x, *w),
        'int4 row (committed)': lambda: int_gemm(x, *w, 4, 128),
        'int4 row, 128 columns': lambda: int_gemm(x, *w, 4, 128, int_gemv_config(M, N, K, 128, block_n=128)),
        'int4 row, 256 columns, 8 warps': lambda: int_gemm(x, *w, 4, 128, int_gemv_config(M, N, K, 128, block_n=256,
                                                                                         num_warps=8)),
    }
    for bn, bk, nw, pr in GRID if grid else []:
        c = int_gemv_config(M, N, K, 128, block_n=bn, block_k=bk, programs=pr, num_warps=nw)
        calls[f'row BN{bn} BK{bk} W{nw} P{pr} S{c["SPLIT_K"]}'] = lambda c=c: int_gemm(x, *w, 4, 128, c)
    return calls


def check(shapes, device, dtype, grid=False) -> list:
    failures = []
    torch.manual_seed(3)
    for name, (K, N) in shapes.items():
        w = random_int(K, N, 4, 128, K + N + 7, device)
        x = torch.randn(1, K, device=device, dtype=dtype)
        want = x.float() @ dequantize_int(*w, 4).float()
        for method, call in methods(x, w, grid).items():
            err = ((call().float() - want).abs().max() / want.abs().max()).item()
            if err > 2e-2:
                failures.append(f'{name} {method}: rel err {err:.3g}')
    return failures


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--out', default='kernels/results/quant/h100')
    p.add_argument('--smoke', action='store_true')
    p.add_argument('--grid', action='store_true', help="also each launch of GRID: the fastest a shape is printed")
    a = p.parse_args()
    if a.smoke:
        failures = check({'small': (1024, 512)}, 'cpu', torch.float32, a.grid)
        print('smoke checks, failures:', len(failures), *failures, sep='\n')
        sys.exit(1 if failures else 0)
    print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__, flush=True)
    failures = check(SHAPES, 'cuda', torch.bfloat16, a.grid)
    print('checked every variant at one row on the 8B layer shapes; failures:', len(failures), *failures, sep='\n',
          flush=True)
    rows = []
    for name, (K, N) in SHAPES.items():
        n4 = K * N // 2 + 4 * K // 128 * N
        copies = max(1, min(32, -(-200_000_000 // n4)))
        w16 = [torch.randn(N, K, device='cuda', dtype=torch.bfloat16) * 0.02 for _ in range(-(-100_000_000 // (K * N)))]
        int4 = [random_int(K, N, 4, 128, i) for i in range(copies)]
        x = torch.randn(1, K, device='cuda', dtype=torch.bfloat16)
        cases = {'bf16': (lambda i: lambda: x @ w16[i % len(w16)].T, 2 * K * N)}
        for method in methods(x, int4[0], a.grid):
            cases[method] = (lambda i, method=method: methods(x, int4[i % copies], a.grid)[method], n4)
        for rep in range(2):  # twice, alternating, so that a drift of the machine shows
            for method, (make, nbytes) in cases.items():
                us = time_graph(make, nbytes)
                rows.append(dict(layer=name, K=K, N=N, M=1, round=rep, method=method, us=round(us, 2)))
                print(f'{name:8s} round {rep} {method:34s} {us:9.2f} us', flush=True)
        cases = int4 = w16 = None
        torch.cuda.empty_cache()
    if a.grid:
        print('the fastest launches of each shape, microseconds (mean of the two rounds):')
        for name in SHAPES:
            us = {}
            for r in rows:
                if r['layer'] == name and r['method'] != 'bf16':
                    us[r['method']] = us.get(r['method'], 0) + r['us'] / 2
            best = sorted(us.items(), key=lambda kv: kv[1])[:3]
            print(f'{name:8s} committed {us["int4 row (committed)"]:.2f} us; fastest: ' +
                  '; '.join(f'{k} {v:.2f}' for k, v in best), flush=True)
    for rep in range(2):
        print(f'round {rep}:', flush=True)
        write_rows([dict(r, M=1) for r in rows if r['round'] == rep], Path(a.out) / f'gemv_magic_ab_round{rep}.csv',
                   (1,))


if __name__ == '__main__':
    main()
