"""The engine on the Llama-3.1-8B shape with random weights in each quantization (load_format dummy), and real vLLM
with the same quantization beside it: weight memory, the decode step at batch 1, 16 and 256 (128 prompt tokens,
32 output tokens, greedy: `run_latency`), and offline throughput on the sharegpt-like workload.

    python kernels/quant_engine_bench.py --tokenizer DIR [--methods bf16,awq,gptq,gptq-lm-head,fp8]
        [--engines ours,vllm] [--requests 256] [--out DIR] [--trace DIR]

gptq-lm-head: GPTQ with the output layer quantized too (its config.json says `lm_head: true`, as gptqmodel writes).

vLLM runs through chapter 17e's peer (`PAGED_INFER_VLLM_PYTHONPATH`, e.g. /tmp/site), one vLLM process a method
for all of its measurements (kernels/quant_vllm_suite.py), on the same token ids and output lengths.
Writes engine.json (ours) and vllm.json (vLLM), one row per method, into --out.
"""
import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from paged_infer.bench.offline import latency_inputs, latency_stats, run_engine, run_latency  # noqa: E402
from paged_infer.bench.vllm_peer import engine_spec, latency_spec, peer_env, peer_python, throughput_spec  # noqa: E402
from paged_infer.bench.workloads import make_random_model, make_workload  # noqa: E402
from paged_infer.core.config import EngineConfig  # noqa: E402
from paged_infer.core.engine import LLMEngine  # noqa: E402
from paged_infer.ops import quant_gemm  # noqa: E402
from quant_weight_bytes import weight_bytes, with_lm_head_quantized  # noqa: E402  (kernels/ is on the path)

PROMPT, OUTPUT = 128, 32


def model_folder(folder, method) -> Path:
    "The folder a method loads: gptq-lm-head's config.json names GPTQ with a quantized output layer."
    return with_lm_head_quantized(folder) if method == 'gptq-lm-head' else folder


def config(folder, method) -> EngineConfig:
    q = None if method in ('bf16', 'gptq-lm-head') else method  # (gptq-lm-head: read from its config.json)
    return EngineConfig(model=str(model_folder(folder, method)), load_format='dummy', quantization=q,
                        max_model_len=2048, gpu_memory_utilization=0.85)


def kernel_table(run, path: Path) -> dict:
    """`run()` once more under the torch profiler: each GPU kernel's time over the run (on a CPU: each operator's),
    written to `path`, against the run's wall time. Not a measured run: profiling slows the host."""
    from torch.profiler import ProfilerActivity, profile
    gpu = torch.cuda.is_available()
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    sync()
    with profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        run()
        sync()
        wall = time.perf_counter() - t0
    rows = []
    for e in prof.key_averages():
        us = e.self_device_time_total if gpu else e.self_cpu_time_total  # (a CPU run: its operators, for a check)
        if us > 0:
            rows.append((us, e.count, e.key))
    rows.sort(reverse=True)
    gpu_s = sum(r[0] for r in rows) / 1e6
    lines = [f"wall {wall:.3f} s, GPU kernels {gpu_s:.3f} s ({gpu_s / wall:.0%} of the wall) under the profiler",
             f"{'GPU ms':>10} {'share':>6} {'calls':>8}  kernel"]
    for us, n, name in rows[:40]:
        lines.append(f'{us / 1e3:10.1f} {us / 1e6 / gpu_s:6.1%} {n:8d}  {name[:150]}')
    path.write_text('\n'.join(lines) + '\n')
    print(*lines[:12], sep='\n', flush=True)
    return dict(wall_s=round(wall, 3), gpu_kernel_s=round(gpu_s, 3))


