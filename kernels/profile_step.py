"""Where a decode step's time goes, on a GPU: host phases timed with perf_counter, the graph replay with CUDA events.

    python kernels/profile_step.py --shapes qwen2.5-0.5b,llama-3.1-8b --batch 256 --context 512 --modes sync,async \
        [--assets DIR] [--out FILE] [--trace DIR]   # default: kernels/results/step_profile/<machine>/profile_<shapes>_b256_ctx512.json

A random-weight model of each shape (`make_random_model`, the folder the throughput benchmark uses); `batch`
requests of `context` random prompt tokens are prefilled, then the engine runs decode steps (CUDA graphs on), first
waiting for every step (sync), then with async scheduling (the next step scheduled and launched while this one
runs), and each phase of a step is timed with perf_counter: scheduling, building the sampling batch, building the
flat batch and replaying the graph (`_decode_with_graph`, the host's side of it), the logits, the sampler (launches),
the wait for the sampled tokens (`wait`: where the host idles while the GPU works), and the engine's postprocessing
(bookkeeping, detokenization, outputs). A mode `multiK` (e.g. `multi8`) is async scheduling with K decode steps per
launch (multi-step, `num_scheduler_steps`): its step time is a call's time over the decode steps it launched (it runs
`--steps` decode steps, `--steps` / K calls, like the other modes), its phases are per call (one schedule and postprocess, K logits and samplers, K - 1 `advance`s of the graph's inputs). Sampling is greedy, as in the throughput benchmark. Separately, the graph
of the batch is replayed back to back with CUDA events around it: the GPU's own time for the model, against the
memory-bandwidth floor (weight bytes + KV bytes read, over the copy bandwidth measured in the same run). The host's
share of a step is 1 - GPU time / step time: the part of the step the GPU is not working on the model; with the
sampler's kernels (timed the same way, on the step's own sampling batch) counted as GPU time too, a second figure. Requests
ask for their output only when finished (RequestOutputKind.FINAL_ONLY), as in the throughput benchmark. With
--trace, the torch profiler's top kernels of 5 graph replays and of 5 eager forwards of the same batch are written
to kernels_<shape>.txt in that folder.
Each mode's row also has `cpu_probe_ms`, a fixed pure-Python workload timed before and after its steps: the host's
speed then, so that a slow host can be told from a slow change.
"""
import argparse, gc, json, statistics, time
from collections import defaultdict
from pathlib import Path

import torch

from paged_infer.worker import model_runner as mr
from paged_infer.bench.workloads import make_random_model
from paged_infer.core.engine import LLMEngine
from paged_infer.core.sampling_params import RequestOutputKind, SamplingParams


def copy_bandwidth() -> float:
    x = torch.empty(2**30, dtype=torch.uint8, device='cuda'); y = torch.empty_like(x)
    for _ in range(3): y.copy_(x)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(20): y.copy_(x)
    e.record(); torch.cuda.synchronize()
    return 2 * 2**30 * 20 / (s.elapsed_time(e) / 1e3)  # bytes read + written per second


def cpu_probe_ms(reps: int = 5) -> float:
    "Median ms of a fixed pure-Python workload (attribute writes, dict stores, over 256 objects, 200 times: ~2 ms): how fast the host runs Python right now, to tell a slow host from a slow change (session 7 saw one machine's host phases at half speed, then full)."
    class Row: __slots__ = ('a', 'b')
    rows, ts = [Row() for _ in range(256)], []
    for _ in range(reps):
        t0, d = time.perf_counter(), {}
        for _ in range(200):
            for i, o in enumerate(rows): o.a = i; o.b = o.a + 1; d[i] = o.b
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def timed(table, key, fn):
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try: return fn(*a, **k)
        finally: table[key].append(time.perf_counter() - t0)
    return wrapper


