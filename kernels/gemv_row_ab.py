"""The int4 row kernel (chapter 15g's `_int_gemv_kernel`, one row of x) as committed against a form of it whose K loop
Triton pipelines (`_gemv_staged`: the next tiles' words, scales and zeros copied into shared memory while the current
one is unpacked), in one process on the GPU, with `--grid` over launch choices (output columns a program, pipeline
stages, programs in the grid). Each variant is checked against chapter 8b's reference on fresh random inputs, then a
decoder layer's four products of the Llama-3.1-8B shape at one row are timed as `quant_gemm_bench.py` times them
(CUDA-graph replays over weight copies that miss L2), beside bf16.

(At 3657232 this file was `kernels/gemv_magic_ab.py` and timed the row kernel with 0x4B000000 as a constant against
the committed form that takes it as an argument: results/quant/h100/MANIFEST.md. At 2e549f5 it held a form that
asked for the next tile's words by hand, one tile ahead; its machine code showed those loads moved back down to
just before their use, so it was never timed.)

    python kernels/gemv_row_ab.py [--grid] [--out DIR]  # GPU: writes gemv_row_ab_round0.csv and _round1.csv
    python kernels/gemv_row_ab.py --smoke [--grid]      # CPU, Triton's interpreter: the checks on a small shape
    python kernels/gemv_row_ab.py --sass                # CPU: where each K loop's global reads sit (sm_90 SASS)
"""
import argparse
import json
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
from paged_infer.ops.quant_gemm import (_int_gemv_kernel, _split_store, _value, int_gemm, int_gemv_config,  # noqa: E402
                                         split_buffers)  # noqa: E402
from quant_gemm_bench import SHAPES, random_int, time_graph, write_rows  # noqa: E402