def ours(folder, method, batch_sizes, workload, trace: Path | None = None) -> dict:
    engine = LLMEngine(config(folder, method))
    wb = weight_bytes(engine.model)
    row = dict(method=method, weight_GB=round(wb / 1e9, 3), steps={})
    for bs in batch_sizes:
        r = run_latency(engine, bs, PROMPT, OUTPUT, num_iters=3, progress=False)
        row['steps'][str(bs)] = r['decode_step_ms']
        print(f"ours {method:5s} weights {wb / 1e9:6.2f} GB  batch {bs:4d}: decode step median "
              f"{r['decode_step_ms']['median']:.3f} ms", flush=True)
    if workload is not None:
        m, _ = run_engine(engine, workload, progress=False)
        row['throughput'] = {k: m[k] for k in ('elapsed_s', 'output_tokens_per_s', 'total_tokens_per_s')}
        print(f"ours {method:5s} {len(workload)} sharegpt-like requests: {m['output_tokens_per_s']:.0f} out tok/s",
              flush=True)
        if trace is not None:
            trace.mkdir(parents=True, exist_ok=True)
            row['profiled'] = kernel_table(partial(run_engine, engine, workload, progress=False),
                                           trace / f'kernels_{method}.txt')
    if trace is not None:  # the batch-1 decode: where its step goes (two iterations, one of them warm-up)
        trace.mkdir(parents=True, exist_ok=True)
        row['profiled_b1'] = kernel_table(partial(run_latency, engine, 1, PROMPT, OUTPUT, num_iters=1, progress=False),
                                          trace / f'kernels_{method}_b1.txt')
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    return row


def vllm(folder, method, batch_sizes, workload, out: Path) -> dict:
    "One vLLM process for the method: its latency at each batch size, then the throughput run."
    engine = engine_spec(config(folder, method), model_folder(folder, method), 'dummy', 0.85)
    vocab = json.loads((folder / 'config.json').read_text())['vocab_size']
    parts = [latency_spec(latency_inputs(bs, PROMPT, 3, 0, vocab), OUTPUT, engine) for bs in batch_sizes]
    if workload is not None:
        parts.append(throughput_spec(workload, engine))
    spec = dict(engine, parts=parts)
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / 'spec.json').write_text(json.dumps(spec))
        cmd = [peer_python(), str(ROOT / 'kernels' / 'quant_vllm_suite.py'), f'{d}/spec.json', f'{d}/out.json']
        subprocess.run(cmd, check=True, env=peer_env())
        res = json.loads((Path(d) / 'out.json').read_text())
    row = dict(method=method, vllm_version=res['vllm_version'], init_s=res['init_s'], quant=res['quant'], steps={})
    for bs, r in zip(batch_sizes, res['parts']):
        row['steps'][str(bs)] = latency_stats(r['decode_step_s'])
        print(f"vllm {method:5s} batch {bs:4d}: decode step median {row['steps'][str(bs)]['median']:.3f} ms",
              flush=True)
    if workload is not None:
        t = res['parts'][-1]
        row['throughput'] = {k: t[k] for k in ('elapsed_s', 'output_tokens_per_s', 'total_tokens_per_s')}
        print(f"vllm {method:5s} sharegpt-like: {t['output_tokens_per_s']:.0f} out tok/s", flush=True)
    return row