def main():
    ap = argparse.ArgumentParser(description='Where a decode step\'s time goes, on a GPU.')
    ap.add_argument('--assets', default=None, help='a folder with a tokenizer for the random-weight models (default: the default model\'s, under ~/.cache/paged-infer)')
    ap.add_argument('--shapes', default='qwen2.5-0.5b,llama-3.1-8b')
    ap.add_argument('--batch', type=int, default=256)
    ap.add_argument('--context', type=int, default=512)
    ap.add_argument('--steps', type=int, default=40)
    ap.add_argument('--modes', default='sync,async')
    ap.add_argument('--trace', default=None, help='a folder: write the top kernels (torch profiler) there')
    ap.add_argument('--out', default=None, help='JSON file (default: kernels/results/step_profile/<machine>/profile_<shapes>_b<batch>_ctx<context>.json)')
    a = ap.parse_args()
    from lab import default_out, tokenizer_folder
    a.assets = tokenizer_folder(a.assets)
    if a.out is None: a.out = default_out('step_profile') / f"profile_{a.shapes.replace(',', '_')}_b{a.batch}_ctx{a.context}.json"
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    if a.trace: Path(a.trace).mkdir(parents=True, exist_ok=True)
    bw = copy_bandwidth()
    res = dict(device=torch.cuda.get_device_name(), copy_TBps=bw / 1e12, batch=a.batch, context=a.context, shapes=[])
    rows = []
    for name in a.shapes.split(','):
        folder = make_random_model(name, tokenizer_folder=a.assets, dtype='bfloat16', max_model_len=8192, seed=0, device='cuda')
        eng = LLMEngine(model=str(folder), device='cuda', max_num_seqs=a.batch, max_num_batched_tokens=8192, max_model_len=4096)
        cfg, r = eng.model.config, eng.runner
        g = torch.Generator().manual_seed(0)
        for i in range(a.batch):
            eng.add_request(torch.randint(0, cfg.vocab_size, (a.context,), generator=g).tolist(),
                            SamplingParams(temperature=0, max_tokens=4096 - a.context - 8, ignore_eos=True,
                                           output_kind=RequestOutputKind.FINAL_ONLY))  # as the throughput benchmark
        while eng.scheduler.waiting or any(s.num_tokens == s.num_prompt_tokens for gr in eng.scheduler.running for s in gr.seqs): eng.step()
        for mode in a.modes.split(','):
            eng.config.async_scheduling = mode != 'sync'
            eng.config.num_scheduler_steps = int(mode[5:]) if mode.startswith('multi') else 1  # 'multi8': async, 8 steps a launch
            for _ in range(3): eng.step()  # settle into the mode
            t = defaultdict(list)
            patches = [(eng.scheduler, 'schedule'), (r, '_decode_with_graph'), (r.model, 'compute_logits'), (r, 'sampler'), (r.graphs, 'advance'),
                       (eng, '_postprocess'), ((r, 'sampling_batch') if hasattr(r, 'sampling_batch') else (mr.SamplingBatch, 'from_params')), (mr.StepFuture, 'result')]
            saved = [(o, k, getattr(o, k)) for o, k in patches]
            for o, k, f in saved: setattr(o, k, timed(t, {'from_params': 'sampling_batch', 'result': 'wait'}.get(k, k), f))
            k = eng.config.num_scheduler_steps
            steps, probe = [], [cpu_probe_ms()]
            # a step() of multi-step launches k decode steps: its time per decode step is recorded; a.steps decode steps
            # in every mode (a.steps // k calls), so each mode's contexts grow alike and the GPU time measured after it
            # is as far from the window's middle in every mode
            for _ in range(max(1, a.steps // k)):
                t0 = time.perf_counter(); eng.step(); dt = time.perf_counter() - t0
                f = eng.inflight.out if eng.inflight is not None else None
                steps.append(dt / (max(f.num_steps) if f is not None and f.num_steps else 1))
            probe.append(cpu_probe_ms())
            for o, k, f in saved: setattr(o, k, f)
            # the graph alone, replayed back to back, and the LM head: the GPU's time at this mode's context (each mode's
            # steps make the contexts longer: a multi-step mode runs k times as many decode steps)
            live = [q for grp in eng.scheduler.running for q in grp.seqs]
            ctx_now = statistics.mean(q.num_tokens for q in live)
            eng.config.async_scheduling = False; eng.config.num_scheduler_steps = 1; eng.step()  # nothing in flight
            gr = r.graphs.graphs[next(b for b in r.graphs.sizes if b >= a.batch)]
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            torch.cuda.synchronize(); ev[0].record()
            for _ in range(20): gr.replay()
            ev[1].record()
            h = torch.randn(a.batch, cfg.hidden_size, device='cuda', dtype=torch.bfloat16)
            with torch.inference_mode():
                r.model.compute_logits(h); ev[2].record()
                for _ in range(20): r.model.compute_logits(h)
                ev[3].record(); torch.cuda.synchronize()
            rows.append((name, mode, steps, t, probe, ev[0].elapsed_time(ev[1]) / 20, ev[2].elapsed_time(ev[3]) / 20, ctx_now))
        eng.config.async_scheduling = False; eng.config.num_scheduler_steps = 1; eng.step()  # nothing in flight
        bs = next(b for b in r.graphs.sizes if b >= a.batch)
        gr = r.graphs.graphs[bs]
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        h = torch.randn(a.batch, cfg.hidden_size, device='cuda', dtype=torch.bfloat16)
        sampler_ms = None  # the sampler's kernels on the step's batch (greedy, as timed above), back to back
        last = getattr(r, 'last_sampling', None)
        if last is not None and len(last[0]) == a.batch:
            with torch.inference_mode():
                lg = r.model.compute_logits(h); r.sampler(lg, last[1]); torch.cuda.synchronize(); s.record()
                for _ in range(20): r.sampler(lg, last[1])
                e.record(); torch.cuda.synchronize()
            sampler_ms = s.elapsed_time(e) / 20
        if a.trace:  # which kernels make the GPU time: the graph replayed, and one eager forward of the same batch
            from torch.profiler import ProfilerActivity, profile
            live, bm = [q for grp in eng.scheduler.running for q in grp.seqs if not q.is_finished], eng.block_manager
            for q in live:  # a slot for each one's next token, as the next schedule would give (the engine is done after this)
                if k := q.num_tokens - bm.tables[q.seq_id].num_tokens: bm.append_slots(q.seq_id, k)
            host, _ = r.host_batch(live, [1] * len(live), [eng.block_manager.tables[q.seq_id].blocks for q in live])
            for what, fn in (('graph replay', gr.replay), ('eager forward + logits', lambda: r.run_batch(host))):
                fn(); torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(5): fn()
                    torch.cuda.synchronize()
                table = prof.key_averages().table(sort_by='self_cuda_time_total', row_limit=30, max_name_column_width=90)
                Path(a.trace, f'kernels_{name}.txt').open('a').write(f'== {name}, batch {a.batch}, {what}, 5 runs ==\n{table}\n')
        weight_bytes = sum(p.numel() * p.element_size() for n, p in r.model.named_parameters() if 'embed_tokens' not in n or cfg.tie_word_embeddings)
        med = lambda xs: statistics.median(xs) * 1e3 if xs else 0.0
        for shape, mode, steps, t, probe, replay_ms, logits_ms, ctx in rows:
            if shape != name: continue
            kv_bytes = a.batch * ctx * 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2
            floor_ms = (weight_bytes + kv_bytes) / bw * 1e3
            gpu_ms = replay_ms + logits_ms  # the model's GPU time: the graph (layers) and the LM head (outside it)
            row = dict(context=ctx, shape=name, mode=mode, step_ms=med(steps), phases_ms={k: med(v) for k, v in t.items()}, cpu_probe_ms=probe, graph_replay_ms=replay_ms,
                       logits_ms=logits_ms, gpu_ms=gpu_ms, floor_ms=floor_ms, weight_GB=weight_bytes / 1e9, kv_GB=kv_bytes / 1e9,
                       gpu_over_floor=gpu_ms / floor_ms, step_over_floor=med(steps) / floor_ms, host_share=1 - gpu_ms / med(steps),
                       sampler_gpu_ms=sampler_ms,
                       host_share_with_sampler_on_gpu=None if sampler_ms is None else 1 - (gpu_ms + sampler_ms) / med(steps))
            print(json.dumps(row), flush=True)
            res['shapes'].append(row)
        eng.shutdown(); del eng, r, saved, patches, gr, t; gc.collect(); torch.cuda.empty_cache()  # (patched methods made cycles)
    if a.out: Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == '__main__':
    main()
