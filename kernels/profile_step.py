"""Where a decode step's time goes, on a GPU: host phases timed with perf_counter, the graph replay with CUDA events.

    PYTHONPATH=. python kernels/profile_step.py --assets .gpu_assets/tokenizer --shapes qwen2.5-0.5b,llama-3.1-8b \
        --batch 256 --context 512 --out $OUT/profile_step.json

A random-weight model of each shape; `batch` requests of `context` random prompt tokens are prefilled, then the
engine runs decode steps (CUDA graphs on) and each phase of a step is timed: scheduling, building the flat batch
and replaying the graph (`execute` up to the logits), the logits, building the sampling batch, the sampler, the copy
of the tokens to the host, and the engine's postprocessing (bookkeeping, detokenization, outputs). Separately, the
graph of the batch is replayed back to back with CUDA events around it: the GPU's own time for the model, against
the memory-bandwidth floor (weight bytes + KV bytes read, over the copy bandwidth measured in the same run).
"""
import argparse, json, shutil, statistics, tempfile, time
from collections import defaultdict
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from gpu_parity import SHAPES
from paged_infer import model_runner as mr
from paged_infer.engine import LLMEngine
from paged_infer.sampling_params import SamplingParams


def copy_bandwidth() -> float:
    x = torch.empty(2**30, dtype=torch.uint8, device='cuda'); y = torch.empty_like(x)
    for _ in range(3): y.copy_(x)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(20): y.copy_(x)
    e.record(); torch.cuda.synchronize()
    return 2 * 2**30 * 20 / (s.elapsed_time(e) / 1e3)  # bytes read + written per second


def timed(table, key, fn):
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try: return fn(*a, **k)
        finally: table[key].append(time.perf_counter() - t0)
    return wrapper


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--assets', default='.gpu_assets/tokenizer')
    ap.add_argument('--shapes', default='qwen2.5-0.5b,llama-3.1-8b')
    ap.add_argument('--batch', type=int, default=256)
    ap.add_argument('--context', type=int, default=512)
    ap.add_argument('--steps', type=int, default=40)
    ap.add_argument('--out', default=None)
    a = ap.parse_args()
    bw = copy_bandwidth()
    res = dict(device=torch.cuda.get_device_name(), copy_TBps=bw / 1e12, batch=a.batch, context=a.context, shapes=[])
    for name in a.shapes.split(','):
        cfg = SHAPES[name](); cfg.max_position_embeddings = 4096
        torch.manual_seed(0)
        with torch.device('cuda'): hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        folder = Path(tempfile.mkdtemp()) / name
        hf.save_pretrained(folder); del hf; torch.cuda.empty_cache()
        for f in Path(a.assets).glob('tokenizer*'): shutil.copy(f, folder / f.name)
        eng = LLMEngine(model=str(folder), device='cuda', max_num_seqs=a.batch, max_num_batched_tokens=8192)
        g = torch.Generator().manual_seed(0)
        for i in range(a.batch):
            eng.add_request(torch.randint(0, cfg.vocab_size, (a.context,), generator=g).tolist(),
                            SamplingParams(temperature=0.8, seed=i, max_tokens=4096 - a.context - 8, ignore_eos=True))
        while eng.scheduler.waiting or any(s.num_output_tokens == 0 for gr in eng.scheduler.running for s in gr.seqs): eng.step()
        t = defaultdict(list)
        r = eng.runner
        patches = [(eng.scheduler, 'schedule'), (r, '_decode_with_graph'), (r.model, 'compute_logits'), (r, 'sampler'), (eng, '_postprocess')]
        saved = [(o, k, getattr(o, k)) for o, k in patches]
        for o, k, f in saved: setattr(o, k, timed(t, k, f))
        saved_from, saved_host = mr.SamplingBatch.from_params, mr.to_host
        mr.SamplingBatch.from_params = timed(t, 'sampling_batch', saved_from)
        mr.to_host = timed(t, 'to_host', saved_host)
        steps = []
        for _ in range(a.steps):
            t0 = time.perf_counter(); eng.step(); steps.append(time.perf_counter() - t0)
        for o, k, f in saved: setattr(o, k, f)
        mr.SamplingBatch.from_params, mr.to_host = saved_from, saved_host
        # the graph alone, replayed back to back
        bs = next(b for b in r.graphs.sizes if b >= a.batch)
        gr = r.graphs.graphs[bs]
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(); s.record()
        for _ in range(20): gr.replay()
        e.record(); torch.cuda.synchronize()
        replay_ms = s.elapsed_time(e) / 20
        h = torch.randn(a.batch, cfg.hidden_size, device='cuda', dtype=torch.bfloat16)
        with torch.inference_mode():
            r.model.compute_logits(h); torch.cuda.synchronize(); s.record()
            for _ in range(20): r.model.compute_logits(h)
            e.record(); torch.cuda.synchronize()
        logits_ms = s.elapsed_time(e) / 20
        ctx = a.context + a.steps  # about the context during the timed steps
        weight_bytes = sum(p.numel() * p.element_size() for n, p in r.model.named_parameters() if 'embed_tokens' not in n or cfg.tie_word_embeddings)
        kv_bytes = a.batch * ctx * 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 2
        floor_ms = (weight_bytes + kv_bytes) / bw * 1e3
        med = lambda xs: statistics.median(xs) * 1e3 if xs else 0.0
        phases = {k: med(v) for k, v in t.items()}
        gpu_ms = replay_ms + logits_ms  # the model's GPU time: the graph (layers) and the LM head (outside it)
        row = dict(shape=name, step_ms=med(steps), phases_ms=phases, graph_replay_ms=replay_ms, logits_ms=logits_ms,
                   gpu_ms=gpu_ms, floor_ms=floor_ms, weight_GB=weight_bytes / 1e9, kv_GB=kv_bytes / 1e9,
                   gpu_over_floor=gpu_ms / floor_ms, step_over_floor=med(steps) / floor_ms,
                   host_share=1 - gpu_ms / med(steps))
        print(json.dumps(row), flush=True)
        res['shapes'].append(row)
        eng.shutdown(); del eng, r, saved, patches, gr, t; torch.cuda.empty_cache(); shutil.rmtree(folder.parent)
    if a.out: Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == '__main__':
    main()
