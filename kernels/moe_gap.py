"""Where paged-infer's time goes on a mixture-of-experts shape, beside vLLM's: the throughput run, then the CUDA kernels
of a prefill and of decode steps, grouped by kernel name.

    python kernels/moe_gap.py --shape qwen3-30b-a3b --out DIR [--tokenizer .assets/smollm2] [--no-throughput]
                              [--qk-norm torch] [--device cuda]
    python kernels/moe_gap.py --summarize DIR/ours_qwen3-30b-a3b.json [benchmarks/.../vllm_profile.json ...]

1. The offline throughput benchmark as `benchmarks/bench.py throughput --shape SHAPE --load-format dummy
   --workload sharegpt-like --num-requests 256` runs it (the engine's defaults: CUDA graphs, async scheduling; the same
   warm-up and `run_engine`), written to DIR/ours_<shape>_throughput.json in the benchmark's format.
2. On the same engine, four small runs, each under torch.profiler (CUDA activity only, so the kernels inside CUDA
   graph replays are listed by name): `p128`, 128 requests of 512 random prompt tokens and 1 output token (a prefill of
   65,536 tokens in the engine's chunks); `d128`, the same with 33 output tokens (so d128 - p128 is 32 decode steps at
   batch 128); `p16` and `d16` alike with 16 requests. Each run's wall time (synchronized) and its kernels: name,
   launches, total microseconds. `d128_eager` repeats d128 with the decode graphs set aside (eager decode steps).
   benchmarks/peer/profile_vllm.py runs the same four workloads on vLLM, with the same profiler, inside vLLM's worker.
3. `--summarize` groups each file's kernels into categories (attention, expert GEMMs, layout, routing, norms, rotary,
   dense GEMMs, sampler, ...) and prints per-step tables: the prefill per 1,000 prompt tokens (p128) and a decode
   step ((d - p) / 32), in microseconds, one column per file.
`--qk-norm torch` puts back the per-head q/k RMSNorm of torch operations (eight launches a norm) that chapter 7's
attention used before it called the fused norm (`ops.add_rms_norm`), to measure the difference in one session.
"""
import argparse, gc, json, re, time
from collections import defaultdict
from pathlib import Path

import numpy as np

RUNS = (('p128', 128, 1), ('d128', 128, 33), ('p16', 16, 1), ('d16', 16, 33))  # name, requests, output tokens
PROMPT = 512
DECODE_STEPS = 32
CATEGORIES = (  # (category, pattern on the kernel's name), the first match wins; for paged-infer's and vLLM's kernels
    ('experts: grouped GEMMs', r'moe_gemm|fused_moe_kernel|moe_mm|grouped_gemm'),
    ('experts: layout (align)', r'align|count_and_sort|sort_expert|moe_align'),
    ('experts: routing (softmax, top-k)', r'route_kernel|topk|gating|top_k'),
    ('experts: k-sum', r'moe_sum'),
    ('attention', r'decode_kernel|decode_reduce|prefill_kernel|flash|fmha|attn|attention'),
    ('KV store', r'store_kv|reshape_and_cache|cache_kernel|concat_and_cache'),
    ('RMS norm', r'rms|rsqrt|norm'),
    ('rotary', r'rotary|rope|cos|sin'),
    ('SiLU and mul', r'silu|act_and_mul'),
    ('dense GEMMs (qkv, o, router, lm head)', r'gemm|nvjet|xmma|cutlass|cublas|sm90|sm80|splitk|gemv|wgmma'),
    ('sampler', r'argmax|sampl|gumbel|exponential|multinomial|sort|scan|cumsum|log_softmax|softmax'),
    ('fused elementwise (inductor)', r'^triton_'),
    ('reductions (torch sum, mean)', r'reduce'),
    ('copies, casts, elementwise (torch)', r'elementwise|copy|vectorized|unrolled|index|cat|fill|memset|memcpy'),
    ('other', r'.'),
)