def launch_for(config, picks: dict, M, N, K, group, **kw) -> dict:
    """`int_gemv_config` (`config`) with the launch `picks` names for this (N, K), if any (its keys: 'N,K'); a pick's
    `stages` goes to the kernel as STAGES (`_gemv_staged` only)."""
    pick = {k: v for k, v in picks.get(f'{N},{K}', {}).items() if k != 'us'}
    stages = pick.pop('stages', None)
    c = config(M, N, K, group, **{**kw, **pick})
    return c if stages is None else dict(c, STAGES=stages)


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--tokenizer', required=True)
    p.add_argument('--methods', default='bf16,awq,gptq,fp8')
    p.add_argument('--engines', default='ours', help='ours, vllm, or both: ours,vllm')
    p.add_argument('--shape', default='llama-3.1-8b')
    p.add_argument('--batch-sizes', default='1,16,256')
    p.add_argument('--requests', type=int, default=256, help='sharegpt-like requests for throughput; 0: none')
    p.add_argument('--out', default='kernels/results/quant/h200')
    p.add_argument('--name', default='engine.json', help='the file our rows go to, in --out')
    p.add_argument('--gemv-rows', type=int, help='quant_gemm.GEMV_ROWS for this run (default: as committed)')
    p.add_argument('--trace', help='a folder: after the throughput run, the same run under the torch profiler, '
                   "each kernel's GPU time written to kernels_<method>.txt there; and one batch-1 latency run, "
                   'to kernels_<method>_b1.txt')
    p.add_argument('--gemv-kernel', choices=['committed', 'staged'], default='committed',
                   help="staged: kernels/gemv_row_ab.py's `_gemv_staged` in place of the row kernel, for this run")
    p.add_argument('--gemv-launch', help="gemv_launch.json of kernels/gemv_row_ab.py --grid: the row kernel's launch "
                   'for each (N, K) it lists, for this run')
    p.add_argument('--fp8-kernel', choices=['committed', 'plain'], default='committed',
                   help="plain: kernels/fp8_rows_ab.py's `_fp8_plain_kernel` (x @ w.T, as committed until 2026-12-08) "
                   "for `_fp8_gemm_kernel`, at its launch of then")
    p.add_argument('--fp8-dot-rows', type=int, help='quant_gemm.FP8_DOT_ROWS for this run')
    p.add_argument('--int-tiles', help="int_tiles.json of kernels/quant_tile_sweep.py: quant_gemm.INT_TILES for this "
                   "run (a pick for a row count comes before the whole weight unpacked, as in int_gemm)")
    a = p.parse_args()
    if a.int_tiles:
        quant_gemm.INT_TILES = {int(m): c for m, c in json.loads(Path(a.int_tiles).read_text()).items()}
    settings = dict(GEMV_ROWS=quant_gemm.GEMV_ROWS, FP8_DOT_ROWS=quant_gemm.FP8_DOT_ROWS,
                    DEQUANT_ROWS=quant_gemm.DEQUANT_ROWS, INT_TILES=quant_gemm.INT_TILES)
    if a.gemv_rows is not None:
        settings['GEMV_ROWS'] = quant_gemm.GEMV_ROWS = a.gemv_rows
    if a.fp8_dot_rows is not None:
        settings['FP8_DOT_ROWS'] = quant_gemm.FP8_DOT_ROWS = a.fp8_dot_rows
    if a.gemv_kernel == 'staged':
        from gemv_row_ab import _gemv_staged  # (kernels/ is on the path)
        quant_gemm._int_gemv_kernel = _gemv_staged  # the same arguments and STAGES; `int_gemm` looks it up when called
    settings['gemv_kernel'] = a.gemv_kernel
    if a.fp8_kernel == 'plain':
        from fp8_rows_ab import PLAIN_LAUNCH, _fp8_plain_kernel
        quant_gemm._fp8_gemm_kernel = _fp8_plain_kernel  # the same arguments; `fp8_dot` looks it up when called
        quant_gemm.fp8_gemm_config = partial(quant_gemm.fp8_gemm_config, **PLAIN_LAUNCH)
    settings['fp8_kernel'] = a.fp8_kernel
    if a.gemv_launch:
        picks = json.loads(Path(a.gemv_launch).read_text())
        settings['gemv_launch'] = picks
        quant_gemm.int_gemv_config = partial(launch_for, quant_gemm.int_gemv_config, picks)
    print('settings:', settings)
    folder = make_random_model(a.shape, tokenizer_folder=a.tokenizer, weights=False)
    vocab = json.loads((folder / 'config.json').read_text())['vocab_size']
    workload = make_workload('sharegpt-like', a.requests, vocab_size=vocab) if a.requests else None
    batch_sizes = [int(b) for b in a.batch_sizes.split(',')]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'
    trace = Path(a.trace) if a.trace else None
    for engine in a.engines.split(','):
        path = out / (a.name if engine == 'ours' else 'vllm.json')
        old = json.loads(path.read_text()) if path.exists() else {}
        rows = old['results'] if old.get('shape') == a.shape else []  # other methods of the same shape are kept
        for method in a.methods.split(','):
            row = ours(folder, method, batch_sizes, workload, trace) if engine == 'ours' else vllm(
                folder, method, batch_sizes, workload, out)
            rows = [r for r in rows if r['method'] != method] + [row]
            path.write_text(json.dumps(dict(device=device, shape=a.shape, prompt=PROMPT, output=OUTPUT,
                                            requests=a.requests, settings=settings, results=rows), indent=1))
        base = {r['method']: r for r in rows}.get('bf16')
        for r in rows:
            if base:
                ratios = {bs: round(r['steps'][bs]['median'] / base['steps'][bs]['median'], 3) for bs in r['steps']
                          if bs in base['steps']}
                tp = r.get('throughput', {}).get('output_tokens_per_s')
                tb = base.get('throughput', {}).get('output_tokens_per_s')
                print(f"{engine} {r['method']:5s} decode step vs bf16 {ratios}"
                      + (f"; throughput {tp / tb:.2f}x" if tp and tb else '')
                      + (f"; weights {r['weight_GB'] / base['weight_GB']:.2f}x" if 'weight_GB' in r else ''))


if __name__ == '__main__':
    os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')
    main()
