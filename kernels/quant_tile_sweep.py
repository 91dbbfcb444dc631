"""Int4 products of 1 to 256 rows on the GPU: the engine's way (chapter 15g: its row kernel at one row, its tile kernel
below 128 rows, the whole weight unpacked for cuBLAS from 128 up) against the same a block of output columns at a
time (`dequant_in_chunks`, from 64 rows), and against configs of the tile kernel with UNPACK 'after' and 'planes'.
Checked against chapter 8b's reference on fresh random inputs, then timed as `quant_gemm_bench.py` times (CUDA-graph
replays over weight copies that miss L2) beside the bf16 GEMM.

    python kernels/quant_tile_sweep.py [--out DIR]     # GPU
    python kernels/quant_tile_sweep.py --smoke          # CPU, Triton's interpreter, small shapes, checks only

UNPACK 'after': with a group of 128 along K and one tile of K inside a group, w = (u - z) s, so x w = s (x u) - s z
(the row sums of x over the tile): the dot reads the integers u in half precision (unpacked under a half's exponent,
`_as_half`, unless the config says OFF=0: converted), and the zero point and scale touch the (rows, columns) tile
once a step instead of every weight. UNPACK 'planes': the same, with one dot for each value position of the int32
words, so that no reshape stands between the unpacked values and the dot; ASM: the values made two an instruction
by `_int4_halves` (PTX: not in the smoke run, which the interpreter runs). SWAP: the operands swapped (out^T = W^T
x^T: the unpacked weight tile is the dot's first operand, which Hopper's tensor cores can read from registers).
SPLIT_K 0 in a config: K split until the grid has 264 programs. Writes quant_tile_sweep.csv, prints each method's
sum over a decoder layer's four products at each row count, and writes int_tiles.json: the fastest tile config at
each row count where one beats the engine's way (for `quant_engine_bench.py --int-tiles`).
"""
import argparse
import json
import os
import sys
from pathlib import Path

if '--smoke' in sys.argv:
    os.environ['TRITON_INTERPRET'] = '1'  # (read when the kernels are defined: before triton is imported)

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from paged_infer.model.quantization import dequantize_int  # noqa: E402
from paged_infer.ops.quant_gemm import dequantize_triton, int_gemm  # noqa: E402
from quant_gemm_bench import SHAPES, random_int, time_graph, write_rows  # noqa: E402

ROWS = (1, 16, 64, 128, 256)
T16 = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=0, num_warps=4, num_stages=4)  # SPLIT_K 0: split to fill
T64 = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, SPLIT_K=0, num_warps=4, num_stages=3)
AFTER = dict(UNPACK='after')  # the dot on the raw integers; OFF (set by int_gemm): unpacked under a half's exponent
PLANES = dict(UNPACK='planes')  # one dot a value position of the words; ASM: two values an instruction (PTX)
VARIANTS = {  # name -> a config of the engine's tile kernel (beside the engine's own choice, 'int4 (engine)')
    'int4 after-cvt T16 swap': dict(T16, **AFTER, SWAP=True, OFF=0),  # integers converted: the best of an earlier run
    'int4 after T16 swap': dict(T16, **AFTER, SWAP=True),
    'int4 planes T16': dict(T16, **PLANES),
    'int4 planes T16 swap': dict(T16, **PLANES, SWAP=True),
    'int4 planes T16 asm': dict(T16, **PLANES, ASM=True),
    'int4 planes T16 swap asm': dict(T16, **PLANES, SWAP=True, ASM=True),
    'int4 planes T16n128 swap asm': dict(T16, BLOCK_N=128, **PLANES, SWAP=True, ASM=True),
    'int4 planes T16 swap asm 2st': dict(T16, **PLANES, SWAP=True, ASM=True, num_stages=2),
    'int4 planes T64 asm': dict(T64, **PLANES, ASM=True),
    'int4 planes T64 swap asm': dict(T64, **PLANES, SWAP=True, ASM=True),
}
CHUNK_ROWS = 64  # `dequant_in_chunks` is tried from this many rows up


def dequant_in_chunks(x, qweight, scales, zeros, chunk_bytes: int):
    """The engine's way for many rows (unpack to bfloat16, then cuBLAS), a block of output columns at a time, each
    block's float weight small enough (`chunk_bytes`) to be read back from L2 rather than from memory."""
    K, N = x.shape[1], qweight.shape[1]
    cols = max(128, chunk_bytes // (2 * K) // 128 * 128)
    parts = []
    for n0 in range(0, N, cols):
        n = slice(n0, min(N, n0 + cols))
        parts.append(x @ dequantize_triton(qweight[:, n], scales[:, n], zeros[:, n], 4, 128, x.dtype))
    return torch.cat(parts, dim=1)


def methods(x, w):
    "name -> (call, config) for one input and one weight (qweight, scales, zeros)."
    m = {'int4 (engine)': (lambda: int_gemm(x, *w, 4, 128), 'engine')}
    for mb in (8, 24) if x.shape[0] >= CHUNK_ROWS else ():
        m[f'int4 dequant-L2 {mb}MB'] = (lambda mb=mb: dequant_in_chunks(x, *w, mb << 20), f'chunks of {mb} MB')
    for name, c in VARIANTS.items():  # (a SPLIT_K of 0: int_gemm splits K by the engine's rule)
        m[name] = (lambda c=c: int_gemm(x, *w, 4, 128, c), c)
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
                if device == 'cpu' and isinstance(c, dict) and c.get('ASM'):
                    continue  # PTX: Triton's interpreter cannot run it
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
    best = best_tiles(rows)
    (out / 'int_tiles.json').write_text(json.dumps(best, indent=1))
    print('the fastest kernel config at each row count (int_tiles.json):', json.dumps(best), flush=True)


def best_tiles(rows) -> dict:
    "Row count -> the config whose four products of a decoder layer took least time (if not the engine's own way)."
    best = {}
    for M in ROWS:
        tot = {}
        for r in rows:
            if r['M'] == M and r['method'].startswith('int4'):
                tot.setdefault(r['method'], []).append(r['us'])
        tot = {k: sum(v) for k, v in tot.items() if len(v) == len(SHAPES)}
        fastest = min(tot, key=tot.get)
        if fastest in VARIANTS:
            best[str(M)] = VARIANTS[fastest]
    return best


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