def category(name: str) -> str:
    n = name.lower()
    return next(c for c, pat in CATEGORIES if re.search(pat, n))


def kernel_table(prof, cpu: bool = False) -> list:
    "[name, launches, total us] of every device event the profiler saw (CPU operators with `cpu`), largest first."
    rows = []
    for e in prof.key_averages():
        us = e.self_cpu_time_total if cpu else getattr(e, 'self_device_time_total', None)
        if us is None:
            us = getattr(e, 'self_cuda_time_total', 0.0)
        if us > 0:
            rows.append([e.key, int(e.count), float(us)])
    return sorted(rows, key=lambda r: -r[2])


def profiled(fn, device: str):
    "Run fn under torch.profiler: (wall seconds, kernel table)."
    import torch
    from torch.profiler import ProfilerActivity, profile
    sync = torch.cuda.synchronize if device == 'cuda' else (lambda: None)
    acts = [ProfilerActivity.CUDA] if device == 'cuda' else [ProfilerActivity.CPU]
    sync()
    with profile(activities=acts) as prof:
        t0 = time.perf_counter(); fn(); sync(); dt = time.perf_counter() - t0
    return dt, kernel_table(prof, cpu=device != 'cuda')


def profile_runs(engine, vocab: int, device: str, prompt: int = PROMPT, seed: int = 1, runs=RUNS) -> dict:
    "The four runs of the docstring (random prompts, fresh for each run), profiled on `engine`."
    from paged_infer.core.sampling_params import RequestOutputKind, SamplingParams
    rng = np.random.default_rng(seed)

    def run(n, out):
        def go():
            p = SamplingParams(temperature=0.0, max_tokens=out, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)
            for _ in range(n):
                engine.add_request(rng.integers(100, vocab, prompt).tolist(), p)
            while engine.has_unfinished_requests():
                engine.step()
        return go

    res = {}
    run(8, 4)()  # warm: the sizes these runs use
    for name, n, out in runs:
        dt, table = profiled(run(n, out), device)
        res[name] = dict(requests=n, prompt=prompt, output=out, wall_s=dt, kernels=table)
        print(f'{name}: {dt * 1e3:.1f} ms, {sum(r[2] for r in table) / 1e3:.1f} ms of kernels', flush=True)
    graphs = engine.runner.graphs
    engine.runner.graphs = None  # eager decode steps
    try:
        dt, table = profiled(run(*runs[1][1:]), device)
    finally:
        engine.runner.graphs = graphs
    res['d128_eager'] = dict(requests=runs[1][1], prompt=prompt, output=runs[1][2], wall_s=dt, kernels=table)
    print(f'd128_eager: {dt * 1e3:.1f} ms, {sum(r[2] for r in table) / 1e3:.1f} ms of kernels', flush=True)
    return res


