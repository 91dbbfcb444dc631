"""Quantized GEMMs on the GPU (chapter 15g): checked against chapter 8b's torch reference on fresh random inputs, then
timed against the bfloat16 GEMM of the same shape: the linear layers of the Llama-3.1-8B shape at 1 to 256 rows.

    python kernels/quant_gemm_bench.py [--out kernels/results/quant/h200]

Writes gemm.csv (one row per shape, rows, method and tile variant: microseconds and effective GB/s of weight reads)
and prints a table. Each case is timed as a decode step runs it: replayed from a CUDA graph (no launch gaps), over
enough copies of the weight that none is still in L2 when it is read again (CUDA events; median of 5 replays).
"""
import argparse
import csv
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from paged_infer.model.quantization import FP8, QuantLinear, QuantScheme, dequantize_int, fp8_from_float, pack_int32  # noqa: E402
from paged_infer.ops.quant_gemm import (DEQUANT_ROWS, FP8_DOT_ROWS, GEMV_ROWS, _split_store, fp8_dot,  # noqa: E402
                                        fp8_gemm, fp8_gemm_config, int_gemm, int_gemm_config, int_gemv_config,
                                        quantize_fp8_rows_triton, split_buffers)

SHAPES = {'qkv': (4096, 6144), 'o': (4096, 4096), 'gate_up': (4096, 28672), 'down': (14336, 4096)}  # (K, N)
ROWS = (1, 4, 8, 16, 64, 256)
FP8_TRITON_MAX = 64  # the float8 Triton kernel is tried up to this many rows, whatever FP8_DOT_ROWS says
VARIANTS = [  # tile variants tried beside int_gemm_config's choice (2 to 16 rows)
    dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=4, UNPACK='cast'),
]
GEMV_VARIANTS = [  # keywords of `int_gemv_config` (one row), and extra launch options
    dict(unpack='cast'),  # the kernel as it was before the bit trick
    dict(block_n=128),
    dict(block_n=32, num_warps=2),
    dict(programs=528),
    dict(programs=2112),
]
FP8_VARIANTS = [  # keywords of `fp8_gemm_config`
    dict(),
    dict(block_k=256),
]


