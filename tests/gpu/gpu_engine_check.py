"""The engine on a GPU: the profiled KV pool, CUDA-graph decode against eager, and a workload through both.

    python tests/gpu/gpu_engine_check.py [--assets DIR] [--out FILE]   # default: ./gpu_engine_check.json

No weights can be downloaded on the GPU machine and the default model is too large to carry there, so the model is
SmolLM2-135M-shaped with random weights (its config and tokenizer are carried); what is checked is the engine's GPU
path, not the model's answers:
1. graphs against eager on the same decode step: a batch of 13 sequences of mixed lengths (so the graph of 16 runs
   with 3 padding rows), logits compared (its first version compared final hidden states), ||graph - eager|| / ||eager||, and the K/V the step wrote;
2. per-step time of a decode step, eager and replayed, at batch 1, 16, 64, 256 (contexts ~512 tokens);
3. a 256-request workload (random lengths, sampled with per-request seeds) through `LLMEngine` with and without
   graphs: output tokens/s, steps, every block free at the end.
Greedy parity against Hugging Face (with and without graphs) is `tests/gpu/gpu_parity.py`.
"""
import argparse, json, shutil, statistics, tempfile, time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from paged_infer.ops.attention import build_metadata
from paged_infer.cache.block_manager import BlockManager
from paged_infer.core.engine import LLMEngine
from paged_infer.model.default_model import prepare_default_model
from paged_infer.worker.cuda_graphs import graph_batch_sizes
from paged_infer.worker.model_runner import ModelRunner, load_model
from paged_infer.core.sampling_params import SamplingParams
from paged_infer.core.sequence import Sequence

ap = argparse.ArgumentParser(description='The engine on a GPU: profiled pool, CUDA-graph decode against eager, a workload.')
ap.add_argument('--assets', default=None, help='a folder with the config.json and tokenizer of the SmolLM2-135M shape to use (default: the default model\'s, converted under ~/.cache/paged-infer on first use)')
ap.add_argument('--out', default='gpu_engine_check.json', help='JSON file (default: ./gpu_engine_check.json)')
a = ap.parse_args()
a.assets = a.assets or str(prepare_default_model())
Path(a.out).resolve().parent.mkdir(parents=True, exist_ok=True)
assert torch.cuda.is_available()
folder = Path(tempfile.mkdtemp()) / 'smollm2-random'
cfg = AutoConfig.from_pretrained(a.assets)
torch.manual_seed(0)
hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
hf.save_pretrained(folder)
for f in Path(a.assets).glob('*'):
    if f.name.startswith('tokenizer') or f.suffix == '.jinja': shutil.copy(f, folder / f.name)
del hf
res = dict(device=torch.cuda.get_device_name(), torch=torch.__version__)
g = torch.Generator().manual_seed(0)

# 1. one decode step, graph against eager
model, tok = load_model(str(folder), device='cuda')
runner = ModelRunner(model, num_blocks=4096, block_size=16)
runner.capture_decode_graphs(graph_batch_sizes(64), max_model_len=2048)
bm = BlockManager(4096, 16)
lens = torch.randint(5, 900, (13,), generator=g).tolist()
seqs = [Sequence(torch.randint(100, 40000, (L,), generator=g).tolist(), SamplingParams(temperature=0, max_tokens=4)) for L in lens]
for s in seqs: bm.allocate(s.seq_id, s.token_ids())
runner.execute(seqs, [s.num_tokens for s in seqs], [bm.block_table(s.seq_id) for s in seqs])  # prefill, eager
for s in seqs:
    s.num_computed_tokens = s.num_tokens; s.append_token(7); bm.append_slots(s.seq_id, 1)
tables = [bm.block_table(s.seq_id) for s in seqs]
with torch.inference_mode():
    meta = build_metadata(tables, [s.num_computed_tokens for s in seqs], [1] * 13, 16, 'cuda')
    ids = torch.full((13,), 7, device='cuda'); pos = torch.tensor([s.num_computed_tokens for s in seqs], device='cuda')
    eager = model.compute_logits(model(ids, pos, runner.kv_layers, meta))
    slots = meta.slot_mapping
    kv_eager = runner.kv_cache.view(runner.kv_cache.shape[0], 2, -1, *runner.kv_cache.shape[4:])[:, :, slots].clone()
    runner.kv_cache.view(runner.kv_cache.shape[0], 2, -1, *runner.kv_cache.shape[4:])[:, :, slots] = float('nan')  # the graph must rewrite them
    host, _ = runner.host_batch(seqs, [1] * 13, tables)
    graph = runner._decode_with_graph(host)  # the logits of the 13 rows
    kv_graph = runner.kv_cache.view(runner.kv_cache.shape[0], 2, -1, *runner.kv_cache.shape[4:])[:, :, slots]
