"""Quantized GEMMs on the GPU (chapter 15g): checked against chapter 8b's torch reference on fresh random inputs, then
timed against the bfloat16 GEMM of the same shape: the linear layers of the Llama-3.1-8B shape at 1, 16 and 256 rows.

    python kernels/quant_gemm_bench.py [--out kernels/results/quant/h200]

Writes gemm.csv (one row per shape, rows, method and tile variant: microseconds and effective GB/s of weight reads)
and prints a table. Times are medians of triton.testing.do_bench (CUDA events, L2 flushed between runs).
"""
import argparse
import csv
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from paged_infer.model.quantization import FP8, QuantLinear, QuantScheme, dequantize_int, fp8_from_float, pack_int32  # noqa: E402
from paged_infer.ops.quant_gemm import DEQUANT_ROWS, fp8_gemm, int_gemm, int_gemm_config  # noqa: E402

SHAPES = {'qkv': (4096, 6144), 'o': (4096, 4096), 'gate_up': (4096, 28672), 'down': (14336, 4096)}  # (K, N)
ROWS = (1, 16, 256)
VARIANTS = [  # tile variants tried beside int_gemm_config's choice (rows below DEQUANT_ROWS)
    dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, SPLIT_K=1),
    dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=4),
    dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, SPLIT_K=2, num_warps=8),
    dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, SPLIT_K=8),
    dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, SPLIT_K=4, num_warps=4, num_stages=4),
    dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, SPLIT_K=2, num_warps=2),
]


def random_int(K, N, bits, group, seed):
    gen = torch.Generator().manual_seed(seed)
    u = torch.randint(0, 1 << bits, (K, N), generator=gen, dtype=torch.int32)
    scales = (torch.rand(K // group, N, generator=gen) * 0.002 + 1e-4).to(torch.bfloat16)
    zeros = torch.randint(0, 1 << bits, (K // group, N), generator=gen).to(torch.bfloat16)
    return pack_int32(u, bits, 0).cuda(), scales.cuda(), zeros.cuda()


def fp8_layer(K, N, act):
    layer = QuantLinear(K, N, False, QuantScheme('fp8', 'fp8', 8, act_scale=act))
    w, s, _ = fp8_from_float({'weight': torch.randn(N, K) * 0.02}, layer.scheme, K, N, 'bench')
    layer.weight, layer.weight_scale = w.cuda(), s.cuda()
    layer.input_scale = torch.tensor(0.05, device='cuda') if act == 'tensor' else None
    return layer


def check(failures):
    "Fresh random inputs, every method against the float reference; raise at the end if any disagrees."
    torch.manual_seed(1)
    for name, (K, N) in SHAPES.items():
        for M in ROWS:
            x = torch.randn(M, K, device='cuda', dtype=torch.bfloat16)
            for bits, group in [(4, 128), (4, 64), (8, 128)]:
                qw, s, z = random_int(K, N, bits, group, seed=M + K + bits + group)
                want = x.float() @ dequantize_int(qw, s, z, bits).float()
                for c in [None, *VARIANTS]:
                    if c is not None and (group % c['BLOCK_K'] or K % (c['BLOCK_K'] * c['SPLIT_K'])):
                        continue
                    got = int_gemm(x, qw, s, z, bits, group, c).float()
                    err = ((got - want).abs().max() / want.abs().max()).item()
                    if err > 2e-2:
                        failures.append(f'int{bits} g{group} {name} M={M} {c}: rel err {err:.3g}')
            for act in ['token', 'tensor']:
                layer = fp8_layer(K, N, act)
                want = layer(x).float()  # chapter 8b's reference (the float weight, kept)
                layer.kernel, layer._dequantized = fp8_gemm, None
                got = layer(x).float()
                err = ((got - want).abs().max() / want.abs().max()).item()
                if err > 2e-2:
                    failures.append(f'fp8 {act} {name} M={M}: rel err {err:.3g}')
    print('checked: int4 g128/g64, int8 g128 (default tiles and', len(VARIANTS), 'variants), fp8 token/tensor;',
          'failures:', len(failures))


def bench(out: Path):
    rows = []
    for name, (K, N) in SHAPES.items():
        w16 = torch.randn(N, K, device='cuda', dtype=torch.bfloat16) * 0.02
        qw4, s4, z4 = random_int(K, N, 4, 128, 0)
        qw8, s8, z8 = random_int(K, N, 8, 128, 0)
        f8 = fp8_layer(K, N, 'token')
        f8.kernel = fp8_gemm
        for M in ROWS:
            x = torch.randn(M, K, device='cuda', dtype=torch.bfloat16)
            x8 = x.to(FP8)
            xs = torch.ones(M, 1, device='cuda')
            cases = {
                'bf16': (lambda: x @ w16.T, 2 * K * N),
                'int4-g128': (lambda: int_gemm(x, qw4, s4, z4, 4, 128), K * N // 2 + 4 * K // 128 * N),
                'int8-g128': (lambda: int_gemm(x, qw8, s8, z8, 8, 128), K * N + 4 * K // 128 * N),
                'fp8-gemm-only': (lambda: torch._scaled_mm(x8, f8.weight.T, scale_a=xs, scale_b=f8.weight_scale[None],
                                                          out_dtype=torch.bfloat16), K * N),
                'fp8+token-quant': (lambda: f8(x), K * N),
            }
            for i, c in enumerate(VARIANTS):
                if K % (c['BLOCK_K'] * c['SPLIT_K']) == 0 and M < DEQUANT_ROWS:
                    cases[f'int4-g128-v{i}'] = (lambda c=c: int_gemm(x, qw4, s4, z4, 4, 128, c), K * N // 2)
            for method, (fn, nbytes) in cases.items():
                us = triton.testing.do_bench(fn, warmup=25, rep=100) * 1e3
                cfg = ''
                if method.startswith('int') and '-v' not in method:
                    cfg = 'dequantize + cuBLAS' if M >= DEQUANT_ROWS else int_gemm_config(M, N, K, 128)
                rows.append(dict(layer=name, K=K, N=N, M=M, method=method, us=round(us, 2),
                                 weight_GBps=round(nbytes / us / 1e3, 1), config=cfg))
                print(f'{name:8s} M={M:4d} {method:18s} {us:9.2f} us  {nbytes / us / 1e3:8.1f} GB/s  {cfg}')
    out.mkdir(parents=True, exist_ok=True)
    with open(out / 'gemm.csv', 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print('\nper decoder layer (qkv + o + gate_up + down), microseconds:')
    for M in ROWS:
        tot = {}
        for r in rows:
            if r['M'] == M:
                tot[r['method']] = tot.get(r['method'], 0) + r['us']
        base = tot['bf16']
        print(f'M={M:4d} ' + '  '.join(f'{k} {v:.1f} ({v / base:.2f}x)' for k, v in tot.items()))


if __name__ == '__main__':
    p = argparse.ArgumentParser()
    p.add_argument('--out', default='kernels/results/quant/h200')
    a = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    failures = []
    check(failures)
    bench(Path(a.out))
    if failures:
        print('\n'.join(failures))
        sys.exit(1)
