"""The engine on a GPU: KV pool sized by profiling, a workload through continuous batching, every block back.

    PYTHONPATH=. python kernels/gpu_engine_check.py --assets .gpu_assets/tokenizer

No weights can be downloaded on the GPU machine and the default model is too large to carry there, so the model is
SmolLM2-135M-shaped with random weights (its config and tokenizer are carried); what is checked is the engine's GPU
path, not the model's answers: the profile step, the pool size, bf16, and that a workload larger than one batch
completes with every block freed. Greedy parity with Hugging Face in bf16 is the kernels issue's check.
"""
import argparse, json, shutil, sys, tempfile, time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from paged_infer.engine import LLMEngine
from paged_infer.sampling_params import SamplingParams

ap = argparse.ArgumentParser()
ap.add_argument('--assets', default='.gpu_assets/tokenizer')
ap.add_argument('--out', default=None)
a = ap.parse_args()
assert torch.cuda.is_available()
folder = Path(tempfile.mkdtemp()) / 'smollm2-random'
cfg = AutoConfig.from_pretrained(a.assets)
torch.manual_seed(0)
hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
hf.save_pretrained(folder)
for f in Path(a.assets).glob('*'):
    if f.name.startswith('tokenizer') or f.suffix == '.jinja': shutil.copy(f, folder / f.name)
del hf

t0 = time.perf_counter()
eng = LLMEngine(model=str(folder), device='cuda', max_num_batched_tokens=4096)
t_start = time.perf_counter() - t0
free, total = torch.cuda.mem_get_info()
res = dict(device=torch.cuda.get_device_name(), dtype=str(next(eng.model.parameters()).dtype), num_gpu_blocks=eng.num_gpu_blocks,
           kv_pool_gib=eng.runner.kv_cache.numel() * eng.runner.kv_cache.element_size() / 2**30,
           max_concurrent_full_length=eng.max_concurrent_full_length, max_model_len=eng.max_model_len,
           gpu_total_gib=total / 2**30, gpu_free_after_start_gib=free / 2**30, start_s=t_start)
g = torch.Generator().manual_seed(0)
n, t0 = 256, time.perf_counter()
for i in range(n):
    L = int(torch.randint(16, 512, (1,), generator=g))
    eng.add_request(torch.randint(100, 40000, (L,), generator=g).tolist(),
                    SamplingParams(temperature=0.8, seed=i, max_tokens=int(torch.randint(16, 256, (1,), generator=g)), ignore_eos=True))
steps, out_tokens = 0, 0
while eng.has_unfinished_requests():
    for o in eng.step():
        if o.finished: out_tokens += len(o.outputs[0].token_ids)
    steps += 1
torch.cuda.synchronize()
dt = time.perf_counter() - t0
eng.block_manager.check_invariants()
res.update(requests=n, steps=steps, output_tokens=out_tokens, seconds=dt, output_tok_s=out_tokens / dt,
           blocks_free_at_end=eng.block_manager.num_free_blocks, preemptions=eng.scheduler.num_preemptions,
           note='engine on CUDA through the Triton kernels of chapter 15 (load_model picks them on CUDA); no CUDA graphs yet; a functional check, not a benchmark')
assert res['blocks_free_at_end'] == eng.num_gpu_blocks
print(json.dumps(res, indent=1))
if a.out: Path(a.out).write_text(json.dumps(res, indent=1))