def torch_qk_norm():
    "Chapter 7's attention with the per-head q/k norms as torch operations (RMSNorm.forward), as before the fused norm."
    from paged_infer.model import llama

    def forward(self, x, cos, sin, kv_cache, meta, attn_fn, store_fn, ops=llama.LayerOps()):
        T, D = x.shape[0], self.head_dim
        if hasattr(self, 'qkv_proj'):
            q, k, v = self.qkv_proj(x).split([self.num_heads * D, self.num_kv_heads * D, self.num_kv_heads * D], -1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k, v = q.view(T, self.num_heads, D), k.view(T, self.num_kv_heads, D), v.view(T, self.num_kv_heads, D)
        if hasattr(self, 'q_norm'):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = ops.rotary(q, k, cos, sin)
        k_cache, v_cache = kv_cache
        store_fn(k, v, k_cache, v_cache, meta.slot_mapping)
        o = attn_fn(q, k_cache, v_cache, meta, self.scale)
        return self.o_proj(o.reshape(T, -1))

    llama.Attention.forward = forward


def check_qk_norm(device: str) -> dict:
    "The fused per-head norm against the torch one, on a strided view of fresh random (T, H, D) heads, bf16 on a GPU."
    import torch
    from paged_infer.model.llama import add_rms_norm_torch
    ops = None
    if device == 'cuda':
        from paged_infer.ops.fused_layers import add_rms_norm
        ops = add_rms_norm
    else:
        ops = add_rms_norm_torch
    out = {}
    dt = torch.bfloat16 if device == 'cuda' else torch.float32
    for T in (1, 37, 2048):
        qkv = torch.randn(T, 40 * 128, device=device, dtype=dt) * 3
        q = qkv[:, : 32 * 128].view(T, 32, 128)
        w = torch.rand(128, device=device, dtype=dt) + 0.5
        ref = add_rms_norm_torch(q.double(), w.double(), 1e-6)
        got = ops(q.reshape(-1, 128), w, 1e-6).view(T, 32, 128)
        old = add_rms_norm_torch(q, w, 1e-6)
        rel = lambda a: float((a.double() - ref).norm() / ref.norm())
        out[T] = dict(fused_vs_f64=rel(got), torch_vs_f64=rel(old), fused_vs_torch_max=float((got - old).abs().max()))
    print('qk-norm check', json.dumps(out), flush=True)
    return out


def main_run(a):
    import torch
    from paged_infer.bench.offline import machine_info, run_engine, warm_up
    from paged_infer.bench.workloads import make_random_model, make_workload
    from paged_infer.core.config import EngineConfig
    from paged_infer.core.engine import LLMEngine
    if a.qk_norm == 'torch':
        torch_qk_norm()
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    res = dict(shape=a.shape, qk_norm=a.qk_norm, machine=machine_info(), qk_norm_check=check_qk_norm(a.device))
    folder = make_random_model(a.shape, a.model_dir, a.tokenizer, 'bfloat16' if a.device == 'cuda' else 'float32',
                               max_model_len=8192, seed=0, weights=False)
    cfg = EngineConfig(model=str(folder), device=a.device, load_format='dummy', **(dict(num_gpu_blocks=512) if a.device == 'cpu' else {}))
    t0 = time.perf_counter()
    engine = LLMEngine(cfg)
    res['engine_start_s'] = time.perf_counter() - t0
    try:
        warm_up(engine)
        if not a.no_throughput:
            w = make_workload('sharegpt-like', a.num_requests)
            m, _ = run_engine(engine, w, progress=False)
            import dataclasses
            bench = dict(kind='throughput', workload=w.summary(), engine_config=dataclasses.asdict(cfg), backend='engine',
                         machine=res['machine'], engine=m, engine_num_gpu_blocks=engine.num_gpu_blocks,
                         qk_norm=a.qk_norm)
            (out / f'ours_{a.shape}_throughput{a.tag}.json').write_text(json.dumps(bench, indent=1, default=str) + '\n')
            res['throughput'] = {k: m[k] for k in ('elapsed_s', 'output_tokens_per_s', 'total_tokens_per_s', 'steps',
                                                   'mean_running_seqs')}
            print('THROUGHPUT', json.dumps(res['throughput']), flush=True)
        runs = [(k, int(n), int(o)) for k, n, o in (r.split(':') for r in a.runs.split(','))] if a.runs else RUNS
        res['runs'] = profile_runs(engine, engine.model.config.vocab_size, a.device, a.prompt, runs=runs)
    finally:
        engine.shutdown()
    path = out / f'ours_{a.shape}{a.tag}.json'
    path.write_text(json.dumps(res, indent=1) + '\n')
    print(summarize([path]))
    del engine; gc.collect()
    if a.device == 'cuda':
        torch.cuda.empty_cache()


def per_step(run: dict) -> dict:
    "Microseconds of kernels by category in one profiled run."
    by = defaultdict(float)
    for name, _, us in run['kernels']:
        by[category(name)] += us
    return by


def summarize(paths, top: int = 12) -> str:
    "Per-category tables (prefill per 1,000 tokens; a decode step at batch 128 and 16), one column per file."
    files = [json.loads(Path(p).read_text()) for p in paths]
    label = [f.get('label') or Path(p).stem for f, p in zip(files, paths)]
    cats = [c for c, _ in CATEGORIES]
    lines = []
    for title, fn in (
        ('prefill, us per 1,000 prompt tokens (p128)', lambda r: {k: v / (r['p128']['requests'] * r['p128']['prompt'] / 1000) for k, v in per_step(r['p128']).items()}),
        ('decode step at batch 128, us ((d128 - p128) / 32)', lambda r: _diff(r, 'd128', 'p128')),
        ('decode step at batch 128, eager, us ((d128_eager - p128) / 32)', lambda r: _diff(r, 'd128_eager', 'p128') if 'd128_eager' in r else {}),
        ('decode step at batch 16, us ((d16 - p16) / 32)', lambda r: _diff(r, 'd16', 'p16')),
    ):
        cols = [fn(f['runs']) for f in files]
        lines += [f'\n{title}', '| kernels | ' + ' | '.join(label) + ' |', '|---|' + '---|' * len(files)]
        for c in cats:
            if any(abs(col.get(c, 0)) >= 0.5 for col in cols):
                lines.append(f'| {c} | ' + ' | '.join(f"{col.get(c, 0):,.1f}" for col in cols) + ' |')
        lines.append('| all kernels | ' + ' | '.join(f'{sum(col.values()):,.1f}' for col in cols) + ' |')
    lines.append('\nwall ms: ' + '; '.join(f"{lb}: " + ', '.join(f"{k} {v['wall_s'] * 1e3:.0f}" for k, v in f['runs'].items())
                                          for lb, f in zip(label, files)))
    for lb, f in zip(label, files):
        r = f['runs']
        if 'd128' in r:
            d = defaultdict(lambda: [0, 0.0])
            for name, n, us in r['d128']['kernels']:
                d[name][0] += n; d[name][1] += us
            for name, n, us in r['p128']['kernels']:
                d[name][0] -= n; d[name][1] -= us
            rows = sorted(d.items(), key=lambda kv: -kv[1][1])[:top]
            lines.append(f'\n{lb}: top kernels of a decode step at batch 128 (launches, us per step)')
            lines += [f'  {n / DECODE_STEPS:7.1f} {us / DECODE_STEPS:9.1f}  {category(name)[:18]:18}  {name[:100]}' for name, (n, us) in rows]
    return '\n'.join(lines)


def _diff(r, d, p):
    a, b = per_step(r[d]), per_step(r[p])
    return {k: (a.get(k, 0) - b.get(k, 0)) / DECODE_STEPS for k in set(a) | set(b)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--shape', default='qwen3-30b-a3b')
    ap.add_argument('--out', default=None)
    ap.add_argument('--tokenizer', default='.assets/smollm2')
    ap.add_argument('--model-dir', default=None)
    ap.add_argument('--device', default='cuda')
    ap.add_argument('--num-requests', type=int, default=256)
    ap.add_argument('--prompt', type=int, default=PROMPT)
    ap.add_argument('--no-throughput', action='store_true')
    ap.add_argument('--runs', default=None, help='NAME:REQUESTS:OUTPUT,... in place of the four runs (a CPU check)')
    ap.add_argument('--qk-norm', default='fused', choices=('fused', 'torch'))
    ap.add_argument('--tag', default='', help='suffix of the output files')
    ap.add_argument('--summarize', nargs='+', default=None, help='result files (ours and vLLM\'s) to tabulate')
    a = ap.parse_args()
    if a.summarize:
        print(summarize(a.summarize))
    else:
        main_run(a)


if __name__ == '__main__':
    main()