rel = lambda x, y: float((x.float() - y.float()).norm() / y.float().norm())
res['graph_vs_eager'] = dict(batch=13, graph_size=16, rel_err_logits=rel(graph, eager), rel_err_kv_written=rel(kv_graph, kv_eager),
                             kv_all_written=bool(not kv_graph.isnan().any()))
print(json.dumps(res['graph_vs_eager']))  # not bitwise: the graph's matrix products run 16 rows, eager's 13 (other kernels)
assert res['graph_vs_eager']['rel_err_logits'] < 2e-2 and res['graph_vs_eager']['rel_err_kv_written'] < 2e-2 and res['graph_vs_eager']['kv_all_written']

# 2. decode step time, eager and graph
def step_time(n, use_graph, reps=30):
    rr = runner if use_graph else ModelRunner.__new__(ModelRunner)
    if not use_graph: rr.__dict__.update(runner.__dict__); rr.graphs = None
    b = BlockManager(4096, 16)
    ss = [Sequence(torch.randint(100, 40000, (500,), generator=g).tolist(), SamplingParams(temperature=0, max_tokens=10**6, ignore_eos=True)) for _ in range(n)]
    for s in ss: b.allocate(s.seq_id, s.token_ids()); s.num_computed_tokens = s.num_tokens - 1  # pretend the prompt is cached
    times = []
    for i in range(reps + 3):
        torch.cuda.synchronize(); t0 = time.perf_counter()
        out_seqs, out = rr.execute(ss, [1] * n, [b.block_table(s.seq_id) for s in ss])
        times.append(time.perf_counter() - t0)  # execute ends waiting for the sampled tokens
        for s, t in zip(out_seqs, out.token_ids.tolist()): s.num_computed_tokens = s.num_tokens; s.append_token(t); b.append_slots(s.seq_id, 1)
    return statistics.median(times[3:]) * 1e6
res['decode_step_us'] = [dict(batch=n, eager_us=step_time(n, False), graph_us=step_time(n, True)) for n in (1, 16, 64)]
print(json.dumps(res['decode_step_us']))
del runner, model; torch.cuda.empty_cache()

# 3. the engine, with and without graphs
work = []
for i in range(256):
    L = int(torch.randint(16, 512, (1,), generator=g))
    work.append((torch.randint(100, 40000, (L,), generator=g).tolist(), int(torch.randint(16, 256, (1,), generator=g))))
for eager in (True, False):
    t0 = time.perf_counter()
    eng = LLMEngine(model=str(folder), device='cuda', max_num_batched_tokens=4096, enforce_eager=eager)
    t_start = time.perf_counter() - t0
    for i, (p, m) in enumerate(work): eng.add_request(p, SamplingParams(temperature=0.8, seed=i, max_tokens=m, ignore_eos=True))
    steps, out_tokens, t0 = 0, 0, time.perf_counter()
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished: out_tokens += len(o.outputs[0].token_ids)
        steps += 1
    dt = time.perf_counter() - t0
    eng.block_manager.check_invariants()
    row = dict(enforce_eager=eager, start_s=t_start, num_gpu_blocks=eng.num_gpu_blocks, requests=len(work), steps=steps,
               output_tokens=out_tokens, seconds=dt, output_tok_s=out_tokens / dt, blocks_free_at_end=eng.block_manager.num_free_blocks,
               graphs=sorted(eng.runner.graphs.graphs) if eng.runner.graphs else None)
    assert row['blocks_free_at_end'] == eng.num_gpu_blocks and out_tokens == sum(m for _, m in work)
    print(json.dumps(row)); res.setdefault('engine', []).append(row)
    del eng; torch.cuda.empty_cache()
print(json.dumps(res, indent=1))
if a.out: Path(a.out).write_text(json.dumps(res, indent=1))