@triton.jit
def _gemv_staged(x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, part_ptr, lock_ptr, N, K, stride_xm, stride_qk, stride_sg,
                 stride_om, magic, GROUP: tl.constexpr, BITS: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, UNPACK: tl.constexpr = 'bits', STAGES: tl.constexpr = 3):
    """`_int_gemv_kernel` with its K loop given to Triton's software pipeliner (`tl.range(..., num_stages=STAGES)`):
    the words, scales and zeros of the next STAGES - 1 K tiles are copied into shared memory asynchronously
    (`cp.async`, SASS `LDGSTS`) while the current tile is unpacked, so that a program keeps several tiles' reads in
    flight. Without the explicit `num_stages` Triton pipelines only loops that feed a `tl.dot`, and this one has none:
    each thread then has one 16-byte read outstanding at a time (ptxas places every load just before its use; loads
    written one tile ahead by hand are moved back down: `python kernels/gemv_row_ab.py --sass`)."""
    m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    PER: tl.constexpr = 32 // BITS
    WORDS: tl.constexpr = BLOCK_K // PER
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rw = tl.arange(0, WORDS)
    acc = tl.zeros((WORDS, BLOCK_N), dtype=tl.float32)
    k_split = K // SPLIT_K
    for k0 in tl.range(pid_k * k_split, (pid_k + 1) * k_split, BLOCK_K, num_stages=STAGES):
        q = tl.load(qw_ptr + (k0 // PER + rw)[:, None] * stride_qk + rn[None, :], mask=rn[None, :] < N, other=0,
                    eviction_policy='evict_first')
        part = tl.zeros((WORDS, BLOCK_N), dtype=tl.float32)
        x_sum = tl.zeros((WORDS,), dtype=tl.float32)
        for i in tl.static_range(PER):
            xi = tl.load(x_ptr + m * stride_xm + k0 + rw * PER + i).to(tl.float32)
            x_sum += xi
            u, xu = _value(q, xi, magic, i, BITS, UNPACK)
            part += u * xu[:, None]
        g = k0 // GROUP
        s = tl.load(s_ptr + g * stride_sg + rn, mask=rn < N, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + g * stride_sg + rn, mask=rn < N, other=0.0).to(tl.float32)
        acc += s[None, :] * (part - z[None, :] * x_sum[:, None])
    y = tl.sum(acc, axis=0)
    tile = m * tl.num_programs(1) + pid_n
    _split_store(out_ptr, part_ptr, lock_ptr, y, m * stride_om + rn, m * N + rn, rn < N, tile, pid_k,
                 tl.num_programs(0) * N, SPLIT_K)


def gemv_staged(x, qweight, scales, zeros, bits=4, group=128, stages=3, **config):
    "The row kernel with its K loop pipelined `stages` deep, launched as `int_gemm` launches the committed one."
    M, K = x.shape
    N = qweight.shape[1]
    c = int_gemv_config(M, N, K, group, **config)
    grid = (M, triton.cdiv(N, c['BLOCK_N']), c['SPLIT_K'])
    out = x.new_empty(M, N)
    part, locks = split_buffers(M, N, grid[0] * grid[1], c['SPLIT_K'], x.device)
    _gemv_staged[grid](x, qweight, scales, zeros, out, part, locks, N, K, x.stride(0), qweight.stride(0),
                       scales.stride(0), out.stride(0), 0x4B000000, GROUP=group, BITS=bits, BLOCK_N=c['BLOCK_N'],
                       BLOCK_K=c['BLOCK_K'], SPLIT_K=c['SPLIT_K'], STAGES=stages, num_warps=c['num_warps'])
    return out


GRID = [  # (block_n, stages, programs) of the pipelined kernel, K tiles of 128, 4 warps, tried with --grid
    (bn, st, pr) for bn in (64, 128) for st in (2, 3) for pr in (528, 1056, 2112)]


def methods(x, w, grid=False) -> dict:
    "name -> a call computing x @ the weight that `w` (qweight, scales, zeros) stands for."
    M, K = x.shape
    N = w[0].shape[1]
    calls = {
        'int4 row (committed)': lambda: int_gemm(x, *w, 4, 128),
        'int4 row, 128 columns': lambda: int_gemm(x, *w, 4, 128, int_gemv_config(M, N, K, 128, block_n=128)),
        'staged': lambda: gemv_staged(x, *w),
    }
    for bn, st, pr in GRID if grid else []:
        launch = dict(block_n=bn, stages=st, programs=pr)
        calls[f'staged BN{bn} S{st} P{pr}'] = lambda launch=launch: gemv_staged(x, *w, **launch)
    return calls


def launch_of(method: str) -> dict:
    "`gemv_staged`'s keywords that a grid method's name stands for ('staged BN64 S3 P528')."
    bn, st, pr = (int(t[2:] if t[0] == 'B' else t[1:]) for t in method.split()[1:])
    return dict(block_n=bn, stages=st, programs=pr)


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


def sass():
    "Each kernel's K loop in sm_90 machine code (Triton's own ptxas): instructions a weight, where the reads sit."
    from sass_census import compile_sass, inner_loop, report
    print('triton', triton.__version__, 'target sm_90')
    ints = ['N', 'K', 'stride_xm', 'stride_qk', 'stride_sg', 'stride_om', 'magic']
    kernels = [('committed', _int_gemv_kernel, {})] + [
        (f'staged, {st} stages', _gemv_staged, dict(STAGES=st)) for st in (2, 3)]
    for bn in (64, 128):
        for name, fn, extra in kernels:
            const = dict(GROUP=128, BITS=4, BLOCK_N=bn, BLOCK_K=128, SPLIT_K=4, UNPACK='bits', **extra)
            code = compile_sass(fn, ints, const)
            report(f'{name}, {bn} columns a program', code, bn)
            ops = inner_loop(code)
            reads = [f'{i}:{op}' for i, op in enumerate(ops) if op.startswith('LDG') and 'U16' not in op]
            print(f'    reads of weights, scales and zeros (position of {len(ops)}):', ' '.join(reads))


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--out', default='kernels/results/quant/h100')
    p.add_argument('--smoke', action='store_true')
    p.add_argument('--grid', action='store_true', help="also each launch of GRID: the fastest a shape is printed")
    p.add_argument('--sass', action='store_true', help='no GPU: the K loops in machine code')
    a = p.parse_args()
    if a.sass:
        return sass()
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
    if a.grid:  # the fastest pipelined launch of each shape, for `quant_engine_bench.py --gemv-launch`
        print('the fastest launches of each shape, microseconds (mean of the two rounds):')
        picks = {}
        for name, (K, N) in SHAPES.items():
            us = {}
            for r in rows:
                if r['layer'] == name and r['method'] != 'bf16':
                    us[r['method']] = us.get(r['method'], 0) + r['us'] / 2
            best = sorted(us.items(), key=lambda kv: kv[1])
            print(f'{name:8s} committed {us["int4 row (committed)"]:.2f} us; fastest: ' +
                  '; '.join(f'{k} {v:.2f}' for k, v in best[:3]), flush=True)
            grid_best = min((kv for kv in best if kv[0].startswith('staged B')), key=lambda kv: kv[1])
            picks[f'{N},{K}'] = dict(launch_of(grid_best[0]), us=round(grid_best[1], 2))
        (Path(a.out) / 'gemv_launch.json').write_text(json.dumps(picks, indent=1) + '\n')
    for rep in range(2):
        print(f'round {rep}:', flush=True)
        write_rows([dict(r, M=1) for r in rows if r['round'] == rep], Path(a.out) / f'gemv_row_ab_round{rep}.csv',
                   (1,))


if __name__ == '__main__':
    main()