@triton.jit
def _probe_kernel(qw_ptr, out_ptr, part_ptr, lock_ptr, N, K, stride_qk, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  SPLIT_K: tl.constexpr):
    "Reads the packed int4 weight as `_int_gemv_kernel` does (same tiles, split, the same store), and unpacks nothing."
    pid_n, pid_k = tl.program_id(1), tl.program_id(2)
    WORDS: tl.constexpr = BLOCK_K // 8
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rw = tl.arange(0, WORDS)
    acc = tl.zeros((WORDS, BLOCK_N), dtype=tl.int32)
    k_split = K // SPLIT_K
    for k0 in range(pid_k * k_split, (pid_k + 1) * k_split, BLOCK_K):
        q = tl.load(qw_ptr + (k0 // 8 + rw)[:, None] * stride_qk + rn[None, :], mask=rn[None, :] < N, other=0,
                    eviction_policy='evict_first')
        acc ^= q
    y = tl.sum(acc, axis=0).to(tl.float32)
    _split_store(out_ptr, part_ptr, lock_ptr, y, rn, rn, rn < N, pid_n, pid_k, N, SPLIT_K)


def probe(qweight, K, N):
    "The read-only probe on the default row config's grid, one launch as `int_gemm` runs it."
    c = int_gemv_config(1, N, K, 128)
    out = torch.empty(1, N, dtype=torch.bfloat16, device=qweight.device)
    grid = (1, triton.cdiv(N, c['BLOCK_N']), c['SPLIT_K'])
    part, locks = split_buffers(1, N, grid[1], c['SPLIT_K'], qweight.device)
    _probe_kernel[grid](qweight, out, part, locks, N, K, qweight.stride(0), BLOCK_N=c['BLOCK_N'], BLOCK_K=c['BLOCK_K'],
                        SPLIT_K=c['SPLIT_K'], num_warps=c['num_warps'])
    return out


def gemv(v: dict, M: int, N: int, K: int) -> dict:
    "A row-kernel variant for this shape: `int_gemv_config`'s tiles and split, plus launch options."
    launch = {k: v[k] for k in ('num_stages',) if k in v}
    return int_gemv_config(M, N, K, 128, **{k: x for k, x in v.items() if k not in launch}) | launch


def fp8_triton(x, layer, config):
    "A float8 layer's product through `_fp8_gemm_kernel` with this config, the per-token quantization included."
    x8, xs = quantize_fp8_rows_triton(x)
    return fp8_dot(x8, layer.weight, xs, layer.weight_scale, x.dtype, config)


def time_graph(make, nbytes: int, reps: int = 20) -> float:
    "Microseconds a call of `make(i)()` (i picks a copy of the weights) takes, replayed from one CUDA graph."
    copies = max(1, min(32, -(-200_000_000 // nbytes)))  # 200 MB of weights at least: four times the L2
    fns = [make(i) for i in range(copies)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in fns:
            f()
    graph.replay()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (reps * copies))
    return sorted(times)[2]


def random_int(K, N, bits, group, seed, device='cuda'):
    gen = torch.Generator().manual_seed(seed)
    u = torch.randint(0, 1 << bits, (K, N), generator=gen, dtype=torch.int32)
    scales = (torch.rand(K // group, N, generator=gen) * 0.002 + 1e-4).to(torch.bfloat16)
    zeros = torch.randint(0, 1 << bits, (K // group, N), generator=gen).to(torch.bfloat16)
    return pack_int32(u, bits, 0).to(device), scales.to(device), zeros.to(device)


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
                every = (bits, group) == (4, 128)  # every variant on int4 g128; the others: defaults, both unpacks
                gemvs = [int_gemv_config(M, N, K, group, unpack=u) for u in ('bits', 'cast') if M == 1]
                if every:
                    gemvs = [gemv(c, M, N, K) for c in GEMV_VARIANTS if M == 1]
                for c in [None, *(VARIANTS if every and 1 < M < DEQUANT_ROWS else []), *gemvs]:
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
            if M <= FP8_TRITON_MAX:
                layer = fp8_layer(K, N, 'token')
                x8, xs = quantize_fp8_rows_triton(x)
                want = torch._scaled_mm(x8, layer.weight.T, scale_a=xs, scale_b=layer.weight_scale[None, :],
                                        out_dtype=torch.bfloat16).float()
                for v in FP8_VARIANTS:
                    got = fp8_dot(x8, layer.weight, xs, layer.weight_scale, torch.bfloat16,
                                  fp8_gemm_config(M, N, K, **v)).float()
                    err = ((got - want).abs().max() / want.abs().max()).item()
                    if err > 2e-2:
                        failures.append(f'fp8 triton {name} M={M} {v}: rel err {err:.3g}')
    print('checked: int4 g128 (default tiles,', len(VARIANTS), 'dot and', len(GEMV_VARIANTS),
          'row variants), int4 g64 and int8 g128 (defaults, both unpacks), fp8 token/tensor,', len(FP8_VARIANTS),
          'fp8 Triton variants;',
          'failures:', len(failures))


def bench(out: Path):
    rows = []
    for name, (K, N) in SHAPES.items():
        copies = 32
        w16 = [torch.randn(N, K, device='cuda', dtype=torch.bfloat16) * 0.02 for _ in range(-(-100_000_000 // (K * N)))]
        int4 = [random_int(K, N, 4, 128, i) for i in range(copies)]
        int8 = [random_int(K, N, 8, 128, i) for i in range(copies // 2)]
        f8 = [fp8_layer(K, N, 'token') for _ in range(copies // 2)]
        for f in f8:
            f.kernel = fp8_gemm
        for M in ROWS:
            x = torch.randn(M, K, device='cuda', dtype=torch.bfloat16)
            x8 = x.to(FP8)
            xs = torch.ones(M, 1, device='cuda')
            n4 = K * N // 2 + 4 * K // 128 * N
            cases = {  # method: (make(i) -> call, weight bytes, config)
                'bf16': (lambda i: lambda: x @ w16[i % len(w16)].T, 2 * K * N, ''),
                'int4-g128': (lambda i: lambda: int_gemm(x, *int4[i % copies], 4, 128), n4, 'default'),
                'int8-g128': (lambda i: lambda: int_gemm(x, *int8[i % 16], 8, 128), K * N + 4 * K // 128 * N,
                              'default'),
                'fp8-gemm-only': (lambda i: lambda: torch._scaled_mm(x8, f8[i % 16].weight.T, scale_a=xs,
                                  scale_b=f8[i % 16].weight_scale[None], out_dtype=torch.bfloat16), K * N, ''),
                'fp8+token-quant': (lambda i: lambda: f8[i % 16](x), K * N,
                                    'Triton' if M <= FP8_DOT_ROWS else 'torch._scaled_mm'),
            }
            if 1 < M <= 16 and M != 8:
                for j, c in enumerate(VARIANTS):
                    cases[f'int4-g128-dot{j}'] = (lambda i, c=c: lambda: int_gemm(x, *int4[i % copies], 4, 128, c),
                                                  n4, c)
            if M == 1:
                for j, v in enumerate(GEMV_VARIANTS):
                    c = gemv(v, M, N, K)
                    cases[f'int4-g128-row{j}'] = (lambda i, c=c: lambda: int_gemm(x, *int4[i % copies], 4, 128, c),
                                                  n4, c)
                cases['int8-g128-row-cast'] = (lambda i: lambda: int_gemm(x, *int8[i % 16], 8, 128, int_gemv_config(
                    M, N, K, 128, unpack='cast')), K * N + 4 * K // 128 * N, 'cast')
                cases['int4-read-only-probe'] = (lambda i: lambda: probe(int4[i % copies][0], K, N), K * N // 2,
                                                 'reads the packed weight, unpacks nothing')
            if M <= FP8_TRITON_MAX:
                for j, v in enumerate(FP8_VARIANTS if M == 1 else FP8_VARIANTS[:1]):
                    c = fp8_gemm_config(M, N, K, **v)
                    cases[f'fp8-triton{j}+token-quant'] = (lambda i, c=c: lambda: fp8_triton(x, f8[i % 16], c),
                                                            K * N, c)
            for method, (make, nbytes, cfg) in cases.items():
                try:
                    us = time_graph(make, nbytes)
                except Exception as e:  # a variant that does not compile here (for example bfloat16 atomics)
                    print(f'{name:8s} M={M:4d} {method:18s} failed: {type(e).__name__}: {str(e)[:120]}')
                    continue
                if cfg == 'default':
                    cfg = 'dequantize + cuBLAS' if M >= DEQUANT_ROWS else (
                        int_gemv_config(M, N, K, 128) if M <= GEMV_ROWS else int_gemm_config(M, N, K, 128))
                cfg = {k: str(v) for k, v in cfg.items()} if isinstance(cfg, dict) else cfg
                rows.append(dict(layer=name, K=K, N=N, M=M, method=method, us=round(us, 2),
                                 weight_GBps=round(nbytes / us / 1e3, 1), config=cfg))
                print(f'{name:8s} M={M:4d} {method:18s} {us:9.2f} us  {nbytes / us / 1e3:8.1f} GB/s  {cfg}', flush=True)
        torch.cuda.empty_cache()
    write_rows(rows, out / 'gemm.csv', ROWS)


def write_rows(rows: list, path: Path, row_counts):
    "Write the timed cases to a CSV file, and print each method's sum over a decoder layer's products against bf16's."
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print('\nper decoder layer (qkv + o + gate_up + down), microseconds:')
    for M in row_counts:
        tot = {}
        for r in rows:
            if r['M'] == M:
                tot[r['method']] = tot.get(r['method'], 0) + r['us']
        base = tot['bf16']
        print(f'M={M:4d} ' + '  '.join(f'{k} {v:.1f} ({v / base:.2f}x)' for k, v in tot.items()
                                      if sum(r['M'] == M and r['method'] == k for r in rows) == len(SHAPES)))


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
