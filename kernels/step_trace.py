"""Where an offline throughput run's time goes, by batch size: each engine step timed, and the CUDA graph of each
batch size replayed alone.

    python kernels/step_trace.py --shapes qwen2.5-0.5b,llama-3.1-8b --workload sharegpt-like --num-requests 256 \
        [--assets DIR] [--out FILE]   # default: kernels/results/step_trace/<machine>/step_trace_<shapes>.json

The throughput benchmark's engine run (`run_engine`'s loop: the same workload, the same sampling parameters, the
engine's defaults, so async scheduling and CUDA graphs on a GPU), with every `step()` timed by perf_counter and the
number of live sequences after it recorded. The sharegpt-like workload's longest request fixes the number of steps
(~2,020), and most of them run few sequences: this says how much of the run's time those steps take, and whether
they are the host's time or the GPU's. For the GPU side, the captured decode graph of each batch size is replayed
back to back with CUDA events around it (whatever its buffers last held: the run's final contexts, so this is an
estimate of the model's GPU time per batch size, not of a given step), plus the LM head on that many rows.
With --log-compiles, every Triton kernel compiled (or loaded from Triton's disk cache) after the engine started is
listed per run, with the seconds it took: a first run on a fresh machine that is slower than the second is where
to look (set TRITON_CACHE_DIR to an empty folder to time real compiles).
"""
import argparse, gc, json, time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from paged_infer.bench.offline import bench_params, warm_up
from paged_infer.bench.workloads import make_random_model, make_workload
from paged_infer.core.config import EngineConfig
from paged_infer.core.engine import LLMEngine

sync = lambda: torch.cuda.is_available() and torch.cuda.synchronize()
BUCKETS = ((1, 1), (2, 8), (9, 32), (33, 64), (65, 128), (129, 256))


def trace(engine, workload):
    sched, times, live = engine.scheduler, [], []
    sync(); t0 = time.perf_counter()
    for r in workload.requests: engine.add_request(r.prompt_token_ids, bench_params(r))
    while engine.has_unfinished_requests():
        t = time.perf_counter(); engine.step(); times.append(time.perf_counter() - t)
        live.append(sum(not s.is_finished for g in sched.running for s in g.seqs))
    sync()
    return time.perf_counter() - t0, np.array(times), np.array(live)


COMPILES = []  # (kernel name, seconds, specialization key) of each compile since the list was last cleared


def log_compiles():
    "Record every Triton JIT compile (cache miss in the process) through triton.knobs' hooks, with its duration."
    from triton import knobs
    started = {}
    def pre(*, key, fn, **kw):
        started[(fn.name, str(key))] = time.perf_counter()
        return False  # go on and compile
    def post(*, key, fn, **kw):
        t0 = started.pop((fn.name, str(key)), None)
        COMPILES.append((fn.name, None if t0 is None else time.perf_counter() - t0, str(kw.get('repr', key))[:400]))
    knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = pre, post


def compile_report():
    names = defaultdict(lambda: [0, 0.0])
    for n, dt, _ in COMPILES: names[n][0] += 1; names[n][1] += dt or 0.0
    out = dict(count=len(COMPILES), seconds=sum(v[1] for v in names.values()), by_kernel={k: v for k, v in names.items()},
               keys=[c[2] for c in COMPILES[:40]])
    COMPILES.clear()
    return out


def graph_times(engine, reps=20):
    r, out = engine.runner, {}
    hid = engine.model.config.hidden_size
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for bs, g in sorted(r.graphs.graphs.items()):
        g.replay(); torch.cuda.synchronize(); s.record()
        for _ in range(reps): g.replay()
        e.record(); torch.cuda.synchronize()
        replay = s.elapsed_time(e) / reps
        h = torch.randn(bs, hid, device='cuda', dtype=engine.model.lm_head.weight.dtype)
        with torch.inference_mode():
            r.model.compute_logits(h); torch.cuda.synchronize(); s.record()
            for _ in range(reps): r.model.compute_logits(h)
            e.record(); torch.cuda.synchronize()
        out[bs] = dict(replay_ms=replay, logits_ms=s.elapsed_time(e) / reps)
    return out


def main():
    ap = argparse.ArgumentParser(description='Where an offline throughput run\'s time goes, by batch size.')
    ap.add_argument('--assets', default=None, help='a folder with a tokenizer for the random-weight models (default: the default model\'s, under ~/.cache/paged-infer)')
    ap.add_argument('--shapes', default='qwen2.5-0.5b')
    ap.add_argument('--workload', default='sharegpt-like')
    ap.add_argument('--num-requests', type=int, default=256)
    ap.add_argument('--repeats', type=int, default=2)
    ap.add_argument('--log-compiles', action='store_true')
    ap.add_argument('--out', default=None, help='JSON file (default: kernels/results/step_trace/<machine>/step_trace_<shapes>.json)')
    a = ap.parse_args()
    from lab import default_out, tokenizer_folder
    a.assets = tokenizer_folder(a.assets)
    if a.out is None: a.out = default_out('step_trace') / f"step_trace_{a.shapes.replace(',', '_')}.json"
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    if a.log_compiles: log_compiles()
    res = dict(device=torch.cuda.get_device_name(), workload=a.workload, num_requests=a.num_requests, shapes=[])
    w = make_workload(a.workload, a.num_requests)
    for name in a.shapes.split(','):
        folder = make_random_model(name, tokenizer_folder=a.assets, dtype='bfloat16', max_model_len=8192, seed=0)
        eng = LLMEngine(EngineConfig(model=str(folder), device='cuda'))
        if a.log_compiles: print(json.dumps(dict(shape=name, compiles_at_start=compile_report())), flush=True)
        warm_up(eng)
        runs = []
        for i in range(a.repeats):
            total, times, live = trace(eng, w)
            by = {}
            for lo, hi in BUCKETS:
                m = (live >= lo) & (live <= hi)
                by[f'{lo}-{hi}'] = dict(steps=int(m.sum()), seconds=float(times[m].sum()),
                                        median_ms=float(np.median(times[m]) * 1e3) if m.any() else None)
            by['0 (last)'] = dict(steps=int((live == 0).sum()), seconds=float(times[live == 0].sum()), median_ms=None)
            row = dict(shape=name, run=i, elapsed_s=total, steps=len(times), output_tok_s=sum(r.output_len for r in w.requests) / total,
                       by_live_seqs=by)
            if a.log_compiles: row['compiles'] = compile_report()
            print(json.dumps(row), flush=True)
            runs.append(row)
        gt = graph_times(eng)
        print(json.dumps(dict(shape=name, graph_gpu_ms={k: round(v['replay_ms'] + v['logits_ms'], 3) for k, v in gt.items()})), flush=True)
        res['shapes'].append(dict(shape=name, runs=runs, graphs=gt))
        eng.shutdown(); del eng; gc.collect(); torch.cuda.empty_cache()
    if a.out: Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == '__main__':
    main()
